"""Rows of the `warehouses` table (storage/migrations/012_warehouses.sql): a name, a root and storage settings.

Storage knows nothing of what the settings mean; coordinator/warehouses.py checks and uses them.
"""

from __future__ import annotations

from typing import Any

from .records import WarehouseUse

WarehouseRow = tuple[str, str, dict[str, Any]]   # (name, location, storage settings)


def _row(r) -> WarehouseRow:
    return r["name"], r["location"], dict(r["storage"])


async def list_warehouses(store) -> list[WarehouseRow]:
    rows = await store.with_connection(
        lambda con: con.fetch("SELECT name, location, storage FROM warehouses ORDER BY name"))
    return [_row(r) for r in rows]


async def get_warehouse(store, name: str) -> WarehouseRow | None:
    row = await store.with_connection(lambda con: con.fetchrow(
        "SELECT name, location, storage FROM warehouses WHERE name = $1", name))
    return _row(row) if row is not None else None


async def insert_warehouse(store, name: str, location: str, storage: dict[str, Any]) -> bool:
    """Store a new warehouse; False if the name or the location is taken."""
    async def q(con):
        return await con.fetchval(
            "INSERT INTO warehouses (name, location, storage) VALUES ($1, $2, $3)"
            " ON CONFLICT DO NOTHING RETURNING true", name, location, storage)
    return bool(await store.with_connection(q))


async def delete_warehouse(store, name: str) -> bool:
    return await store.with_connection(lambda con: con.fetchval(
        "DELETE FROM warehouses WHERE name = $1 RETURNING true", name)) is not None


async def holds_anything(store, name: str, location: str, uses: list[WarehouseUse]) -> bool:
    """Whether any table lives within `location`, or anything is placed in the warehouse `name` in one of the ways
    the formats `uses` it (a catalog named after it, a namespace whose property names it or whose property is a
    root within it)."""
    if await store.location_taken(location, below=True):
        return True
    args: list[Any] = []

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}::text"
    found = []
    for use in uses:
        realm = f"realm = {arg(use.realm)}"
        if use.catalog:
            found.append(f"({realm} AND catalog = {arg(name)})")
        if use.named_by is not None:
            found.append(f"({realm} AND properties->>{arg(use.named_by)} = {arg(name)})")
        if use.root_within is not None:
            key, root = f"properties->>{arg(use.root_within)}", arg(location.rstrip("/"))
            found.append(f"({realm} AND ({key} = {root} OR starts_with({key}, {root} || '/')))")
    if not found:
        return False
    return bool(await store.with_connection(lambda con: con.fetchval(
        f"SELECT EXISTS (SELECT 1 FROM namespaces WHERE {' OR '.join(found)})", *args)))
