"""The HTTP application: one Quart-Trio app with a blueprint per protocol, health and metrics routes, JSON logs."""

from __future__ import annotations

import functools
import time
from typing import Any, Callable
from importlib import resources
from urllib.parse import unquote

from quart import Response, g, redirect, request
from quart_trio import QuartTrio

from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout
from werkzeug.exceptions import NotFound as NoRoute  # werkzeug's: the 404 of a path no route matches

from coordinator.mailbox import COMMITTED
from coordinator.errors import CoordinatorError, NotFound, from_storage
from coordinator.service import Coordinator
from storage.errors import StorageError

from . import commits, console, events, maintenance, oauth, warehouses
from .access import before_refusal, challenge, enforce, public
from .common import body_timeout, framework_error_message, json_response, refuse_nul
from .direct import DirectRoutes, served
from .protocol import COORDINATOR, SERVICE, Protocols
from .protocols import PROTOCOLS
from .request_log import log_request, next_request_id
from .routing import CachingMap
from .transport import HTTPConnection, Request

MAX_BODY_BYTES = 64 * 1024 * 1024

# `GET /openapi/<name>.yaml`: the reference spec of each protocol, by its format's name (Iceberg, Lance: unchanged
# copies of shared/specs; for Unity Catalog a document of exactly the routes api/delta/ serves). Service-level
# paths, so they collide with no protocol's `/v1/...` routes. (These are the service's; an app serves its own
# protocols'.)
OPENAPI_DOCUMENTS = tuple(p.name for p in PROTOCOLS if p.openapi)


@functools.cache
def openapi_document(name: str) -> bytes:
    return resources.files(__package__).joinpath("openapi", f"{name}.yaml").read_bytes()


def _service_error(exc: BaseException, req) -> Response:
    """Errors on the service's own routes (health, metrics, OpenAPI documents)."""
    exc = from_storage(exc)
    if isinstance(exc, HTTPException):
        return json_response({"error": {"message": framework_error_message(exc, req), "code": exc.code}},
                             exc.code or 400)
    return json_response({"error": {"message": exc.message, "code": exc.status}}, exc.status)


def error_responses(protocols: Protocols) -> dict[str, Callable[[BaseException, Any], Response]]:
    """Each protocol's error translation, by the name `Protocols.of` gives its paths."""
    return {**{p.name: p.error_response for p in protocols}, COORDINATOR: commits.error_response,
            SERVICE: _service_error}


def error_answer(exc: BaseException, req, protocols: Protocols,
                 responses: dict[str, Callable[[BaseException, Any], Response]]) -> Response:
    """Every error, whoever raised it (a handler, the access check, the framework when no route matched), is
    answered in the protocol the path belongs to, by that protocol's one translation."""
    response = responses[protocols.of(req.path)](exc, req)
    bearer = challenge(exc, req, protocols.key_header(req.path))
    if bearer is not None:
        response.headers["WWW-Authenticate"] = bearer
    return response


class App(QuartTrio):
    url_map_class = CachingMap
    direct: DirectRoutes | None = None   # set by create_app
    protocols: Protocols = PROTOCOLS     # the protocols it speaks (create_app)

    async def __call__(self, scope, receive, send) -> None:
        # Java's Iceberg REST client (and lance_namespace's Python one) encode a space in a path segment as `+`, and
        # a `+` as `%2B`, as the Java reference server decodes them (RESTUtil.decodeString): `+` is a space there.
        # hypercorn leaves `+` as it is, so a name with a space was created (it travels in a body) and then never
        # found again. The path is decoded afresh from the raw one; other paths cost one `in` test.
        raw = scope.get("raw_path")
        if raw and b"+" in raw and raw.startswith(b"/v1/"):
            scope = {**scope, "path": unquote(raw.replace(b"+", b"%20").decode("ascii"))}
        taken = self.direct.route(scope) if self.direct is not None else None
        if taken is not None:
            await self.direct.serve(taken, scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(coordinator: Coordinator, protocols: Protocols = PROTOCOLS) -> QuartTrio:
    """The app serving `coordinator` in `protocols` (one for each of the coordinator's formats; by default the
    service's own list, api/protocols.py)."""
    app = App(__name__)
    app.protocols = protocols
    answer_error = functools.partial(error_answer, protocols=protocols, responses=error_responses(protocols))
    documents = tuple(p.name for p in protocols if p.openapi)
    app.asgi_http_class = HTTPConnection
    app.request_class = Request
    app.config["COORDINATOR"] = coordinator
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["BODY_TIMEOUT"] = coordinator.config.http_body_timeout_s
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.register_blueprint(oauth.bp)
    for protocol in protocols:
        for blueprint in protocol.blueprints:
            app.register_blueprint(blueprint)
    app.register_blueprint(commits.bp)
    app.register_blueprint(warehouses.bp)
    app.register_blueprint(maintenance.bp)
    app.register_blueprint(events.bp)
    app.register_blueprint(console.bp)
    metrics = coordinator.metrics

    # The two hooks run for every request, so each resolves quart's context proxies (`request`, `g`) once: a
    # proxied attribute costs a context-variable lookup each time.
    @app.before_request
    async def _start() -> None:
        req, ctx = request._get_current_object(), g._get_current_object()
        headers = req.headers
        ctx.started = time.perf_counter()
        ctx.request_id = headers.get("X-Request-Id") or next_request_id()
        COMMITTED.set(None)  # set by the commit this request applies, if any (logged by finish)
        refuse_nul(req.path, req.query_string)
        # The caller is authenticated before anything of the body is read, and the route's policy checked before
        # anything of the body is parsed that the policy does not read (a policy that reads the body reads it
        # here: api/transport.py's LingeringBody receives nothing until it is wanted). A request refused here is
        # answered without its body, and its connection closed unless the body had already arrived.
        try:
            await enforce()
            # Then always consume the body, whatever the method: an unread body left on a keep-alive connection
            # stalls the client's next request, and reading it here puts every body under BODY_TIMEOUT (a GET whose
            # body trickles in would otherwise hold its connection). An HTTP/1 request with no Content-Length (or
            # 0) and no Transfer-Encoding has no body (RFC 9112 6.3): nothing to wait for. Over HTTP/2 a body need
            # not announce its length, so its end is always waited for; it is counted against the limit all the same.
            if req.content_length or "Transfer-Encoding" in headers or req.http_version not in ("1.0", "1.1"):
                await req.get_data()
            else:
                req.body.want()   # its end only (and a client leaving, which cancels the handler)
        except RequestEntityTooLarge:
            raise RequestEntityTooLarge(f"request body too large: the limit is {MAX_BODY_BYTES} bytes") from None
        except RequestTimeout:
            raise body_timeout(coordinator.config.http_body_timeout_s) from None

    async def finish(req, response: Response, request_id: str, started: float | None, rule: str | None) -> None:
        """Every answer's metrics, X-Request-Id and log line (Quart's requests and the direct routes'); `rule`: the
        route's (None: no route matched)."""
        elapsed = time.perf_counter() - started if started is not None else 0.0
        metrics.observe_request(protocols.of(req.path), req.method, rule, response.status_code, elapsed)
        response.headers["X-Request-Id"] = request_id
        await log_request(req, response, request_id, elapsed, coordinator.authority is not None)

    @app.after_request
    async def _finish(response: Response) -> Response:
        req, ctx = request._get_current_object(), g._get_current_object()
        await finish(req, response, getattr(ctx, "request_id", ""), getattr(ctx, "started", None),
                     req.url_rule.rule if req.url_rule is not None else None)
        return response

    @app.errorhandler(HTTPException)
    @app.errorhandler(CoordinatorError)
    @app.errorhandler(StorageError)
    async def _error(exc: Exception) -> Response:
        await before_refusal(coordinator.authority, exc, getattr(g._get_current_object(), "principal", None))
        return answer_error(exc, request._get_current_object())

    # The routes declared to be served without Quart's request machinery (api/direct.py), by endpoint.
    app.direct = DirectRoutes(app, coordinator, served(app.view_functions), super(App, app).__call__, answer_error,
                              finish)

    @app.get("/")
    @public
    async def root() -> Response:
        """A browser pointed at the service (it prefers text/html) is sent to the console; an API client gets the
        JSON 404 of any path the service does not serve (`*/*` or no Accept header prefers neither)."""
        if request.accept_mimetypes.best_match(("application/json", "text/html")) == "text/html":
            return redirect("/ui/")
        raise NoRoute()

    @app.get("/healthz")
    @public
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get("/readyz")
    @public
    async def readyz() -> Response:
        try:
            await coordinator.store.ping()
        except (CoordinatorError, StorageError) as exc:
            return json_response({"status": "unavailable", "reason": exc.message}, 503)
        return json_response({"status": "ready"})

    @app.get("/openapi/<name>.yaml")
    @public
    async def openapi(name: str) -> Response:
        if name not in documents:
            raise NotFound(f"no OpenAPI document {name!r}: there is one for each of {', '.join(documents)}")
        return Response(openapi_document(name), content_type="application/yaml")

    @app.get("/metrics")
    @public
    async def prometheus() -> Response:
        return Response(metrics.render(), content_type="text/plain; version=0.0.4")

    return app
