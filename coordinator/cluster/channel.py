"""The internal channel between cluster members: persistent trio TCP connections carrying length-prefixed frames.

A frame is a 4-byte big-endian length and a msgpack message (`wire.py`: plain data, and the project's own types
named explicitly, so that no received byte can run code). A request is `[call_id, method, args]`; its answer is
`[call_id, ok, value]` where `value` is the result or the CoordinatorError to raise (lists, not tuples: a tuple
costs a type's head to encode and decode). One connection per peer carries any number of concurrent calls
(answers come back out of order), so a forwarded request costs one encoding, one send and one receive on each
side: no second HTTP hop, no connection set-up per request.

Nothing is decoded before both ends of a connection prove they hold the cluster key and speak the same channel
version (`handshake`: a versioned greeting, then an HMAC challenge-response each way, keyed by the cluster's own
secret, secret.py, which nothing in the database reveals); still bind the channel to a private interface. Members
of different versions refuse each other with a message that says so.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import secrets
import socket
from typing import Any, Awaitable, Callable

import trio

from ..errors import CoordinatorError, Unavailable, from_storage
from .wire import FRAME_HEADER as HEADER, Codec

log = logging.getLogger(__name__)

MAX_FRAME = 512 * 1024 * 1024
NONCE = 16
# The greeting each end sends first: a magic and the channel's version. Raise VERSION whenever what crosses the
# channel changes incompatibly (the message shapes, wire.py's encoding, the handlers' arguments).
MAGIC = b"CCH"
VERSION = 4   # 4: keyed by the cluster's own secret (3 derived it from the token signing key in the database)
GREETING = MAGIC + bytes([VERSION])
HANDSHAKE_TIMEOUT_S = 5.0


class HandshakeFailed(Exception):
    """The other end does not hold the cluster key (or spoke something else): no frame is exchanged."""


SAME_SECRET = ("every member needs the same cluster secret: the same --cluster-secret-file, or on one host the same "
               "--data-dir (its cluster.key)")


def _proof(key: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, GREETING + role + first + second, hashlib.sha256).digest()


async def _receive_exactly(stream: trio.abc.ReceiveStream, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        data = await stream.receive_some(n - len(buf))
        if not data:
            raise HandshakeFailed("connection closed during the handshake")
        buf += data
    return buf


def _check_greeting(greeting: bytes, who: str) -> None:
    if greeting[:len(MAGIC)] != MAGIC:
        raise HandshakeFailed(f"the {who} speaks an older cluster channel (before version 2, with pickle): run "
                              f"the same coordinator version on every member")
    if greeting[len(MAGIC)] != VERSION:
        raise HandshakeFailed(f"the {who} speaks cluster channel version {greeting[len(MAGIC)]}, this member "
                              f"version {VERSION}: run the same coordinator version on every member")


async def accept_handshake(stream: trio.abc.Stream, key: bytes) -> None:
    """Server side: greet and challenge the dialer, check its version and proof, prove ourselves in turn."""
    with trio.fail_after(HANDSHAKE_TIMEOUT_S):
        ours = secrets.token_bytes(NONCE)
        await stream.send_all(GREETING + ours)
        _check_greeting(await _receive_exactly(stream, len(GREETING)), "dialing member")
        reply = await _receive_exactly(stream, NONCE + 32)
        theirs, proof = reply[:NONCE], reply[NONCE:]
        if not hmac.compare_digest(proof, _proof(key, b"dialer", ours, theirs)):
            raise HandshakeFailed(f"the dialer does not hold the cluster key ({SAME_SECRET})")
        await stream.send_all(_proof(key, b"listener", theirs, ours))


async def dial_handshake(stream: trio.abc.Stream, key: bytes) -> None:
    """Client side: check the listener's version, answer its challenge and check that it holds the key too."""
    with trio.fail_after(HANDSHAKE_TIMEOUT_S):
        # An older listener sends only its 16-byte challenge: read that much before judging the greeting.
        first = await _receive_exactly(stream, NONCE)
        _check_greeting(first, "listening member")
        challenge = first[len(GREETING):] + await _receive_exactly(stream, len(GREETING))
        ours = secrets.token_bytes(NONCE)
        await stream.send_all(GREETING + ours + _proof(key, b"dialer", challenge, ours))
        proof = await _receive_exactly(stream, 32)
        if not hmac.compare_digest(proof, _proof(key, b"listener", ours, challenge)):
            raise HandshakeFailed(f"the listener does not hold the cluster key ({SAME_SECRET})")


class PeerUnreachable(Unavailable):
    """The request was never sent (no connection): known not applied."""


class AnswerLost(Exception):
    """The request was sent but the connection closed before its answer: the caller must find out the outcome."""


def _frame_size(buf: bytes | bytearray, start: int) -> int:
    (size,) = HEADER.unpack_from(buf, start)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes exceeds the limit")
    return size


async def read_frames(stream: trio.abc.ReceiveStream):
    """Yields each frame's payload; returns at a clean end of stream. A frame that arrives within one read (as
    nearly all do) is yielded as a view of what was read, never copied; only a frame split over reads is gathered
    (a payload is valid until the next is asked for)."""
    held = bytearray()   # the start of a frame split over reads
    while True:
        data = await stream.receive_some(1 << 16)
        if not data:
            return
        if held:
            held += data
            if len(held) < 4 or len(held) < 4 + _frame_size(held, 0):
                continue
            data, held = bytes(held), bytearray()
        view, start, end = memoryview(data), 0, len(data)
        while end - start >= 4:
            size = _frame_size(data, start)
            if end - start < 4 + size:
                break
            yield view[start + 4:start + 4 + size]
            start += 4 + size
        held += view[start:]


async def _send_frame(stream: trio.abc.SendStream, lock: trio.Lock, frame: bytes) -> None:
    """One whole frame on a stream that other tasks send on too. The lock is taken without a scheduling round trip
    when it is free, as it mostly is (`send_all` yields to the scheduler once anyway)."""
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()
    try:
        await stream.send_all(frame)
    finally:
        lock.release()


def _wire_error(exc: BaseException) -> CoordinatorError:
    """Errors cross as themselves when they are the coordinator's; anything else as a 500 naming it."""
    exc = from_storage(exc)
    if isinstance(exc, CoordinatorError):
        return exc
    return CoordinatorError(f"peer failed: {type(exc).__name__}: {exc}")


_PEER_GONE = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)   # a peer that went away: no fault


class ChannelServer:
    """Answers peers' calls with `handlers[method](*args)`; each call runs in its own task."""

    def __init__(self, codec: Codec, handlers: dict[str, Callable[..., Awaitable[Any]]], key: bytes):
        self.codec = codec
        self.handlers = handlers
        self.key = key

    async def serve(self, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await trio.serve_tcp(self._connection, port, host=host, task_status=task_status)

    async def _connection(self, stream: trio.SocketStream) -> None:
        lock = trio.Lock()
        try:
            await accept_handshake(stream, self.key)
            async with trio.open_nursery() as nursery:
                try:
                    async for payload in read_frames(stream):
                        call_id, method, args = self.codec.loads(payload)
                        nursery.start_soon(self._answer, stream, lock, call_id, method, args)
                except _PEER_GONE:   # caught here: out of the nursery it would come wrapped in an ExceptionGroup
                    nursery.cancel_scope.cancel()   # its calls' answers are lost, and it resolves them itself
        except _PEER_GONE:
            pass
        except (HandshakeFailed, trio.TooSlowError) as exc:
            log.warning("refused a channel connection from %s: %s", _remote(stream), exc)
        except Exception:  # a frame we cannot read: drop this connection, never the member
            log.exception("bad frame from a cluster peer; closing its connection")
        finally:
            await trio.aclose_forcefully(stream)

    async def _answer(self, stream, lock: trio.Lock, call_id: int, method: str, args: tuple) -> None:
        try:
            value, ok = await self.handlers[method](*args), True
        except trio.Cancelled:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            if not isinstance(from_storage(exc), CoordinatorError):
                log.exception("cluster call %s failed", method)
            value, ok = _wire_error(exc), False
        try:
            frame = self.codec.frame([call_id, ok, value])
        except Exception as exc:  # an unpicklable answer is a bug; say so instead of hanging the caller
            log.exception("cannot encode the answer to %s", method)
            frame = self.codec.frame([call_id, False, _wire_error(exc)])
        try:
            await _send_frame(stream, lock, frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass


def _remote(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername())
    except OSError:
        return "?"


class _Pending:
    __slots__ = ("event", "ok", "value")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.ok: bool | None = None
        self.value: Any = None


class Peer:
    """One member's persistent connection to another; (re)connected on demand."""

    def __init__(self, address: str, codec: Codec, nursery: trio.Nursery, key: bytes, *,
                 connect_timeout_s: float = 1.0):
        self.address = address
        self.key = key
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.codec = codec
        self.nursery = nursery
        self.connect_timeout_s = connect_timeout_s
        self._stream: trio.SocketStream | None = None
        self._connecting = trio.Lock()
        self._send_lock = trio.Lock()
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count()

    async def _connect(self) -> trio.SocketStream:
        if self._stream is not None:   # (the lock's two scheduling round trips only while there is none)
            return self._stream
        async with self._connecting:
            if self._stream is None:
                try:
                    with trio.fail_after(self.connect_timeout_s):
                        stream = await trio.open_tcp_stream(self.host, self.port)
                except (OSError, trio.TooSlowError) as exc:
                    raise PeerUnreachable(f"cluster member {self.address} is unreachable: {exc}") from None
                try:
                    await dial_handshake(stream, self.key)
                except (HandshakeFailed, trio.TooSlowError, trio.BrokenResourceError, OSError) as exc:
                    await trio.aclose_forcefully(stream)
                    raise PeerUnreachable(f"cluster member {self.address} failed the handshake: {exc}") from None
                stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._stream = stream
                self.nursery.start_soon(self._read, stream)
            return self._stream

    async def call(self, method: str, *args: Any, watch: Callable[[Any], Any] | None = None) -> Any:
        """Raises the peer's CoordinatorError, PeerUnreachable (not sent) or AnswerLost (sent, no answer).
        `watch(pending)` lets the caller abandon the call (`abandon(pending)`) when it knows no answer will come."""
        stream = await self._connect()
        call_id = next(self._ids)
        pending = _Pending()
        if watch is not None:
            watch(pending)
        frame = self.codec.frame([call_id, method, list(args)])
        self._pending[call_id] = pending
        try:
            try:
                await _send_frame(stream, self._send_lock, frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                self._broken(stream)
                raise AnswerLost(f"connection to {self.address} broke while sending") from None
            await pending.event.wait()
        finally:
            self._pending.pop(call_id, None)
        if pending.ok is None:
            raise AnswerLost(f"connection to {self.address} closed before the answer")
        if not pending.ok:
            raise pending.value
        return pending.value

    async def _read(self, stream: trio.SocketStream) -> None:
        try:
            async for payload in read_frames(stream):
                call_id, ok, value = self.codec.loads(payload)
                pending = self._pending.get(call_id)
                if pending is not None:
                    pending.ok, pending.value = ok, value
                    pending.event.set()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            log.info("connection to %s lost: %s", self.address, exc)
        except Exception:  # a frame we cannot read: its callers get AnswerLost and resolve from the store
            log.exception("bad frame from cluster member %s; closing the connection", self.address)
        finally:
            self._broken(stream)

    @staticmethod
    def abandon(pending: _Pending) -> None:
        pending.event.set()  # ok stays None: AnswerLost

    def _broken(self, stream: trio.SocketStream) -> None:
        if self._stream is stream:
            self._stream = None
            for pending in list(self._pending.values()):
                pending.event.set()  # ok stays None: the answer is lost
            self._pending.clear()
        self.nursery.start_soon(trio.aclose_forcefully, stream)
