"""The routes a writer calls for each commit, served straight from their ASGI messages.

A streaming writer commits to its tables over and over, and Quart's machinery around each request (its request
and context objects, two tasks, signals, hooks, its response conversion) costs about as much CPU as everything
else the HTTP layer does for a commit (loadtest/README.md, "Where a commit's CPU goes"). A route declares that it is
served so with `@direct(...)` under its route decorators (each protocol's commit; Lance's reads of the latest
version, which pylance makes for each commit): its one handler, `view(coordinator, req, body)`, is both the Quart
view those decorators register and, for an ordinary request, what runs here, with the same access policy, the
blueprint's same before-request check (`@before_request(bp)`), the app's error translation, metrics and log line,
and without that machinery.

Ordinary: a GET or POST the route takes, a query string that is UTF-8 throughout, no Content-Length or one of
at most DIRECT_MAX_BODY (no Transfer-Encoding), and whatever the route asks besides (`takes`; Iceberg: no
Idempotency-Key). Anything else goes to Quart untouched, and so does a body that grows past DIRECT_MAX_BODY as it
arrives (over HTTP/2 a body need not announce its length), with what arrived replayed.

Nothing of the body is received before the caller is authenticated, and nothing of it is parsed that the route's
access policy does not read before the caller's grants are checked: a policy that needs only the path is checked
before the body is received at all; one that reads part of the body (`part`: a commit's table id) gets only that
part validated. A request refused for its credential or grants before its body is read is answered here, by the
app's error translation, as Quart answers it (one that floods the service with such requests costs it a fraction
of a request each). One that fails otherwise before its view runs (a NUL in its path, its body's JSON or model,
its grants on what the body names, the blueprint's before-request check) goes to Quart, with what it sent
replayed: so every such refusal is Quart's own, in the same words and order. What the view raises is answered
here by the app's error translation, as Quart's error handler would: the view may have handed a commit to its
table's actor, which must not be done twice.

Unlike Quart's, the view here is not cancelled when the client disconnects while it runs: the commit it handed to
its table's actor goes on either way, and its answer (and log line) is then written to a closed connection.
"""

from __future__ import annotations

import functools
import inspect
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import trio
from quart import Blueprint, Response, g, request
from quart.utils import encode_headers
from werkzeug.datastructures import ImmutableMultiDict
from werkzeug.exceptions import HTTPException, InternalServerError

from coordinator.actor import COMMITTED
from coordinator.errors import CoordinatorError, Forbidden, Unauthorized
from storage.errors import StorageError

from .access import POLICIES, Needs, before_refusal, caller, refuse_if_nothing_granted
from .common import body_json, body_timeout, refuse_nul
from .request_log import next_request_id
from .context import current_coordinator
from .transport import drain_unread

DIRECT_MAX_BODY = 1024 * 1024   # larger bodies (rare for a commit) are read by Quart, under its lingering limit
HANDLED = (HTTPException, CoordinatorError, StorageError)   # what the app's error handler answers


@dataclass(frozen=True)
class DirectRoute:
    """A route served directly (`direct`): how its body is read, its access policy and its view, as functions of
    the coordinator, the request and the body as read."""

    read: Callable[[DirectRequest], Any] | None   # the body as the route's view reads it (None: it reads none)
    # Its access policy (api/access.py), of the coordinator, the request and the part of the body it reads.
    needs: Callable[[Any, DirectRequest, Any], Awaitable[Needs]]
    view: Callable[[Any, DirectRequest, Any], Awaitable[Response]]
    takes: Callable[[DirectRequest], bool] | None = None                   # False: this request goes to Quart
    # The part of the body the policy reads, as it reads it (None: the policy reads only the path).
    part: Callable[[DirectRequest], Any] | None = None

    def body(self, req: DirectRequest, part: Any) -> Any:
        """The body as the view reads it, once the policy read `part` of it (the whole, for a policy that reads
        all of a small body)."""
        if self.read is None:
            return None
        return part if part is not None and self.read is self.part else self.read(req)


# The routes declared with `direct`, by their Quart view; the blueprints' before-request checks declared with
# `before_request`, by blueprint name. api/app.py finds them through the app's own route table.
SERVED: dict[Callable[..., Any], DirectRoute] = {}
BEFORE: dict[str, Callable[[Any, DirectRequest], Awaitable[None]]] = {}


def direct(*, needs: Callable[[Any, DirectRequest, Any], Awaitable[Needs]],
           read: Callable[[DirectRequest], Any] | None = None, part: Callable[[DirectRequest], Any] | None = None,
           takes: Callable[[DirectRequest], bool] | None = None):
    """Declares a route served straight from ASGI for an ordinary request (this module), by its one handler
    `view(coordinator, req, body)`: put it under the route decorators, which register the Quart view it returns
    for every other request. `needs(coordinator, req, part)` is its access policy on both paths (`part`: what
    `part(req)` read of the body, None when it reads none); `read(req)`: the body as the view takes it."""
    def wrap(handler):
        route = DirectRoute(read, needs, handler, takes, part)

        async def policy(**_: Any) -> Needs:
            req = await quart_request(body=part is not None)
            return await needs(current_coordinator(), req, part(req) if part is not None else None)

        @functools.wraps(handler)
        async def view(**_: Any) -> Response:
            req = await quart_request(body=True)
            return await handler(current_coordinator(), req,
                                 route.body(req, part(req) if part is not None and read is part else None))
        POLICIES[view] = policy
        SERVED[view] = route
        return view
    return wrap


def before_request(bp: Blueprint):
    """Declares blueprint `bp`'s before-request check `check(coordinator, req)` once, for Quart's requests and
    the direct routes'."""
    def wrap(check):
        async def hook() -> None:
            await check(current_coordinator(), await quart_request(body=False))
        bp.before_request(hook)
        BEFORE[bp.name] = check
        return check
    return wrap


def served(view_functions: dict[str, Callable[..., Any]]) -> dict[str, DirectRoute]:
    """The direct routes of an app's route table (`view_functions`), by endpoint: each declared with `direct`,
    under whatever its route decorators wrapped it in."""
    return {endpoint: SERVED[inspect.unwrap(view, stop=lambda f: f in SERVED)]
            for endpoint, view in view_functions.items()
            if inspect.unwrap(view, stop=lambda f: f in SERVED) in SERVED}


class Headers(dict):
    """A request's headers by lower-case name (hypercorn gives them so), the first of a repeated one, as
    werkzeug's `Headers.get` gives it; looked up in any case."""

    def get(self, name: str, default: Any = None) -> Any:
        return dict.get(self, name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name.lower() if isinstance(name, str) else name)


class DirectRequest:
    """What the shared code reads of a request (api/access.py, api/request_log.py, the error translations, the
    routes' policies and views): its method, path, headers, route arguments, query parameters and body."""

    __slots__ = ("method", "path", "raw_path", "query_string", "headers", "view_args", "args", "body",
                 "idempotency_key", "_json")

    def __init__(self, scope: dict, headers: Any, view_args: dict[str, str], args: Any) -> None:
        self.method = scope["method"]
        self.path = scope["path"]
        self.raw_path = scope.get("raw_path") or b""
        self.query_string = scope["query_string"]
        self.headers = headers
        self.view_args = view_args
        self.args = args
        self.body: bytes | None = None   # not received yet
        # The request's Idempotency-Key, bound to its route (api/idempotency.py): None on the direct path, which
        # takes no request with one.
        self.idempotency_key = None
        self._json = _UNPARSED

    def json(self) -> Any:
        """The body's JSON (api/common.py's `body_json`), parsed once: the policy's part and the view's body share
        it."""
        if self._json is _UNPARSED:
            self._json = body_json(self.body)
        return self._json


_UNPARSED = object()


async def quart_request(body: bool) -> DirectRequest:
    """The Quart request being served as a direct route's code reads it (its body received if `body`), once per
    request."""
    ctx = g._get_current_object()
    req = ctx.get("direct_request")
    if req is None:
        quart = request._get_current_object()
        req = ctx.direct_request = DirectRequest(quart.scope, quart.headers, quart.view_args or {}, quart.args)
    req.idempotency_key = ctx.get("idempotency_key")
    if body and req.body is None:
        req.body = await request.get_data()
    return req


class DirectRoutes:
    """Serves the ordinary requests to `routes` (endpoint -> DirectRoute) of `app`; `quart` serves the others.
    `error_answer(exc, req)` and `finish(req, response, request_id, started, rule)` are the app's own error
    handler and after-request hook, for both paths."""

    def __init__(self, app, coordinator, routes: dict[str, DirectRoute], quart: Callable[..., Awaitable[None]],
                 error_answer: Callable[[BaseException, Any], Response],
                 finish: Callable[..., Awaitable[None]]) -> None:
        self.app, self.coordinator, self.routes, self.quart = app, coordinator, routes, quart
        self.error_answer, self.finish = error_answer, finish
        self.body_timeout_s = coordinator.config.http_body_timeout_s
        self.response_timeout_s = app.config["RESPONSE_TIMEOUT"]   # Quart's bound on sending an answer
        self._urls = None

    def route(self, scope: dict) -> tuple[DirectRoute, Any, DirectRequest] | None:
        """The direct route an ordinary request goes to, its rule and the request; None: Quart's."""
        if scope["type"] != "http" or scope["method"] not in ("POST", "GET"):
            return None
        if self._urls is None:   # bound once: the service matches paths only (no host or subdomain rules)
            self._urls = self.app.url_map.bind("")
        try:
            rule, args = self._urls.match(scope["path"], scope["method"], return_rule=True)
        except HTTPException:   # no route, another method, a redirect: Quart words those
            return None
        route = self.routes.get(rule.endpoint)
        if route is None:
            return None
        headers = Headers()
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        length = headers.get("content-length")   # none: HTTP/1 has no body, HTTP/2 one of any length (counted)
        if "transfer-encoding" in headers or (length is not None and (not length.isdigit()
                                                                      or int(length) > DIRECT_MAX_BODY)):
            return None
        try:   # as werkzeug reads them, which keeps a byte that is not UTF-8 percent-encoded: then Quart does
            query = ImmutableMultiDict(parse_qsl(scope["query_string"].decode(), keep_blank_values=True,
                                                 errors="strict"))
        except UnicodeDecodeError:
            return None
        req = DirectRequest(scope, headers, args, query)
        if route.takes is not None and not route.takes(req):
            return None
        return route, rule, req

    async def serve(self, taken, scope: dict, receive, send) -> None:
        route, rule, req = taken
        started = time.perf_counter()
        principal = None
        try:   # before anything of the body is received
            principal = self._caller(req)
            if route.part is None:
                await self._check(route, req, principal, None)
            elif principal is not None:
                refuse_if_nothing_granted(principal)
        except (Unauthorized, Forbidden) as exc:
            return await self._refuse(exc, principal, scope, req, receive, send, started, rule.rule)
        except Exception:  # noqa: BLE001 - refused before the view: Quart refuses it, in its own words and order
            return await self.quart(scope, receive, send)
        received, size, too_large = [], 0, False
        with trio.move_on_after(self.body_timeout_s):
            while True:
                message = await receive()
                if message["type"] != "http.request":   # the client left: nobody to answer
                    return
                received.append(message)
                size += len(message.get("body", b""))
                if size > DIRECT_MAX_BODY:   # (only a body of no announced length gets here)
                    too_large = True
                    break
                if not message.get("more_body", False):
                    break
        if too_large:   # read on, and answered, by Quart under the app's own limit
            return await self.quart(scope, _replaying(received, receive), send)
        request_id = req.headers.get("x-request-id") or next_request_id()
        COMMITTED.set(None)   # set by the commit this request applies, if any (logged by finish)
        if not received or received[-1].get("more_body", False):
            response = self.error_answer(body_timeout(self.body_timeout_s), req)
            if scope.get("http_version") in ("1.0", "1.1"):
                response.headers["Connection"] = "close"   # (its body unread: hypercorn closes the connection)
            await self._answer(send, req, response, request_id, started, rule.rule)
            return drain_unread(receive)
        req.body = b"".join(m.get("body", b"") for m in received)
        try:
            body = await self._checked(route, rule.endpoint, req, principal)
        except Exception:  # noqa: BLE001 - refused before the view: Quart refuses it, in its own words and order
            return await self.quart(scope, _replaying(received, receive), send)
        try:
            response = await route.view(self.coordinator, req, body)
        except BaseException as exc:  # noqa: BLE001 - as Quart's error handling, which lets trio's Cancelled through
            response = self._error(exc, req)
        await self._answer(send, req, response, request_id, started, rule.rule)

    async def _refuse(self, exc: Exception, principal, scope: dict, req: DirectRequest, receive, send,
                      started: float, rule: str) -> None:
        """A request whose credential or grants are refused before its body is read, answered here as Quart answers
        it (api/app.py `_start`, api/transport.py): a refusal costs a fraction of a request, whoever floods the
        service with them. An HTTP/1 connection whose request announced a body, left unread, closes after the
        answer, which says so; what hypercorn still queues for the request is drained."""
        await before_refusal(self.coordinator.authority, exc, principal)
        response = self.error_answer(exc, req)
        if scope.get("http_version") in ("1.0", "1.1") and req.headers.get("content-length", "0") != "0":
            response.headers["Connection"] = "close"
        COMMITTED.set(None)
        await self._answer(send, req, response, req.headers.get("x-request-id") or next_request_id(), started, rule)
        drain_unread(receive)

    def _caller(self, req: DirectRequest):
        """The app's before-request checks that need no body: the NUL check, and the caller's credential (None:
        authentication is off)."""
        refuse_nul(req.path, req.query_string)
        authority = self.coordinator.authority
        return caller(authority, req, self.app.protocols.key_header(req.path)) if authority is not None else None

    async def _check(self, route: DirectRoute, req: DirectRequest, principal, part: Any) -> None:
        if principal is not None:
            self.coordinator.authority.check(principal, await route.needs(self.coordinator, req, part))

    async def _checked(self, route: DirectRoute, endpoint: str, req: DirectRequest, principal) -> Any:
        """What Quart does before the view once the body is in (the access check of a policy that reads the body,
        the blueprint's before-request hook), and the body as the view reads it. What fails here, Quart words."""
        part = None
        if route.part is not None and principal is not None:
            part = route.part(req)
            await self._check(route, req, principal, part)
        before = BEFORE.get(endpoint.partition(".")[0])
        if before is not None:
            await before(self.coordinator, req)
        return route.body(req, part)

    def _error(self, exc: BaseException, req: DirectRequest) -> Response:
        """The view's exception answered as Quart answers it: a handled one (in a group, its first handled part)
        by the app's error handler, any other exception as a logged 500; anything else (trio's Cancelled, a group
        of unhandled errors) goes on, to hypercorn."""
        handled = _first_handled(exc)
        if handled is not None:
            return self.error_answer(handled, req)
        if not isinstance(exc, Exception) or isinstance(exc, BaseExceptionGroup):
            raise exc
        self.app.logger.error(f"Exception on request {req.method} {req.path}", exc_info=exc)
        return self.error_answer(InternalServerError(original_exception=exc), req)

    async def _answer(self, send, req: DirectRequest, response: Response, request_id: str, started: float,
                      rule: str) -> None:
        await self.finish(req, response, request_id, started, rule)
        with trio.move_on_after(math.inf if self.response_timeout_s is None else self.response_timeout_s):
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": encode_headers(response.headers)})
            # The body's last part goes with the end of the response: one message fewer than Quart sends.
            last = None
            async with response.response as parts:
                async for part in parts:
                    if last is not None:
                        await send({"type": "http.response.body", "body": last, "more_body": True})
                    last = part
            await send({"type": "http.response.body", "body": last or b"", "more_body": False})


def _first_handled(exc: BaseException) -> BaseException | None:
    if isinstance(exc, HANDLED):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        return next((found for e in exc.exceptions if (found := _first_handled(e)) is not None), None)
    return None


def _replaying(received: list[dict], receive):
    """`receive` that gives the messages already received first."""
    pending = list(received)

    async def receive_again() -> dict:
        if pending:
            return pending.pop(0)
        return await receive()
    return receive_again
