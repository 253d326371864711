"""How requests come off the wire: two corrections to quart-trio's defaults, both about bounding what a slow,
oversized or vanished client can cost (issue 7, "Hostile and broken input").

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
"""

from __future__ import annotations

from quart.asgi import ASGIHTTPConnection
from quart_trio.asgi import TrioASGIHTTPConnection
from quart_trio.wrappers.request import TrioBody, TrioRequest
from werkzeug.exceptions import RequestEntityTooLarge


class HTTPConnection(TrioASGIHTTPConnection):
    _sending = False

    async def handle_messages(self, nursery, request, receive) -> None:  # type: ignore[override]
        await ASGIHTTPConnection.handle_messages(self, request, receive)
        if not self._sending:
            nursery.cancel_scope.cancel()
        # Otherwise the handler is sending the response; it cancels the nursery itself when that is done.

    async def _send_response(self, send, response) -> None:
        self._sending = True
        await super()._send_response(send, response)


class LingeringBody(TrioBody):
    """Quart's body, except that going over the limit drops the data and waits for the end of the body (instead
    of completing at once) before `await body` raises 413."""

    def __init__(self, expected_content_length: int | None, max_content_length: int | None) -> None:
        super().__init__(expected_content_length, max_content_length)
        # A Content-Length over the limit is known at once; the refusal waits for the body's end all the same.
        self._refusal: Exception | None = self._must_raise
        self._must_raise = None

    def append(self, data: bytes) -> None:
        if not data or self._refusal is not None:
            return
        self._data.extend(data)
        self._has_data.set()
        if self._max_content_length is not None and len(self._data) > self._max_content_length:
            self._refusal = RequestEntityTooLarge()
            self._data.clear()

    def set_complete(self) -> None:
        self._must_raise = self._refusal
        super().set_complete()


class Request(TrioRequest):
    body_class = LingeringBody
