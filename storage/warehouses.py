"""Rows of the `warehouses` table (storage/migrations/012_warehouses.sql): a name, a root and storage settings.

Storage knows nothing of what the settings mean; coordinator/warehouses.py checks and uses them.
"""

from __future__ import annotations

from typing import Any

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


async def holds_anything(store, name: str, location: str) -> bool:
    """Whether any table lives within `location`, or anything is placed in the warehouse: an Iceberg catalog
    prefix named after it, a Lance namespace whose `warehouse` property names it, a Unity Catalog catalog whose
    storage_root lies in it."""
    if await store.location_taken(location, below=True):
        return True
    return bool(await store.with_connection(lambda con: con.fetchval(
        "SELECT EXISTS (SELECT 1 FROM namespaces WHERE (realm = 'iceberg' AND catalog = $1)"
        " OR (realm = 'lance' AND properties->>'warehouse' = $1)"
        " OR (realm = 'uc-catalog' AND (properties->>'storage_root' = $2"
        "     OR starts_with(properties->>'storage_root', $2 || '/'))))", name, location.rstrip("/"))))
