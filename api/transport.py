"""How requests come off the wire: corrections to quart-trio's and hypercorn's defaults, all about bounding what a
slow, oversized, vanished or unknown client can cost (issues 7, "Hostile and broken input", and 39).

They replace private parts of quart-trio (its ASGI connection's message loop, Quart's request body) and of
hypercorn (its TCP server's idle timer, its HTTP/2 connection), so those libraries are bounded in pyproject.toml
to the versions the tests pass with, and `api/dependencies.py` refuses others at start. Both of quart-trio's
lines are served: 0.12 (Quart 0.22, Python 3.11+) and 0.13 (Quart 0.23, Python 3.13+), whose body is a queue fed
by an awaited `put` where 0.12's was a buffer fed by `append`. Neither line's own body or message loop is used
here, so both lines run the same code; quart-trio 0.13 still cancels the handler on every `http.disconnect` and
still answers an over-long body before reading it (holding all of a chunked one in memory first), so each
correction is still needed there (tests/test_transport.py, tests/test_hostile_input.py,
tests/test_abuse_front_door.py).

1. `HTTPConnection`: hypercorn reports the end of every request stream to the app as `http.disconnect`, from
   inside the app's own last `send` of the response. quart-trio cancels the handler on `http.disconnect`, so
   the cancellation lands in hypercorn's bookkeeping that follows the response: the keep-alive timer is not
   restarted (an idle connection then stays open forever, and so does one whose next request's headers trickle
   in, which is slowloris), and a connection that must close (answered before its request body ended) is
   neither closed nor recycled. Here a disconnect cancels the handler only while it is still working, which is
   what the cancellation is for. Its message loop takes the body only once the app wants it (the caller
   authenticated, its grants checked); a request answered before its body's end says `Connection: close`, and
   what hypercorn still queues for it is drained (`drain_unread`) so that hypercorn can end it.
2. `Request` with `LingeringBody`: the body, counted as it arrives whatever its headers say. Over HTTP/1 a body
   over MAX_CONTENT_LENGTH is still read to its end (up to LINGER_BYTES more), its bytes dropped, before the 413
   goes out: HTTP/1 clients send the whole body before they read the answer, and a server that answers and
   closes early leaves them a connection reset instead of the 413. BODY_TIMEOUT bounds how long that takes.
   Over HTTP/2 the 413 goes at once.
3. `TCPServer` with `KeepAliveTimer` (api/connections.py): with (1), hypercorn re-arms its keep-alive timeout
   after every response by starting a new task, and cancels it when the next request arrives: a lock, a
   `nursery.start` handshake and a cancellation per request, a sixth of a bare request's CPU (loadtest/README.md,
   "Keep-alive timer"). Here one task per connection sleeps until a deadline that each response and request moves,
   which costs next to nothing.
   Each connection is admitted by `ConnectionLimit` (past the maximum an idle one makes room, an address
   holding more than half of them giving up its own first), hypercorn sets it up only once its first bytes
   arrive (the kernel holds a silent one, `ServerConfig`), and an error in one connection ends that connection,
   not the server.
4. `H2Protocol`: an HTTP/2 stream answered before its request's end is reset once the answer is complete, and
   the frames the client sent on it meanwhile are dropped (hypercorn's own raised KeyError out of the server).
"""

from __future__ import annotations

import logging
import socket

import h2.errors
import h2.events
import h2.exceptions
import hypercorn.config
import hypercorn.protocol
import hypercorn.protocol.h2
import hypercorn.trio.run
import hypercorn.trio.tcp_server
import trio
from quart_trio.asgi import TrioASGIHTTPConnection
from quart_trio.wrappers.request import TrioRequest
from werkzeug.exceptions import RequestEntityTooLarge

from .connections import ConnectionLimit, KeepAliveTimer

__all__ = ["ConnectionLimit", "HTTPConnection", "Request", "ServerConfig", "drain_unread", "use_transport"]

log = logging.getLogger(__name__)


class HTTPConnection(TrioASGIHTTPConnection):
    _sending = False
    _body: LingeringBody | None = None

    def _create_request_from_scope(self, send):  # type: ignore[no-untyped-def]
        request = super()._create_request_from_scope(send)
        self._body = request.body
        return request

    async def __call__(self, receive, send) -> None:  # type: ignore[override]
        await super().__call__(receive, send)
        if self._body is not None and not self._body.finished:
            drain_unread(receive)

    async def handle_messages(self, nursery, request, receive) -> None:  # type: ignore[override]
        """quart-trio's message loop, feeding `LingeringBody` once the app wants the body; a disconnect cancels the
        handler only if it is not yet sending its response (when it is, it cancels the nursery itself once that
        is done)."""
        body = request.body
        await body.wanted.wait()
        while True:
            message = await receive()
            if message["type"] == "http.request":
                body.receive(message.get("body", b""))
                if not message.get("more_body", False):
                    body.complete()
            elif message["type"] == "http.disconnect":
                body.disconnected()
                if not self._sending:
                    nursery.cancel_scope.cancel()
                return

    async def _send_response(self, send, response) -> None:
        self._sending = True
        if self._body is not None:
            if self._body.announced and not self._body.finished:
                # Answered before the body's end (refused before it was read): the connection closes after the
                # answer, which says so, or the client could send its next request on it as it closes.
                response.headers["Connection"] = "close"
            self._body.answered()
        await super()._send_response(send, response)


def drain_unread(receive) -> None:
    """Take, and drop, what hypercorn still queues for a request answered before its body ended, until it ends the
    request. hypercorn ends it (and then closes the connection, whose body is unread) by queueing one more message
    for the app, after the app has returned: with its queue full of body the app never took, that would wait
    forever, and so would the connection. (A task of trio's own, which no request's nursery has to wait for.)"""
    async def drain() -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # noqa: BLE001 - a system task's error would end the whole run; the connection is going
            pass
    trio.lowlevel.spawn_system_task(drain, name="drain an unread request body")


LINGER_BYTES = 64 * 1024 * 1024


class LingeringBody:
    """A request body as Quart's `Request.body` is one (awaited whole, or iterated in chunks as they arrive, by the
    form parser), except that:

    - nothing of it is received until someone wants it (`want`, or reading it): the caller is authenticated, and
      grants that need only the path are checked, before any of it is read. Until then hypercorn holds back what
      arrives (its queue of messages for the app is short), and so the client's sending waits;
    - once the answer goes out (`answered`), what is still to come is dropped as it arrives;
    - going over the limit drops the data. Over HTTP/1 (`lingers`), whose clients send the whole body before they
      read an answer, the 413 then waits for the end of the body (a 413 sent while they still send reaches them
      as a connection reset), for at most LINGER_BYTES more; over HTTP/2, whose clients read as they send, it
      goes at once, and the stream is reset (`H2Protocol`)."""

    def __init__(self, expected_content_length: int | None, max_content_length: int | None) -> None:
        self._limit = max_content_length
        self._data: bytes | bytearray = bytearray()   # received and not yet taken by an iterating reader
        self._received = 0
        self._arrived = trio.Event()   # more data or the end, since an iterating reader last looked
        self._ended = trio.Event()
        self.wanted = trio.Event()     # the message loop receives the body from here on
        # Set by `Request`: HTTP/1 (else HTTP/2 or 3), and an HTTP/1 request that announces a body.
        self.lingers = True
        self.announced = False
        self._dropping = False
        self._disconnected = False
        # A Content-Length over the limit is known at once; the refusal waits for the body's end all the same.
        over = expected_content_length is not None and self._limit is not None and expected_content_length > self._limit
        self._refusal: Exception | None = RequestEntityTooLarge() if over else None

    def want(self) -> None:
        self.wanted.set()

    def answered(self) -> None:
        """The answer is going out: nothing more of the body is kept (the message loop goes on taking it, so that
        hypercorn's queue cannot fill before the request ends)."""
        self._dropping = True
        self._data = bytearray()

    @property
    def finished(self) -> bool:
        """Whether the message loop saw the end of the request (its body's, or the client leaving)."""
        return self._ended.is_set() or self._disconnected

    def disconnected(self) -> None:
        self._disconnected = True

    def receive(self, data: bytes) -> None:
        if self._dropping:
            return
        self._received += len(data)
        if self._refusal is None and self._limit is not None and self._received > self._limit:
            self._refusal = RequestEntityTooLarge()
            self._data = bytearray()
        if self._refusal is None:
            self._data += data
        elif not self.lingers or self._received > self._limit + LINGER_BYTES:   # waiting no longer: refuse now
            self._ended.set()
        self._arrived.set()

    def complete(self) -> None:
        self._data = bytes(self._data)   # so that each `await body` returns it without a copy
        self._ended.set()
        self._arrived.set()

    def __await__(self):
        return self._whole().__await__()

    async def _whole(self) -> bytes:
        self.want()
        if not self._refused_at_once():
            await self._ended.wait()
        if self._refusal is not None:
            raise self._refusal
        return bytes(self._data)

    def _refused_at_once(self) -> bool:
        return self._refusal is not None and not self.lingers

    def __aiter__(self) -> LingeringBody:
        return self

    async def __anext__(self) -> bytes:
        self.want()
        while not self._data and not self._ended.is_set() and not self._refused_at_once():
            await self._arrived.wait()
            self._arrived = trio.Event()
        if self._refusal is not None:
            raise self._refusal
        if not self._data:
            raise StopAsyncIteration
        chunk, self._data = bytes(self._data), b""
        return chunk

    def clear(self) -> None:
        """`get_data(cache=False)`: the body is not kept once read."""
        self._data = b""


class Request(TrioRequest):
    body_class = LingeringBody  # type: ignore[assignment]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.body.lingers = self.http_version in ("1.0", "1.1")
        self.body.announced = self.body.lingers and bool(self.content_length or "Transfer-Encoding" in self.headers)


class ServerConfig(hypercorn.config.Config):
    """hypercorn's configuration, the limit the connections it accepts are admitted by (None: no limit), and how
    long the kernel keeps a new TCP connection that has sent nothing to itself (0: not at all).

    Deferred (Linux's TCP_DEFER_ACCEPT, as nginx's `listen ... deferred`), a connection is handed to the service
    only once its first bytes arrive, which an HTTP client sends at once; one that sends nothing costs the kernel
    a little memory, and the service nothing: no descriptor, no task, and nothing to close at the connection
    maximum, which a flood's client would only open again at once. The kernel hands it over after about
    `defer_accept_s` (rounded up to its retries of the handshake: 1, 3, 7, 15, 31 s), or drops it without a word
    past its last retry (~63 s); handed over, it is closed at the service's own header deadline."""

    connections: ConnectionLimit | None = None
    defer_accept_s: int = 0

    def create_sockets(self) -> hypercorn.config.Sockets:
        sockets = super().create_sockets()
        if self.defer_accept_s and hasattr(socket, "TCP_DEFER_ACCEPT"):   # (Linux only; elsewhere not deferred)
            for sock in (*sockets.secure_sockets, *sockets.insecure_sockets):
                if sock.family in (socket.AF_INET, socket.AF_INET6):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, self.defer_accept_s)
        return sockets


class TCPServer(hypercorn.trio.tcp_server.TCPServer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.idle_task = KeepAliveTimer(self)

    async def run(self) -> None:
        limit = self.idle_task.limit
        if limit is not None and not limit.admit(self.idle_task):
            await self.stream.aclose()
            return
        try:
            if limit is None or not isinstance(self.stream, trio.SocketStream) or \
                    await self.idle_task.first_bytes(self.stream):
                await super().run()
            else:
                await self.stream.aclose()
        except Exception:  # noqa: BLE001 - one connection's failure (in hypercorn) ends it, not the whole server
            log.exception("a connection ended with an error")
        finally:
            if limit is not None:
                limit.leave(self.idle_task)
            # The timer and the server refer to each other: parted, the connection's objects go when it ends, not
            # at the cyclic collector's next pass (whose passes, under a flood of connections, took ~40 ms each).
            self.idle_task.server = None

    async def _read_data(self) -> None:
        try:
            await super()._read_data()
        finally:
            self.idle_task.close()


class H2Protocol(hypercorn.protocol.h2.H2Protocol):
    """hypercorn's HTTP/2 connection, with two corrections for a stream answered before its request ended (a 401
    before its body was read, a 413 at the limit):

    - once its answer is complete, the stream is reset (RFC 9113 8.1: NO_ERROR), so that the client stops sending
      a body no one reads;
    - what the client sent on it before it learnt that is dropped. hypercorn looks each frame's stream up among
      those still open; not finding it, it raised KeyError out of the connection, and so out of the server."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.streams = _OpenStreams()
        self._requests_ended: set[int] = set()   # streams whose request the client has ended (or reset)

    async def _handle_events(self, events: list[h2.events.Event]) -> None:
        for event in events:
            if isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                self._requests_ended.add(event.stream_id)
        await super()._handle_events(events)

    async def _send_data(self, stream_id: int) -> None:
        await super()._send_data(stream_id)
        if stream_id in self.stream_buffers:
            return   # the answer goes on
        if stream_id in self._requests_ended:
            self._requests_ended.discard(stream_id)
            return
        try:   # answered before the request's end
            self.connection.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
        except h2.exceptions.ProtocolError:   # already closed
            return
        await self._flush()


class _OpenStreams(dict):
    """H2Protocol's streams by id: one no longer open is a stream that drops what it is sent."""

    def __missing__(self, stream_id: int) -> _ClosedStream:
        return _CLOSED_STREAM


class _ClosedStream:
    async def handle(self, event) -> None:
        pass


_CLOSED_STREAM = _ClosedStream()


def use_transport() -> None:
    """Make hypercorn's trio worker serve connections with `TCPServer` and `H2Protocol` above. hypercorn takes no
    class of either as a parameter; its worker and its protocol switch look the names up in their modules when
    they start a connection."""
    hypercorn.trio.run.TCPServer = TCPServer
    hypercorn.protocol.H2Protocol = H2Protocol
