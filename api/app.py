"""The HTTP application: one Quart-Trio app with a blueprint per protocol, health and metrics routes, JSON logs."""

from __future__ import annotations

import logging
import time
import uuid

from quart import Response, g, request
from quart_trio import QuartTrio

from werkzeug.exceptions import HTTPException

from coordinator.errors import BadRequest, CoordinatorError, NotFound
from coordinator.service import Coordinator

from . import delta, iceberg, lance
from .common import json_response

log = logging.getLogger("coordinator.http")

MAX_BODY_BYTES = 64 * 1024 * 1024


def _protocol(path: str) -> str:
    if path.startswith("/api/2.1/unity-catalog"):
        return "delta"
    if path == "/v1/table" or path.startswith(("/v1/namespace/", "/v1/table/", "/v1/transaction/")):
        return "lance"
    if path.startswith("/v1/"):
        return "iceberg"
    return "service"


def create_app(coordinator: Coordinator) -> QuartTrio:
    app = QuartTrio(__name__)
    app.config["COORDINATOR"] = coordinator
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.register_blueprint(iceberg.bp)
    app.register_blueprint(delta.bp)
    app.register_blueprint(lance.bp)
    metrics = coordinator.metrics

    @app.before_request
    async def _start() -> None:
        g.request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        g.started = time.perf_counter()
        # Always consume the body, even when a handler rejects the request early: an unread body left on a
        # keep-alive connection stalls the client's next request.
        if request.method in ("POST", "PUT", "PATCH", "DELETE"):
            await request.get_data()

    @app.after_request
    async def _finish(response: Response) -> Response:
        elapsed = time.perf_counter() - g.get("started", time.perf_counter())
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        metrics.request_latency.labels(_protocol(request.path), f"{request.method} {rule}",
                                       f"{response.status_code // 100}xx").observe(elapsed)
        response.headers["X-Request-Id"] = g.get("request_id", "")
        if log.isEnabledFor(logging.INFO):
            log.info("request", extra={"request_id": g.get("request_id"), "method": request.method,
                                       "path": request.path, "status": response.status_code,
                                       "ms": round(elapsed * 1000, 2)})
        return response

    @app.errorhandler(HTTPException)
    async def _unrouted(exc: HTTPException) -> Response:
        # No route matched (or a bad method): still answer in the protocol the path belongs to, never HTML.
        protocol = _protocol(request.path)
        if protocol == "delta":
            return await delta._on_http_error(exc)
        if protocol == "lance":
            return await lance._on_http_error(exc)
        message = f"{exc.name}: {request.method} {request.path}"
        if protocol == "iceberg":
            err = NotFound(message, kind="route") if exc.code == 404 else BadRequest(message)
            err.status = exc.code or 400
            return iceberg.error_response(err)
        return json_response({"error": {"message": message, "code": exc.code}}, exc.code or 400)

    @app.errorhandler(CoordinatorError)
    async def _coordinator_error(exc: CoordinatorError) -> Response:
        # Protocol blueprints translate their own errors; this covers service routes.
        return json_response({"error": {"message": exc.message, "code": exc.status}}, exc.status)

    @app.get("/healthz")
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        try:
            await coordinator.store.ping()
        except CoordinatorError as exc:
            return json_response({"status": "unavailable", "reason": exc.message}, 503)
        return json_response({"status": "ready"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), content_type="text/plain; version=0.0.4")

    return app
