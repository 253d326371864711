"""The one log line per request: what was asked, what the client was told, by whom, and what it committed.

Fields (documented for operators in docs/observability.md): `request_id`, `method`, `path`, `status`, `ms`;
for a 4xx/5xx `error_type` and `error` as the error body gave them to the client; `client_id` when
authentication is on (for a 401, the client id the request claimed, if any); `table`, `format` and `version`
when the request applied a commit. Probes (health, readiness, metrics scrapes) are logged at debug.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
from typing import Any

import jwt
from quart import Response

from coordinator.mailbox import COMMITTED
from coordinator.auth import CALLER

log = logging.getLogger("coordinator.http")

# Asked every few seconds by load balancers and Prometheus: at info they would drown the requests that matter.
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
ERROR_MESSAGE_MAX = 500  # characters of an error message kept in the log line

# X-Request-Id when the client sends none: unique across processes and restarts (a random prefix), and cheaper
# per request than a uuid4 (no urandom call, no UUID object).
_REQUEST_ID_PREFIX = os.urandom(8).hex()
_request_numbers = itertools.count()


def next_request_id() -> str:
    return f"{_REQUEST_ID_PREFIX}{next(_request_numbers):x}"


def error_of(body: Any) -> tuple[Any, str | None]:
    """(type, message) of an error body in any of the service's formats: Iceberg's and the service's own
    `{"error": {"type"|"code", "message"}}`, Unity Catalog's `{"error_code", "message"}`, Lance's
    `{"error": message, "code": n}` and OAuth's `{"error", "error_description"}`."""
    if not isinstance(body, dict):
        return None, None
    error = body.get("error")
    if isinstance(error, dict):
        return error.get("type") or error.get("code"), error.get("message")
    if "error_code" in body:
        return body["error_code"], body.get("message")
    if isinstance(error, str):
        if "error_description" in body:
            return error, body["error_description"]
        return body.get("code"), error
    return None, None


def claimed_client(req) -> str | None:
    """The client id a refused request claimed: the token endpoint's form field, or the `sub` of a bearer token
    (read without checking its signature: it is logged as a claim, never trusted)."""
    form = getattr(req, "_form", None)  # parsed only if the handler read it: the token endpoint does
    if form is not None and form.get("client_id"):
        return form.get("client_id")
    scheme, _, token = (req.headers.get("Authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    try:
        sub = jwt.decode(token.strip(), options={"verify_signature": False}).get("sub")
    except jwt.InvalidTokenError:
        return None
    return sub if isinstance(sub, str) else None


async def log_request(req, response: Response, request_id: str, elapsed_s: float, auth_on: bool) -> None:
    level = logging.DEBUG if req.path in PROBE_PATHS else logging.INFO
    if not log.isEnabledFor(level):
        return
    status = response.status_code
    fields: dict[str, Any] = {"request_id": request_id, "method": req.method, "path": req.path, "status": status,
                              "ms": round(elapsed_s * 1000, 2)}
    if status >= 400:
        try:
            body = json.loads(await response.get_data())
        except ValueError:
            body = None
        error_type, message = error_of(body)
        if error_type is not None:
            fields["error_type"] = error_type
        if message is not None:
            fields["error"] = str(message)[:ERROR_MESSAGE_MAX]
    if auth_on:
        caller = CALLER.get()
        client = caller if caller != "anonymous" else claimed_client(req) if status == 401 else None
        if client is not None:
            fields["client_id"] = client
    committed = COMMITTED.get()
    if committed is not None and status < 400:
        fields["format"], fields["table"], fields["version"] = committed
    log.log(level, "request", extra=fields)
