"""The commit feed over HTTP: `GET /api/coordinator/v1/events` (docs/events.md).

Query: `after` (a token from an earlier answer's `next` or an event's `sequence`; none: the oldest event kept),
`limit` (default 100, at most 1000), `wait` (seconds, at most 60: with nothing to answer, hold the request until
an event arrives), `format` and `table` (repeatable filters: `iceberg`/`delta`/`lance`, and a table's full dotted name as
the events' `subject` spells it). Answers 200 `{"events": [...CloudEvents...], "next": token}`; 410 when `after`
is older than retention kept; 400 for a malformed token or query. Errors are the service's own
(`{"error": {"code", "type", "message"}}`).

Any authenticated client may read the feed; it sees only the events of tables it may read.
"""

from __future__ import annotations

from quart import Blueprint, Response, g, request

from coordinator.auth import Privilege, Resource, table_securable
from coordinator.errors import BadRequest
from coordinator.format import Formats
from storage.records import StoredEvent

from .access import authenticated, guard
from .common import json_response
from .context import current_coordinator

bp = Blueprint("events", __name__, url_prefix="/api/coordinator/v1")


def securable(event: StoredEvent, formats: Formats) -> Resource:
    """What a reader must be allowed to read to see `event`: its table's securable, in its format's (the type's
    first word) paths. A name begins with its catalog unless that is "" (Iceberg's without a prefix, Lance's)."""
    name, parts = event.type.split(".", 1)[0], event.data["name"]
    fmt = formats.by_name.get(name)
    if fmt is None:   # a format no longer served: only a grant on everything reaches it
        return table_securable((name, *parts[:-1]), parts[-1])
    return fmt.table(event.catalog, parts[1:-1] if event.catalog else parts[:-1], parts[-1])


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
    principal, coordinator = g.get("principal"), current_coordinator()
    formats = coordinator.formats
    visible = ((lambda e: True) if principal is None else
               (lambda e: principal.may(Privilege.READ, securable(e, formats))))
    feed = coordinator.feed
    return json_response(await feed.read(request.args.get("after"), limit=int(_number("limit", 100, int)),
                                         wait_s=_number("wait", 0.0, float), formats=request.args.getlist("format"),
                                         tables=request.args.getlist("table"), visible=visible))
