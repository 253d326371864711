"""Warehouses over REST, under `/api/coordinator/v1/warehouses` (as Polaris and Lakekeeper manage theirs).

- `POST /warehouses` `{"name", "location", "storage": {...}}`: 201 with the warehouse (secret keys masked);
  409 if the name is taken; 400 for a bad location or settings, or a root overlapping another warehouse's.
- `GET /warehouses`: `{"warehouses": [...]}`, the default one (the service's own root) first.
- `GET /warehouses/{name}`: one; 404 if unknown.
- `DELETE /warehouses/{name}`: 204; 409 while it holds a namespace or a table.

With authentication on, each needs `admin` on everything (`on = "*"`): a warehouse decides where any client's
files go and with which credentials. Errors are the service's own (`{"error": {"code", "type", "message"}}`).
"""

from __future__ import annotations

from quart import Blueprint, Response

from coordinator.auth import Privilege

from .access import guard
from .common import empty_response, json_response, read_json
from .context import current_coordinator

bp = Blueprint("warehouses", __name__, url_prefix="/api/coordinator/v1")


def _admin(**_) -> list:
    return [(Privilege.ADMIN, ())]


def _warehouses():
    return current_coordinator().warehouses


@bp.post("/warehouses")
@guard(_admin)
async def create_warehouse() -> Response:
    warehouse = await _warehouses().create(await read_json())
    return json_response(warehouse.public(), 201)


@bp.get("/warehouses")
@guard(_admin)
async def list_warehouses() -> Response:
    await _warehouses().load()
    return json_response({"warehouses": [w.public() for w in _warehouses().all()]})


@bp.get("/warehouses/<name>")
@guard(_admin)
async def get_warehouse(name: str) -> Response:
    return json_response((await _warehouses().get(name)).public())


@bp.delete("/warehouses/<name>")
@guard(_admin)
async def drop_warehouse(name: str) -> Response:
    await _warehouses().drop(name)
    return empty_response()
