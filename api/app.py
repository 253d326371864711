"""The HTTP application: one Quart-Trio app with a blueprint per protocol, health and metrics routes, JSON logs."""

from __future__ import annotations

import functools
import itertools
import os
import time
from importlib import resources
from urllib.parse import unquote

from quart import Response, g, redirect, request
from quart_trio import QuartTrio

from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout
from werkzeug.exceptions import NotFound as NoRoute  # werkzeug's: the 404 of a path no route matches

from coordinator.actor import COMMITTED
from coordinator.errors import BadRequest, CoordinatorError, NotFound, from_storage
from coordinator.service import Coordinator
from storage.errors import StorageError

from . import commits, console, delta, events, iceberg, lance, oauth, warehouses
from .access import challenge, enforce, public
from .common import framework_error_message, json_response, protocol_of
from .request_log import log_request
from .routing import CachingMap
from .transport import HTTPConnection, Request

MAX_BODY_BYTES = 64 * 1024 * 1024

# X-Request-Id when the client sends none: unique across processes and restarts (a random prefix), and cheaper
# per request than a uuid4 (no urandom call, no UUID object).
_REQUEST_ID_PREFIX = os.urandom(8).hex()
_request_numbers = itertools.count()


def next_request_id() -> str:
    return f"{_REQUEST_ID_PREFIX}{next(_request_numbers):x}"

# `GET /openapi/<name>.yaml`: the reference spec of each protocol (Iceberg, Lance: unchanged copies of
# shared/specs), and for Unity Catalog a document of exactly the routes api/delta.py serves. Service-level paths,
# so they collide with no protocol's `/v1/...` routes.
OPENAPI_DOCUMENTS = ("iceberg", "lance", "delta")


@functools.cache
def openapi_document(name: str) -> bytes:
    return resources.files(__package__).joinpath("openapi", f"{name}.yaml").read_bytes()


def _service_error(exc: BaseException) -> Response:
    """Errors on the service's own routes (health, metrics, OpenAPI documents)."""
    exc = from_storage(exc)
    if isinstance(exc, HTTPException):
        return json_response({"error": {"message": framework_error_message(exc), "code": exc.code}}, exc.code or 400)
    return json_response({"error": {"message": exc.message, "code": exc.status}}, exc.status)


ERROR_RESPONSES = {"iceberg": iceberg.error_response, "delta": delta.error_response, "lance": lance.error_response,
                   "coordinator": commits.error_response, "service": _service_error}


class App(QuartTrio):
    url_map_class = CachingMap

    async def __call__(self, scope, receive, send) -> None:
        # Java's Iceberg REST client (and lance_namespace's Python one) encode a space in a path segment as `+`, and
        # a `+` as `%2B`, as the Java reference server decodes them (RESTUtil.decodeString): `+` is a space there.
        # hypercorn leaves `+` as it is, so a name with a space was created (it travels in a body) and then never
        # found again. The path is decoded afresh from the raw one; other paths cost one `in` test.
        raw = scope.get("raw_path")
        if raw and b"+" in raw and raw.startswith(b"/v1/"):
            scope = {**scope, "path": unquote(raw.replace(b"+", b"%20").decode("ascii"))}
        await super().__call__(scope, receive, send)


def create_app(coordinator: Coordinator) -> QuartTrio:
    app = App(__name__)
    app.asgi_http_class = HTTPConnection
    app.request_class = Request
    app.config["COORDINATOR"] = coordinator
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["BODY_TIMEOUT"] = coordinator.config.http_body_timeout_s
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.register_blueprint(oauth.bp)
    app.register_blueprint(iceberg.bp)
    app.register_blueprint(iceberg.uniform.bp)
    app.register_blueprint(delta.bp)
    app.register_blueprint(lance.bp)
    app.register_blueprint(commits.bp)
    app.register_blueprint(warehouses.bp)
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
        COMMITTED.set(None)  # set by the commit this request applies, if any (logged by _finish)
        # Always consume the body, whatever the method and even when a handler rejects the request early: an
        # unread body left on a keep-alive connection stalls the client's next request, and reading it here puts
        # every body under BODY_TIMEOUT (a GET whose body trickles in would otherwise hold its connection). A
        # request with no Content-Length (or 0) and no Transfer-Encoding has no body (RFC 9112 6.3): nothing to wait for.
        if req.content_length or "Transfer-Encoding" in headers:
            try:
                await req.get_data()
            except RequestEntityTooLarge:
                raise RequestEntityTooLarge(f"request body too large: the limit is {MAX_BODY_BYTES} bytes") from None
            except RequestTimeout:
                raise RequestTimeout(f"request body did not arrive within "
                                     f"{coordinator.config.http_body_timeout_s:g} s") from None
        # A NUL (%00) can name nothing: PostgreSQL text cannot hold it and the OS cannot open a path with it. (h11
        # refuses a raw NUL in the request line, so a query string can only hold it encoded.)
        if "\x00" in req.path or b"%00" in req.query_string:
            raise BadRequest("the path or a query parameter has a NUL character (%00)")
        await enforce()

    @app.after_request
    async def _finish(response: Response) -> Response:
        req, ctx = request._get_current_object(), g._get_current_object()
        started = getattr(ctx, "started", None)
        elapsed = time.perf_counter() - started if started is not None else 0.0
        rule = req.url_rule.rule if req.url_rule is not None else None
        metrics.observe_request(protocol_of(req.path), req.method, rule, response.status_code, elapsed)
        request_id = getattr(ctx, "request_id", "")
        response.headers["X-Request-Id"] = request_id
        await log_request(req, response, request_id, elapsed, coordinator.authority is not None)
        return response

    # Every error, whoever raised it (a handler, the access check, the framework when no route matched), is
    # answered in the protocol the path belongs to, by that protocol's one translation.
    @app.errorhandler(HTTPException)
    @app.errorhandler(CoordinatorError)
    @app.errorhandler(StorageError)
    async def _error(exc: Exception) -> Response:
        req = request._get_current_object()
        response = ERROR_RESPONSES[protocol_of(req.path)](exc)
        bearer = challenge(exc, req)
        if bearer is not None:
            response.headers["WWW-Authenticate"] = bearer
        return response

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
        if name not in OPENAPI_DOCUMENTS:
            raise NotFound(f"no OpenAPI document {name!r}: there is one for each of {', '.join(OPENAPI_DOCUMENTS)}")
        return Response(openapi_document(name), content_type="application/yaml")

    @app.get("/metrics")
    @public
    async def prometheus() -> Response:
        return Response(metrics.render(), content_type="text/plain; version=0.0.4")

    return app
