"""The Iceberg REST catalog over Unity Catalog's namespace, read-only, where Unity Catalog OSS mounts it:
`/api/2.1/unity-catalog/iceberg`. Clients connect with `uri=http://<host>/api/2.1/unity-catalog/iceberg` and
`warehouse=<UC catalog>`; `/v1/config` answers that catalog's prefix, `catalogs/<catalog>`.

The read routes are `routes.py`'s own handlers, registered here too (`routes(..., reads=True)`; the config
advertises them, `endpoints.READ_ENDPOINTS`), each reading `coordinator.uniform` instead of the Iceberg catalog
and needing the Delta table's grants. This module adds what differs: the config, and the refusal of every write
(a Delta table is committed through Unity Catalog's Delta API, never through Iceberg).
"""

from __future__ import annotations

from quart import Blueprint, Response, request

from coordinator.errors import NoSuchRoute, Unsupported

from ..access import authenticated, guard
from ..common import json_response
from ..context import current_coordinator
from .endpoints import READ_ENDPOINTS, config_defaults

MOUNT = "/api/2.1/unity-catalog/iceberg"
bp = Blueprint("uniform", __name__, url_prefix=MOUNT)

READ_ONLY = ("this Iceberg catalog is read-only: its tables are Delta tables, committed through Unity Catalog's "
             "Delta API (POST /api/2.1/unity-catalog/delta/commit, as Delta's catalog-managed clients do); "
             "write with a Delta client, and read the result here")


@bp.get("/v1/config")
@guard(authenticated)
async def get_config() -> Response:
    coordinator = current_coordinator()
    prefix = await coordinator.uniform.prefix(request.args.get("warehouse"))
    return json_response({"defaults": config_defaults(coordinator, MOUNT), "overrides": {"prefix": prefix},
                          "endpoints": READ_ENDPOINTS})


@bp.route("/<path:rest>", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
@guard(authenticated)
async def other(rest: str) -> Response:
    """Any route the read-only catalog does not serve: a write is refused as one (406, Iceberg's
    UnsupportedOperationException), a read of an unknown path is not found."""
    if request.method in ("GET", "HEAD"):
        raise NoSuchRoute(f"no such route: {request.method} {request.path}")
    raise Unsupported(f"{request.method} {request.path}: {READ_ONLY}")
