"""The service's own API, under `/api/coordinator/v1`: commits that span formats.

`POST /api/coordinator/v1/commit` takes `{"parts": [...]}`, each part its protocol's own commit body plus
`"format"`, the name of its format (each protocol reads its part: `Protocol.cross_format_part`):

- iceberg: `"prefix"?, "identifier": {...}, "requirements": [...], "updates": [...]` (Iceberg's
  `CommitTableRequest`, for an existing table);
- delta: `"table_id", "table_uri", "commit_info", ...` (the body of Unity Catalog's Delta commit);
- lance: `"id": [...], "version", "manifest_path", ...` (Lance's `CreateTableVersionRequest`).

Every part applies or none does. 200 `{"results": [...]}`: one result per part, in order (Iceberg
`{"metadata-location"}`, Delta `{}`, Lance the version it created). A refusal answers that part's protocol's status
with `{"error": {"code", "type", "message": "part N (format table): ...", "part": N}}`, `type` being that
protocol's error type (Iceberg) or code (Unity Catalog's `error_code`, Lance's numeric code); an error about the
commit as a whole has no `part`, and its `type` is the coordinator's own name for it. Each part needs the grants
its protocol's own commit needs. `Idempotency-Key` (a UUIDv7) works as it does for Iceberg: a retry is answered
as the first attempt was, never applied twice.
"""

from __future__ import annotations

from urllib.parse import quote

import orjson
from quart import Blueprint, Response, current_app, g
from werkzeug.exceptions import HTTPException

from coordinator import crossformat
from coordinator.errors import BadRequest, CoordinatorError, TooManyRequests, Unavailable, from_storage

from .access import Needs, guard
from .common import CommitPart, json_response, parsed_once, read_json
from .context import current_coordinator
from .idempotency import idempotent, request_key

bp = Blueprint("coordinator", __name__, url_prefix="/api/coordinator/v1")

MAX_PARTS = 1000
# How each protocol reads a part of its format, by the format's name.


async def _parts() -> list[CommitPart]:
    """The parts, each read as far as its access policy needs (its format and table); `_plans` reads the rest."""
    return await parsed_once("cross-format-parts", _read_parts)


async def _read_parts() -> list[CommitPart]:
    body = await read_json()
    raw = body.get("parts") if isinstance(body, dict) else None
    if not isinstance(raw, list) or not raw:
        raise BadRequest('the body must be {"parts": [...]} with at least one part')
    if len(raw) > MAX_PARTS:
        raise BadRequest(f"a commit may have at most {MAX_PARTS} parts, got {len(raw)}")
    parts, protocols = [], current_app.protocols
    for i, part in enumerate(raw):
        fmt = part.get("format") if isinstance(part, dict) else None
        protocol = protocols.by_name.get(fmt) if isinstance(fmt, str) else None
        if protocol is None:
            raise _in_part(BadRequest(f"part {i}: format must be one of {', '.join(protocols.by_name)}, got "
                                      f"{fmt!r}"), i)
        try:
            parts.append(protocol.cross_format_part({k: v for k, v in part.items() if k != "format"}))
        except CoordinatorError as exc:
            raise _in_part(BadRequest(f"part {i} ({fmt}): {exc.message}"), i) from None
    return parts


def _plans(parts: list[CommitPart]) -> list:
    """Each part validated whole, once the caller's grants for them all are checked; their planners."""
    plans = []
    for i, part in enumerate(parts):
        try:
            plans.append(part.read())
        except CoordinatorError as exc:
            raise _in_part(BadRequest(f"part {i} ({part.label}): {exc.message}"), i) from None
    g.cross_format_parts = parts   # from here on, a part's refusal is worded in its protocol (error_response)
    return plans


def _in_part(exc: CoordinatorError, index: int) -> CoordinatorError:
    exc.part = index
    return exc


async def _commit_needs() -> Needs:
    return [need for part in await _parts() for need in await part.needs()]


async def _labels() -> str:
    """What a key is bound to: the parts' tables."""
    return quote(",".join(p.label for p in await _parts()), safe="")


@bp.post("/commit")
@guard(_commit_needs)
@idempotent("cross-format-commit", _labels)
async def commit() -> Response:
    plans = _plans(await _parts())
    return json_response({"results": await crossformat.commit(_registry(), plans, request_key())})


def _registry():
    return current_coordinator().registry


def error_response(exc: BaseException, req=None) -> Response:
    """Any error on the service's own API: a part's refusal in its protocol's words, anything else as itself."""
    exc = from_storage(exc)
    if isinstance(exc, HTTPException):
        status = exc.code or 400
        return json_response({"error": {"code": status, "type": exc.name, "message": exc.description or exc.name}},
                             status)
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, (Unavailable, TooManyRequests)) else None
    parts = g.get("cross_format_parts")
    if exc.part is None or parts is None or exc.part >= len(parts):
        error = {"code": exc.status, "type": type(exc).__name__, "message": exc.message}
        if exc.part is not None:
            error["part"] = exc.part
        return json_response({"error": error}, exc.status, headers)
    part = parts[exc.part]
    status, error_type = part.error(exc)
    message = f"part {exc.part} ({part.label}): {exc.message}"
    return json_response(orjson.dumps({"error": {"code": status, "type": error_type, "message": message,
                                                 "part": exc.part}}), status, headers)
