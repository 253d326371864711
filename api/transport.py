"""How requests come off the wire: three corrections to quart-trio's and hypercorn's defaults, all about bounding
what a slow, oversized or vanished client can cost (issue 7, "Hostile and broken input").

They replace private parts of quart-trio (its ASGI connection's message loop, Quart's request body) and of
hypercorn (its connection's idle timer), so those libraries are bounded in pyproject.toml to the versions the
tests pass with, and `api/dependencies.py` refuses others at start. Both of quart-trio's lines are served: 0.12
(Quart 0.22, Python 3.11+) and 0.13 (Quart 0.23, Python 3.13+), whose body is a queue fed by an awaited `put`
where 0.12's was a buffer fed by `append`. Neither line's own body or message loop is used here, so both lines
run the same code; quart-trio 0.13 still cancels the handler on every `http.disconnect` and still answers an
over-long body before reading it (holding all of a chunked one in memory first), so each correction is still
needed there (tests/test_transport.py, tests/test_hostile_input.py).

1. `HTTPConnection`: hypercorn reports the end of every request stream to the app as `http.disconnect`, from
   inside the app's own last `send` of the response. quart-trio cancels the handler on `http.disconnect`, so
   the cancellation lands in hypercorn's bookkeeping that follows the response: the keep-alive timer is not
   restarted (an idle connection then stays open forever, and so does one whose next request's headers trickle
   in, which is slowloris), and a connection that must close (answered before its request body ended) is
   neither closed nor recycled. Here a disconnect cancels the handler only while it is still working, which is
   what the cancellation is for.
2. `Request` with `LingeringBody`: a body over MAX_CONTENT_LENGTH is still read to its end, its bytes dropped,
   before the 413 goes out. HTTP clients send the whole body before they read the answer; a server that answers
   and closes early leaves them a connection reset instead of the 413. BODY_TIMEOUT bounds how long that takes.
3. `TCPServer` with `KeepAliveTimer`: with (1), hypercorn re-arms its keep-alive timeout after every response by
   starting a new task, and cancels it when the next request arrives: a lock, a `nursery.start` handshake and a
   cancellation per request, a sixth of a bare request's CPU (loadtest/README.md, "Keep-alive timer"). Here one
   task per connection sleeps until a deadline that each response and request moves, which costs next to nothing.
"""

from __future__ import annotations

import math

import hypercorn.trio.run
import hypercorn.trio.tcp_server
import trio
from quart_trio.asgi import TrioASGIHTTPConnection
from quart_trio.wrappers.request import TrioRequest
from werkzeug.exceptions import RequestEntityTooLarge


class HTTPConnection(TrioASGIHTTPConnection):
    _sending = False

    async def handle_messages(self, nursery, request, receive) -> None:  # type: ignore[override]
        """quart-trio's message loop, feeding `LingeringBody`; a disconnect cancels the handler only if it is not
        yet sending its response (when it is, it cancels the nursery itself once that is done)."""
        while True:
            message = await receive()
            if message["type"] == "http.request":
                request.body.receive(message.get("body", b""))
                if not message.get("more_body", False):
                    request.body.complete()
            elif message["type"] == "http.disconnect":
                if not self._sending:
                    nursery.cancel_scope.cancel()
                return

    async def _send_response(self, send, response) -> None:
        self._sending = True
        await super()._send_response(send, response)


class LingeringBody:
    """A request body as Quart's `Request.body` is one (awaited whole, or iterated in chunks as they arrive, by the
    form parser), except that going over the limit drops the data and waits for the end of the body (instead of
    refusing at once) before raising 413."""

    def __init__(self, expected_content_length: int | None, max_content_length: int | None) -> None:
        self._limit = max_content_length
        self._data: bytes | bytearray = bytearray()   # received and not yet taken by an iterating reader
        self._received = 0
        self._arrived = trio.Event()   # more data or the end, since an iterating reader last looked
        self._ended = trio.Event()
        # A Content-Length over the limit is known at once; the refusal waits for the body's end all the same.
        over = expected_content_length is not None and self._limit is not None and expected_content_length > self._limit
        self._refusal: Exception | None = RequestEntityTooLarge() if over else None

    def receive(self, data: bytes) -> None:
        self._received += len(data)
        if self._refusal is None and self._limit is not None and self._received > self._limit:
            self._refusal = RequestEntityTooLarge()
            self._data = bytearray()
        if self._refusal is None:
            self._data += data
        self._arrived.set()

    def complete(self) -> None:
        self._data = bytes(self._data)   # so that each `await body` returns it without a copy
        self._ended.set()
        self._arrived.set()

    def __await__(self):
        return self._whole().__await__()

    async def _whole(self) -> bytes:
        await self._ended.wait()
        if self._refusal is not None:
            raise self._refusal
        return bytes(self._data)

    def __aiter__(self) -> LingeringBody:
        return self

    async def __anext__(self) -> bytes:
        while not self._data and not self._ended.is_set():
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


class KeepAliveTimer:
    """Stands in for hypercorn's `TrioSingleTask` as a connection's idle timer (`restart` when the connection goes
    idle, `stop` when a request arrives) with one long-lived task instead of one per request. The connection is
    closed when it has been idle for `keep_alive_timeout`, or is idle when the server begins to shut down; a
    connection that is mid-request then is closed by hypercorn itself after its response."""

    def __init__(self, server: TCPServer) -> None:
        self.server = server
        self.scope: trio.CancelScope | None = None
        self.idle = False
        self.closed = False

    async def restart(self, task_group, action) -> None:  # signature of TrioSingleTask.restart; `action` unused
        self.idle = True
        deadline = trio.current_time() + self.server.config.keep_alive_timeout
        if self.scope is None:
            self.scope = trio.CancelScope(deadline=deadline)
            task_group._nursery.start_soon(self._watch)
        else:
            self.scope.deadline = deadline

    async def stop(self) -> None:
        self.idle = False
        if self.scope is not None:
            self.scope.deadline = math.inf

    def close(self) -> None:
        """The connection is gone: end the task now rather than at the deadline."""
        self.closed = True
        if self.scope is not None:
            self.scope.cancel()

    async def _watch(self) -> None:
        terminated = self.server.context.terminated
        while True:
            assert self.scope is not None
            with self.scope:
                if terminated.is_set():
                    await trio.sleep_forever()  # only the deadline or close() can end the wait now
                await terminated.wait()
            if self.closed:
                return
            if self.idle:
                break
            # A request arrived as the deadline passed, or the server began to shut down mid-request: wait on.
            self.scope = trio.CancelScope(deadline=math.inf)
        with trio.CancelScope(shield=True):
            await self.server._initiate_server_close()


class TCPServer(hypercorn.trio.tcp_server.TCPServer):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.idle_task = KeepAliveTimer(self)

    async def _read_data(self) -> None:
        try:
            await super()._read_data()
        finally:
            self.idle_task.close()


def use_keep_alive_timer() -> None:
    """Make hypercorn's trio worker serve connections with `TCPServer` above. hypercorn takes no server class as a
    parameter; its worker looks the name up in its module when a listener starts."""
    hypercorn.trio.run.TCPServer = TCPServer
