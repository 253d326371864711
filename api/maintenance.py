"""Table maintenance over REST, under `/api/coordinator/v1` (docs/maintenance.md).

- `POST /tables/maintain` `{"format", "prefix"?: "", "name": "ns.table", "dry-run": true}` (the format Iceberg's,
  whose snapshots the service expires): 200 with what the table's snapshot-expiry policy expires now and the files
  that would be deleted (dry run), or with what was expired and claimed for deletion (not a dry run, and only on a
  table that opted in).

With authentication on it needs `admin` on everything (`on = "*"`): it deletes files. Errors are the service's own
(`{"error": {"code", "type", "message"}}`).
"""

from __future__ import annotations

from quart import Blueprint, Response

from coordinator.auth import Privilege
from coordinator.errors import BadRequest
from coordinator.iceberg.rows import FORMAT as ICEBERG

from .access import guard
from .common import json_response, read_json
from .context import current_coordinator

bp = Blueprint("maintenance", __name__, url_prefix="/api/coordinator/v1")


def _admin(**_) -> list:
    return [(Privilege.ADMIN, ())]


@bp.post("/tables/maintain")
@guard(_admin)
async def maintain() -> Response:
    body = await read_json()
    if not isinstance(body, dict) or body.get("format", ICEBERG) != ICEBERG:
        raise BadRequest(f'the body must be {{"format": "{ICEBERG}", "name": "namespace.table", '
                         '"dry-run": true|false}')
    name, prefix, dry_run = body.get("name"), body.get("prefix", ""), body.get("dry-run", False)
    if not isinstance(name, str) or "." not in name.strip(".") or not isinstance(prefix, str) \
            or not isinstance(dry_run, bool):
        raise BadRequest('"name" must be "namespace.table" (levels dotted), "prefix" a string and "dry-run" '
                         'true or false')
    *namespace, table = name.split(".")
    report = await current_coordinator().maintainer.maintain(prefix, tuple(namespace), table, dry_run=dry_run)
    return json_response(report.as_dict())
