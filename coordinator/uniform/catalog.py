"""The Iceberg REST catalog over Unity Catalog's namespace, read-only, as Unity Catalog OSS mounts it at
`/api/2.1/unity-catalog/iceberg`: a UC catalog is a prefix (`catalogs/<name>`, the warehouse clients name), its
schemas are the namespaces (one level), and its Delta tables that have Iceberg metadata (`tables.served`) are the
tables. `api/iceberg/` serves it with the very handlers that read this service's own Iceberg catalog; this class
answers them the way `IcebergService` does. Writes go through Unity Catalog's Delta API only.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, Callable

import trio

from storage import errors as storage_errors
from storage.records import TableRow

from coordinator import reports
from coordinator.credentials import vendable_s3_keys
from coordinator.delta import DeltaTable
from coordinator.delta.proposals import LoadTable
from coordinator.delta.rows import REALM as UC_REALM   # where Unity Catalog's tables live
from coordinator.delta.state import catalog_view
from coordinator.errors import BadRequest, NoSuchNamespace, NoSuchTable, Unavailable, Unsupported
from coordinator.iceberg.rows import REPORTS as ICEBERG_REPORTS
from coordinator.iceberg.service import storage_credentials
from coordinator.iceberg.state import IcebergTable, TableIdent
from coordinator.names import Names
from coordinator.paging import decode_page_token, page

from .metadata import Kept, MetadataCache
from .tables import Served, has_iceberg, served

if TYPE_CHECKING:
    from coordinator.delta.service import DeltaService
    from coordinator.format import Services

log = logging.getLogger(__name__)


def _gone(full: tuple[str, str, str]) -> NoSuchTable:
    return NoSuchTable(f"Table does not exist: {full[1]}.{full[2]}")

PREFIX_BASE = "catalogs/"   # Unity Catalog OSS: the prefix of catalog `c` is `catalogs/c`
# Metadata files read from storage and checked at once (a worker thread each, holding the GIL while it parses):
# what loads of tables whose file is not in memory may hold, whatever their number, is this many files.
READS_AT_ONCE = 2


class UniformCatalog:
    def __init__(self, services: Services, delta: DeltaService):
        self.services = services
        self.delta = delta
        self.store = services.store
        self.files = services.files
        self.max_metadata_bytes = services.config.uniform_max_metadata_bytes
        # The file each table is served from (each is written once: its name is its content), bounded by bytes.
        self.kept = MetadataCache(services.config.uniform_cache_bytes)
        self._reads = trio.CapacityLimiter(READS_AT_ONCE)
        services.metrics.add_gauges(lambda: {"coordinator_uniform_metadata_cached_bytes": self.kept.bytes})
        # (catalog, schema, table) -> the Delta table's id, cached: readers poll tables
        self.names: Names[tuple[str, str, str]] = Names(services.registry, self._find, _gone)
        # Told of each table loaded here that this member owns: the service's own conversions (converter.py, which
        # reads this catalog's metadata) queue it if it is behind.
        self.loaded: Callable[[uuid.UUID, DeltaTable], None] | None = None

    # -- config and namespaces ---------------------------------------------------------------------------------

    async def prefix(self, warehouse: str | None) -> str:
        """`GET /v1/config?warehouse=<UC catalog>`: the prefix of that catalog, which must exist."""
        if not warehouse:
            raise BadRequest("warehouse is required: name the Unity Catalog catalog to read (warehouse=<catalog>)")
        await self.delta.get_catalog(warehouse)
        return PREFIX_BASE + warehouse

    async def load_namespace(self, catalog: str, namespace: tuple[str, ...]) -> dict[str, str]:
        schema = self._schema(namespace)
        try:
            return dict((await self.delta.get_schema(catalog, schema)).get("properties") or {})
        except NoSuchNamespace:
            raise NoSuchNamespace(f"Namespace does not exist: {schema} (no schema {catalog}.{schema})") from None

    async def list_namespaces(self, catalog: str, parent: tuple[str, ...], page_token: str | None,
                              page_size: int | None) -> tuple[list[tuple[str, ...]], str | None]:
        """Unity Catalog's schemas are one level deep: a schema has no namespaces below it."""
        if parent:
            await self.load_namespace(catalog, parent)
            return [], None
        schemas, nxt = await self.delta.list_schemas(catalog, page_token, page_size)
        return [(s["name"],) for s in schemas], nxt

    def _schema(self, namespace: tuple[str, ...]) -> str:
        if len(namespace) != 1:
            raise NoSuchNamespace(f"Namespace does not exist: {'.'.join(namespace)} (Unity Catalog's schemas are one "
                                  f"level deep)")
        return namespace[0]

    # -- tables ------------------------------------------------------------------------------------------------

    async def list_tables(self, catalog: str, namespace: tuple[str, ...], page_token: str | None,
                          page_size: int | None, kind: str = "table") -> tuple[list[TableIdent], str | None]:
        """The schema's Delta tables that have Iceberg metadata, in name order. Pages are filled from as many of
        the schema's rows as it takes (most may be Delta-only); no views."""
        await self.load_namespace(catalog, namespace)
        if kind != "table":
            return [], None
        schema = self._schema(namespace)
        after = decode_page_token(page_token, "pageToken")
        found: list[TableRow] = []
        while page_size is None or len(found) <= page_size:
            want = None if page_size is None else max(page_size + 1 - len(found), 50)
            rows = await self.store.list_tables(UC_REALM, catalog, schema, kind="table", after=after, limit=want)
            found += [row for row in rows if (table := catalog_view(row)) is not None and has_iceberg(table)]
            if want is None or len(rows) < want:
                break
            after = rows[-1].cursor
        rows, nxt = page(found, page_size, lambda row: row.cursor)
        return [TableIdent(catalog, namespace, row.name) for row in rows], nxt

    async def load_table(self, ident: TableIdent) -> IcebergTable:
        table = await self._delta_table(ident)
        if self.loaded is not None and self.services.registry.owns(table.table_id):
            self.loaded(table.table_id, table)   # (a table created on another member, say)
        return await self._read(ident, table, served(table))

    async def metadata_file(self, table_id: uuid.UUID, location: str, within: str) -> bytes:
        """A metadata file's bytes (the converter's starting point), from memory if it was served or written."""
        kept = self.kept.get(table_id, location)
        return kept.data if kept is not None else await self.files.read(location, within=within)

    def remember(self, table_id: uuid.UUID, location: str, data: bytes, refs: bytes) -> None:
        """A metadata file just written by the converter, with its refs form (made by the worker): served without
        reading it back or parsing it."""
        self.kept.put(table_id, Kept(location, data, data if refs == data else refs))

    async def _delta_table(self, ident: TableIdent) -> DeltaTable:
        full = (ident.catalog, self._schema(ident.namespace), ident.name)
        return await self.names.submit(full, lambda: LoadTable(full))

    async def _find(self, full: tuple[str, str, str]) -> uuid.UUID:
        row = await self.store.find_table(UC_REALM, *full)
        if row is None or row.kind != "table":
            await self.load_namespace(full[0], (full[1],))   # (which level is missing)
            raise _gone(full)
        return row.table_id

    async def _read(self, ident: TableIdent, table: DeltaTable, view: Served) -> IcebergTable:
        """The served metadata file, read and checked once (a metadata file never changes) and kept; read only from
        within the table's location without following a link there, and only up to `uniform_max_metadata_bytes`."""
        location = view.metadata_location
        kept = self.kept.get(table.table_id, location)
        if kept is None:
            async with self._reads:
                kept = self.kept.get(table.table_id, location)   # (read by another load meanwhile)
                if kept is None:
                    kept = await self._read_file(ident, table, view)
                    self.kept.put(table.table_id, kept)
        return kept.table(ident)

    async def _read_file(self, ident: TableIdent, table: DeltaTable, view: Served) -> Kept:
        location = view.metadata_location
        try:
            size = await self.files.size(location, within=table.location)
            if size is not None and size > self.max_metadata_bytes:
                raise Unsupported(f"{ident} cannot be read as Iceberg: its metadata file {location} (written by the "
                                  f"{view.by}) has {size} bytes, more than the {self.max_metadata_bytes} this "
                                  f"service serves (uniform_max_metadata_bytes). The Delta table itself is "
                                  f"unaffected; read it through Unity Catalog's Delta API")
            data = await self.files.read(location, within=table.location)
            if len(data) > self.max_metadata_bytes:
                raise storage_errors.FileRefused(f"it has grown to more than {self.max_metadata_bytes} bytes")
            return await trio.to_thread.run_sync(Kept.parse, location, data)
        except (storage_errors.FileMissing, storage_errors.FileRefused, ValueError) as exc:
            log.error("%s: Iceberg metadata %s cannot be read: %s", ident, location, exc)
            raise Unavailable(f"{ident}'s Iceberg metadata file {location} (written by the {view.by}) cannot be "
                              f"read: {exc}", retry_after_s=30) from None

    async def credentials(self, ident: TableIdent) -> list[dict[str, Any]]:
        """As Iceberg's `/credentials`: the keys of the warehouse the Delta table lies in, while authentication is
        off (see coordinator.credentials); only for a table the endpoint serves."""
        table = await self._delta_table(ident)
        served(table)
        keys = vendable_s3_keys(self.services.warehouses, self.services.auth is not None, table.location)
        return storage_credentials(table.location, keys)

    async def report_metrics(self, ident: TableIdent, report: dict[str, Any]) -> None:
        """An engine's scan report, kept with the Delta table's id as Iceberg's reports are with theirs."""
        await reports.keep(self.store, self.services.config, ICEBERG_REPORTS, (await self._delta_table(ident)).table_id,
                           report["report-type"], report)
