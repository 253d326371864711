"""What the web console shows, read from the store: warehouses, every format's tables in one tree, a table's
commit history. Read-only; the HTTP pages are api/console.py.

Each format keeps its commit history as the table's log entries in the store: Iceberg one per metadata file
(its version and the file), Delta one per commit (the commit's version, time and file), Lance one per version
(its manifest, time and metadata). The console shows them as they are, newest first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable
from uuid import UUID

from storage.interface import Store
from storage.records import NAMESPACE_SEP, TableRow

from .auth import Resource
from .format import Formats
from .warehouses import Warehouses

TABLES_MAX = 2000  # per catalog: the tree is an overview, not an export
TIME_KEYS = ("timestamp", "timestamp_ms", "commit_timestamp", "created_at", "last-updated-ms", "ts")
# Iceberg's previous metadata file (the entry below names it), Lance's staged manifest (gone once committed)
HIDDEN_KEYS = {"previous", "staging"}


@dataclass
class Warehouse:
    name: str
    root: str


@dataclass
class TableEntry:
    table_id: UUID
    format: str
    catalog: str
    namespace: list[str]
    name: str
    location: str | None

    @property
    def display(self) -> str:
        return ".".join(p for p in (self.catalog, *self.namespace, self.name) if p)


@dataclass
class Catalog:
    format: str
    name: str
    namespaces: dict[str, list[TableEntry]] = field(default_factory=dict)  # dotted namespace -> tables


@dataclass
class HistoryEntry:
    version: int
    time: str | None
    summary: str


def warehouses(known: Warehouses, formats: Formats, may_see: Callable[[Resource], bool],
               shown: list[Catalog]) -> list[Warehouse]:
    """The warehouses the service writes tables under that the caller uses, the default one first: those whose
    catalog in some format (Iceberg's prefix named after the warehouse; the default one's is "") it holds a grant
    in, and those holding a table it may read (`shown`, from `catalogs`)."""
    locations = [t.location for c in shown for tables in c.namespaces.values() for t in tables if t.location]
    holding = {w.name for w in map(known.containing, locations) if w is not None}
    return [Warehouse(w.name, w.location) for w in known.all()
            if w.name in holding or any(may_see(f.container(catalog)) for f in formats
                                        if (catalog := f.warehouse_catalog(w.name)) is not None)]


def _entry(row: TableRow, fmt: str) -> TableEntry:
    levels = row.namespace.split(NAMESPACE_SEP) if row.namespace else []
    return TableEntry(row.table_id, fmt, row.catalog, levels, row.name, row.location)


async def catalogs(store: Store, formats: Formats, may_read: Callable[[Resource], bool]) -> list[Catalog]:
    """Every format's catalogs, namespaces and tables the caller may read, in one tree."""
    out = []
    for fmt in formats:
        for name in await store.list_catalogs(fmt.realm):
            catalog = Catalog(fmt.name, name or "default")
            for row in await store.list_tables(fmt.realm, name, None, kind="table", limit=TABLES_MAX):
                if may_read(fmt.row_securable(row)):
                    entry = _entry(row, fmt.name)
                    catalog.namespaces.setdefault(".".join(entry.namespace), []).append(entry)
            if catalog.namespaces:
                out.append(catalog)
    return out


async def table(store: Store, formats: Formats, table_id: UUID,
                may_read: Callable[[Resource], bool]) -> TableEntry | None:
    row = await store.get_table(table_id)
    fmt = formats.by_realm.get(row.realm) if row is not None else None
    if fmt is None or row.kind != "table" or not may_read(fmt.row_securable(row)):
        return None
    return _entry(row, fmt.name)


async def history(store: Store, table_id: UUID, *, before: int | None, limit: int
                  ) -> tuple[list[HistoryEntry], int | None]:
    """A page of the table's commits, newest first, below version `before`; and the next page's `before`."""
    entries = await store.read_log(table_id, end=None if before is None else before - 1, limit=limit + 1,
                                   descending=True)
    more = len(entries) > limit
    page = [HistoryEntry(e.version, _time_of(e.payload), _summary(e.payload)) for e in entries[:limit]]
    return page, (page[-1].version if more else None)


def _time_of(payload: Any) -> str | None:
    if not isinstance(payload, dict):
        return None
    for key in TIME_KEYS:
        value = payload.get(key)
        if isinstance(value, (int, float)) and value > 0:
            seconds = value / 1000 if value > 10**11 else value  # milliseconds, as the formats keep them
            return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    return None


def _summary(payload: Any, limit: int = 300) -> str:
    """The entry's scalar fields, `key=value`, shortened: what changed, without the whole record."""
    if not isinstance(payload, dict):
        return str(payload)[:limit]
    parts = []
    for key, value in payload.items():
        if key in TIME_KEYS or key in HIDDEN_KEYS or value is None or isinstance(value, (dict, list)):
            continue
        if isinstance(value, str) and "/" in value:
            value = value.rsplit("/", 1)[-1]  # a file's name says enough; its directory is the table's
        parts.append(f"{key}={value}")
    text = ", ".join(parts)
    return text if len(text) <= limit else text[:limit - 1] + "…"

