"""The commit feed over HTTP: `GET /api/coordinator/v1/events` (docs/events.md).

Query: `after` (a token from an earlier answer's `next` or an event's `sequence`; none: the oldest event kept),
`limit` (default 100, at most 1000), `wait` (seconds, at most 60: with nothing to answer, hold the request until
an event arrives), `format` and `table` (repeatable filters: `iceberg`/`delta`/`lance`, and a table's full dotted name as
the events' `subject` spells it). Answers 200 `{"events": [...CloudEvents...], "next": token}`; 410 when `after`
is older than retention kept; 400 for a malformed token or query. Errors are the service's own
(`{"error": {"code", "type", "message"}}`).

Any authenticated client may read the feed; it sees only the events of tables it may read, and what it is answered
depends on nothing else. A long-poll beyond the waiting readers' bounds is 429 (the client's share) or 503 (the
service's), with Retry-After.
"""

from __future__ import annotations

from quart import Blueprint, Response, g, request

from coordinator.errors import BadRequest
from coordinator.feed import scope_of

from .access import authenticated, guard
from .common import json_response
from .context import current_coordinator

bp = Blueprint("events", __name__, url_prefix="/api/coordinator/v1")


def _number(name: str, default: float, kind: type) -> float:
    raw = request.args.get(name)
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise BadRequest(f"{name} must be a number, got {raw[:40]!r}") from None


@bp.get("/events")
@guard(authenticated)
async def events() -> Response:
    principal = g.get("principal")
    feed = current_coordinator().feed
    return json_response(await feed.read(request.args.get("after"), limit=int(_number("limit", 100, int)),
                                         wait_s=_number("wait", 0.0, float), formats=request.args.getlist("format"),
                                         tables=request.args.getlist("table"), scope=scope_of(principal),
                                         client=principal.name if principal is not None else "anonymous"))
