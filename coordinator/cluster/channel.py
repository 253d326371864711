"""The internal channel between cluster members: persistent trio TCP connections carrying length-prefixed frames.

A frame is a 4-byte big-endian length and a msgpack message (`wire.py`: plain data, and the project's own types
named explicitly, so that no received byte can run code). A request is `[call_id, method, args]`; its answer is
`[call_id, ok, value]` where `value` is the result or the CoordinatorError to raise (lists, not tuples: a tuple
costs a type's head to encode and decode). One connection per peer carries any number of concurrent calls
(answers come back out of order), so a forwarded request costs one encoding, one send and one receive on each
side: no second HTTP hop, no connection set-up per request.

Nothing is decoded before both ends of a connection prove they hold the cluster key (`handshake`: a greeting,
then an HMAC challenge-response each way, keyed by the cluster's own secret, secret.py, which nothing in the
database reveals); still bind the channel to a private interface.

Versions, for rolling upgrades (docs/cluster.md): a member speaks its own channel version (VERSION) and the one
before (OLDEST), so members of consecutive releases serve together. The handshake is channel version 4's, which
every version since speaks first; then the dialer offers the range it speaks (`channel_versions`) and the
listener answers with its own, and the connection uses the highest version both speak. A listener of version 4
knows no such call and answers it with an error: the connection then stays on version 4. Members with no version
in common refuse each other with a message that says so. `cluster_channel_version` makes a member speak at most
an older version (for tests of an upgrade). A version whose encoding changes keeps the previous encoding for the
connections that agreed on it, one release long.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
from collections import Counter
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
# The greeting each end sends first: a magic and the handshake's version (channel version 4's handshake, kept so
# that members of version 4 and later all pass it). Raise VERSION whenever what crosses the channel changes (the
# message shapes, wire.py's encoding, the handlers' arguments), and keep speaking OLDEST for one release.
# Version 5: the versions offered after the handshake; the frames are version 4's.
MAGIC = b"CCH"
HANDSHAKE = 4   # 4: keyed by the cluster's own secret (3 derived it from the token signing key in the database)
GREETING = MAGIC + bytes([HANDSHAKE])
VERSION = 5
OLDEST = VERSION - 1
NEGOTIATE = "channel_versions"
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
        raise HandshakeFailed(f"the {who} speaks an older cluster channel (before version 2, with pickle): "
                              f"upgrade members one release at a time (docs/cluster.md)")
    if greeting[len(MAGIC)] != HANDSHAKE:
        raise HandshakeFailed(f"the {who} greets with cluster channel handshake {greeting[len(MAGIC)]}, this member "
                              f"with handshake {HANDSHAKE} (channel versions {OLDEST}-{VERSION}): upgrade members "
                              f"one release at a time (docs/cluster.md)")


def agree(ours: tuple[int, int], theirs: tuple[int, int]) -> int:
    """The highest channel version both ranges (oldest, newest) hold; HandshakeFailed if none."""
    version = min(ours[1], theirs[1])
    if version < max(ours[0], theirs[0]):
        raise HandshakeFailed(f"the other member speaks cluster channel versions {theirs[0]}-{theirs[1]}, this "
                              f"member {ours[0]}-{ours[1]}: upgrade members one release at a time "
                              f"(docs/cluster.md)")
    return version


def speaks(highest: int | None) -> tuple[int, int]:
    """The range of channel versions this member speaks, at most `highest` (cluster_channel_version)."""
    if highest is None:
        return OLDEST, VERSION
    if not OLDEST <= highest <= VERSION:
        raise ValueError(f"cluster_channel_version must be {OLDEST} or {VERSION}: a member speaks its own channel "
                         f"version and the one before, not {highest}")
    return OLDEST, highest


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

    def __init__(self, codec: Codec, handlers: dict[str, Callable[..., Awaitable[Any]]], key: bytes, *,
                 versions: tuple[int, int] = (OLDEST, VERSION)):
        self.codec = codec
        self.handlers = handlers
        self.key = key
        self.versions = versions    # the channel versions this member speaks (oldest, newest)
        self.agreed: Counter[int] = Counter()   # how many connections run on each channel version now
        self.calls = 0              # calls being answered now
        self._idle = trio.Event()   # set whenever `calls` falls to 0
        self._idle.set()

    async def drain(self, timeout_s: float) -> int:
        """Wait (at most `timeout_s`) until every call accepted so far has been answered; returns how many were
        still unanswered then."""
        with trio.move_on_after(timeout_s):
            await self._idle.wait()
        return self.calls

    async def serve(self, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await trio.serve_tcp(self._connection, port, host=host, task_status=task_status)

    async def _connection(self, stream: trio.SocketStream) -> None:
        lock = trio.Lock()
        version = None
        try:
            await accept_handshake(stream, self.key)
            frames = read_frames(stream)
            first = await anext(frames, None)
            if first is None:
                return
            call = self.codec.loads(first)
            version = HANDSHAKE   # a dialer of version 4 offers nothing: its first frame is a call
            if call[1] == NEGOTIATE:
                version, call = await self._negotiate(stream, lock, call[0], call[2]), None
            self.agreed[version] += 1
            async with trio.open_nursery() as nursery:
                if call is not None:
                    nursery.start_soon(self._answer, stream, lock, *call)
                try:
                    async for payload in frames:
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
            if version is not None and self.agreed[version]:
                self.agreed[version] -= 1
            await trio.aclose_forcefully(stream)

    async def _negotiate(self, stream, lock: trio.Lock, call_id: int, args: list) -> int:
        """The dialer's offer of the versions it speaks: answer with ours, then use the highest both speak (or
        refuse: the dialer reads the same answer and gives up)."""
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            await _send_frame(stream, lock, self.codec.frame([call_id, True, list(self.versions)]))
        agreed = agree(self.versions, (int(args[0]), int(args[1])))
        log.info("channel connection from %s on version %d", _remote(stream), agreed)
        return agreed

    async def _answer(self, stream, lock: trio.Lock, call_id: int, method: str, args: tuple) -> None:
        self.calls += 1
        self._idle = trio.Event() if self.calls == 1 else self._idle
        try:
            await self._answer_call(stream, lock, call_id, method, args)
        finally:
            self.calls -= 1
            if not self.calls:
                self._idle.set()

    async def _answer_call(self, stream, lock: trio.Lock, call_id: int, method: str, args: tuple) -> None:
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
                 connect_timeout_s: float = 1.0, versions: tuple[int, int] = (OLDEST, VERSION)):
        self.address = address
        self.key = key
        self.versions = versions        # the channel versions this member speaks (oldest, newest)
        self.version: int | None = None   # the one the current connection agreed on
        host, _, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.codec = codec
        self.nursery = nursery
        self.connect_timeout_s = connect_timeout_s
        self._stream: trio.SocketStream | None = None
        self._connecting = trio.Lock()
        self._send_lock = trio.Lock()
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)   # 0 is the versions' offer

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
                    version = await self._negotiate(stream)
                except (HandshakeFailed, trio.TooSlowError, trio.BrokenResourceError, OSError) as exc:
                    await trio.aclose_forcefully(stream)
                    raise PeerUnreachable(f"cluster member {self.address} failed the handshake: {exc}") from None
                if version != self.version:
                    log.info("channel connection to %s on version %d", self.address, version)
                self.version = version
                stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._stream = stream
                self.nursery.start_soon(self._read, stream)
            return self._stream

    @property
    def connected(self) -> bool:
        return self._stream is not None

    async def _negotiate(self, stream: trio.SocketStream) -> int:
        """Offer the versions this member speaks; the highest the listener speaks too. A listener of version 4
        answers the offer with an error (it knows no such call): the connection stays on version 4."""
        with trio.fail_after(HANDSHAKE_TIMEOUT_S):
            await stream.send_all(self.codec.frame([0, NEGOTIATE, list(self.versions)]))
            (size,) = HEADER.unpack(await _receive_exactly(stream, HEADER.size))
            if size > MAX_FRAME:
                raise HandshakeFailed(f"an answer of {size} bytes to the versions offered")
            try:
                _, ok, theirs = self.codec.loads(await _receive_exactly(stream, size))
            except (ValueError, TypeError) as exc:
                raise HandshakeFailed(f"an unreadable answer to the versions offered: {exc}") from None
        return agree(self.versions, (int(theirs[0]), int(theirs[1])) if ok else (HANDSHAKE, HANDSHAKE))

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
