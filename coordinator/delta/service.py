"""Unity Catalog for Delta: catalogs, schemas, tables, staging, commits, credentials and metrics, as `api/delta/`
calls them. Names resolve to table ids through `coordinator.names`, and requests are handed to the table actors as
proposals (`proposals.py`). Where things live in the store (all realm-separated from the other formats): `rows.py`.

Every ratified commit is a row of the commit log keyed by version, written in the same statement as the
table row that advances `last`; the actor keeps the unpublished ones in memory, so GET commits never reads
the database.
"""

from __future__ import annotations

import functools
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlparse

from storage import errors as storage_errors
from storage.files import join, unsafe_location
from storage.records import TableRow

from ..auth import CALLER, Resource, table_securable
from ..credentials import VENDED_KEYS_TTL_S, vendable_s3_keys
from ..decision import PlannedPart
from .. import name_limits, reports
from ..errors import (AlreadyExists, AppliedReplyLost, BadRequest, CatalogExists, CatalogNotEmpty, CommitConflict,
                      NamespaceExists, NamespaceNotEmpty, NoSuchCatalog, NoSuchNamespace, NoSuchTable, NotEmpty,
                      NotFound, TableExists, VersionPublished, from_storage)
from ..names import Names
from ..paging import decode_page_token, one_more, page
from . import rules
from .columns import column_infos
from .files import read_first_commit
from .models import (CommitRequest, CreateCatalog, CreateSchema, CreateStagingTable, CreateTable,
                     GenerateTemporaryPathCredential, GenerateTemporaryTableCredential, GetCommitsRequest,
                     MetricsRequest, UpdateCatalogOrSchema)
from .proposals import (CheckMetrics, CheckStaging, Commit, CreateFromStaging, DropTable, GetCommits, LoadTable, Locate,
                        feed_change)
from .rules import FullName
from .rows import CATALOG_REALM, FORMAT, REALM, REPORTS, STAGING_CATALOG
from .state import DeltaTable, StagingTable, freeze, owned, table_info

if TYPE_CHECKING:
    from ..format import Services

MANAGED_DIR = "__unitystorage"
# The service has no authentication yet; UC requires owner fields, so they name nobody in particular.


def now_ms() -> int:
    return int(time.time() * 1000)


def parse_table_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise BadRequest(f"table_id must be a UUID, got {raw!r}") from None


# -- response shapes ---------------------------------------------------------------------------------------------


def catalog_info(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, **entry}


def schema_info(catalog: str, name: str, entry: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "catalog_name": catalog, "full_name": f"{catalog}.{name}", **entry}


def _entry(body: CreateCatalog | CreateSchema, id_field: str) -> dict[str, Any]:
    if body.storage_root is not None:
        raise BadRequest("a schema's storage_root is not supported: its managed tables are placed under its "
                         "catalog's storage_root")
    return {id_field: str(uuid.uuid4()), **owned(body.comment, body.properties, now_ms(), CALLER.get())}


def _no_rename(kind: str, name: str, new_name: str | None) -> None:
    """Renames are refused: a table's full name (and its access grants) would change under its readers."""
    if new_name is not None and new_name != name.rpartition(".")[2]:
        raise BadRequest(f"renaming a {kind} is not supported: {name} keeps its name; send comment or properties "
                         f"only")


def _refuse_unsafe(location: str) -> None:
    unsafe = unsafe_location(location)
    if unsafe is not None:
        raise BadRequest(f"storage_location {location!r} is refused: {unsafe}")


# -- the service -------------------------------------------------------------------------------------------------


def _nothing(reply: object) -> dict:
    return {}


def _gone(full: FullName) -> NoSuchTable:
    return NoSuchTable(f"Table does not exist: {'.'.join(full)}")


class DeltaService:
    def __init__(self, services: Services):
        self.services = services
        self.config = services.config
        self.store = services.store
        self.registry = services.registry
        self.files = services.files
        self.names: Names[FullName, uuid.UUID] = Names(self.registry, self._find, _gone)
        # A table's id -> its place for access checks. Only the Delta API v1.0's renameTable changes the name an id
        # carries, and it forgets the id here (coordinator/delta/v1/service.py).
        self.securables: Names[uuid.UUID, Resource] = Names(self.registry, self._securable_of, _gone)

    @property
    def managed_root(self) -> str:
        return join(self.config.warehouse_uri, MANAGED_DIR, "tables")

    # -- catalogs ----------------------------------------------------------------------------------------------

    async def create_catalog(self, body: CreateCatalog) -> dict[str, Any]:
        name = rules.check_name("catalog", body.name)
        name_limits.check_name("catalog", name)
        root = self._storage_root(body.storage_root) if body.storage_root is not None else None
        entry = _entry(body.model_copy(update={"storage_root": None}), "id")
        if root is not None:
            entry["storage_root"] = root
        try:
            await self.store.create_namespace(CATALOG_REALM, "", name, entry)
        except storage_errors.StorageError as exc:
            if isinstance(from_storage(exc), AlreadyExists):
                raise CatalogExists(f"Catalog already exists: {name}") from None
            raise
        return catalog_info(name, entry)

    async def get_catalog(self, name: str) -> dict[str, Any]:
        entry = await self.store.get_namespace(CATALOG_REALM, "", name)
        if entry is None:
            raise NoSuchCatalog(f"Catalog does not exist: {name}")
        return catalog_info(name, entry)

    async def update_catalog(self, name: str, body: UpdateCatalogOrSchema) -> dict[str, Any]:
        _no_rename("catalog", name, body.new_name)
        entry = await self._update_entry(CATALOG_REALM, "", name, body)
        if entry is None:
            raise NoSuchCatalog(f"Catalog does not exist: {name}")
        return catalog_info(name, entry)

    async def _update_entry(self, realm: str, catalog: str, name: str,
                            body: UpdateCatalogOrSchema) -> dict[str, Any] | None:
        """UC OSS: a comment sent replaces the comment, properties sent replace the properties (an empty map keeps
        them, as UC does). The entry after the change, or None if there is none."""
        updates: dict[str, Any] = {"updated_at": now_ms(), "updated_by": CALLER.get()}
        if body.comment is not None:
            updates["comment"] = body.comment
        if body.properties:
            updates["properties"] = body.properties
        try:
            before = await self.store.update_namespace_properties(realm, catalog, name, [], updates)
        except storage_errors.StorageError as exc:
            if isinstance(from_storage(exc), NotFound):
                return None
            raise
        return {**before, **updates}

    async def list_catalogs(self, page_token: str | None, limit: int) -> tuple[list[dict], str | None]:
        return await self._list_entries(CATALOG_REALM, "", page_token, limit, catalog_info)

    async def _list_entries(self, realm: str, catalog: str, page_token: str | None, limit: int,
                            info: Callable[[str, dict[str, Any]], dict[str, Any]]) -> tuple[list[dict], str | None]:
        """A page of catalogs or schemas (`namespaces` rows), each shaped by `info(name, entry)`."""
        names, nxt = page(await self.store.list_namespaces(realm, catalog, None, after=decode_page_token(page_token),
                                                           limit=one_more(limit)), limit)
        out = []
        for name in names:
            entry = await self.store.get_namespace(realm, catalog, name)
            if entry is not None:  # dropped since the listing
                out.append(info(name, entry))
        return out, nxt

    async def delete_catalog(self, name: str, force: bool) -> None:
        await self.get_catalog(name)
        schemas = await self.store.list_namespaces(REALM, name, None)
        if schemas and not force:
            raise CatalogNotEmpty(f"Catalog {name} is not empty: it has schemas {', '.join(schemas[:5])}; delete "
                                  f"them or pass force=true")
        for schema in schemas:
            await self.delete_schema(name, schema, force=True)
        await self._drop_namespace(CATALOG_REALM, "", name, NoSuchCatalog(f"Catalog does not exist: {name}"),
                                   CatalogNotEmpty(f"Catalog {name} is not empty: a schema was created while it was "
                                                   f"being deleted"), children_realm=REALM)

    async def _drop_namespace(self, realm: str, catalog: str, name: str, missing: NotFound, refilled: NotEmpty,
                              **options) -> None:
        """Drop a catalog's or schema's row; the store's refusals in UC's terms (`missing`, `refilled`)."""
        try:
            await self.store.drop_namespace(realm, catalog, name, **options)
        except storage_errors.StorageError as exc:
            err = from_storage(exc)
            if isinstance(err, NotFound):
                raise missing from None
            if isinstance(err, NotEmpty):
                raise refilled from None
            raise

    # -- schemas -----------------------------------------------------------------------------------------------

    async def create_schema(self, body: CreateSchema) -> dict[str, Any]:
        name = rules.check_name("schema", body.name)
        name_limits.check_name("schema", name)
        entry = _entry(body, "schema_id")
        await self.get_catalog(body.catalog_name)
        try:
            # The catalog's row is locked until the schema is in: a concurrent catalog delete sees it, or wins.
            await self.store.create_namespace(REALM, body.catalog_name, name, entry,
                                              parent=(CATALOG_REALM, "", body.catalog_name))
        except storage_errors.StorageError as exc:
            err = from_storage(exc)
            if isinstance(err, NotFound):
                raise NoSuchCatalog(f"Catalog does not exist: {body.catalog_name}") from None
            if isinstance(err, AlreadyExists):
                raise NamespaceExists(f"Schema already exists: {body.catalog_name}.{name}") from None
            raise
        return schema_info(body.catalog_name, name, entry)

    async def get_schema(self, catalog: str, name: str) -> dict[str, Any]:
        await self.get_catalog(catalog)
        entry = await self.store.get_namespace(REALM, catalog, name)
        if entry is None:
            raise NoSuchNamespace(f"Schema does not exist: {catalog}.{name}")
        return schema_info(catalog, name, entry)

    async def update_schema(self, catalog: str, name: str, body: UpdateCatalogOrSchema) -> dict[str, Any]:
        _no_rename("schema", f"{catalog}.{name}", body.new_name)
        await self.get_catalog(catalog)
        entry = await self._update_entry(REALM, catalog, name, body)
        if entry is None:
            raise NoSuchNamespace(f"Schema does not exist: {catalog}.{name}")
        return schema_info(catalog, name, entry)

    async def list_schemas(self, catalog: str, page_token: str | None, limit: int) -> tuple[list[dict], str | None]:
        await self.get_catalog(catalog)
        return await self._list_entries(REALM, catalog, page_token, limit, functools.partial(schema_info, catalog))

    async def delete_schema(self, catalog: str, name: str, force: bool) -> None:
        await self.get_schema(catalog, name)
        rows = await self.store.list_tables(REALM, catalog, name)
        if rows and not force:
            raise NamespaceNotEmpty(f"Schema {catalog}.{name} is not empty: it has tables "
                                    f"{', '.join(r.name for r in rows[:5])}; delete them or pass force=true")
        # Through the actors, not a cascading DELETE: an actor must never hold state for a row that is gone.
        for row in rows:
            try:
                await self.delete_table((catalog, name, row.name))
            except NotFound:
                pass
        await self._drop_namespace(REALM, catalog, name, NoSuchNamespace(f"Schema does not exist: {catalog}.{name}"),
                                   NamespaceNotEmpty(f"Schema {catalog}.{name} is not empty: a table was created "
                                                     f"while it was being deleted"))

    # -- tables ------------------------------------------------------------------------------------------------

    async def _check_new_name(self, catalog: str, schema: str, name: str) -> str:
        """The name is free in an existing schema; returns the schema's id."""
        rules.check_name("table", name)
        schema_id = (await self.get_schema(catalog, schema))["schema_id"]
        if await self.store.find_table(REALM, catalog, schema, name) is not None:
            raise TableExists(f"Table already exists: {catalog}.{schema}.{name}")
        return schema_id

    def _storage_root(self, root: str) -> str:
        """A catalog's storage_root, where its managed tables go: within a warehouse (whose settings its files
        are written with), spelled as the warehouse spells it."""
        _refuse_unsafe(root)
        root = rules.normalize_uri(root.rstrip("/"))
        warehouse = self.services.warehouses.containing(root)
        if warehouse is None:
            raise BadRequest(f"storage_root {root!r} must lie within a warehouse (GET /api/coordinator/v1/"
                             f"warehouses lists them; create one at that location first)")
        return root

    async def _managed_root(self, catalog: str) -> str:
        root = (await self.get_catalog(catalog)).get("storage_root")
        return join(root, MANAGED_DIR, "tables") if root else self.managed_root

    async def create_staging_table(self, body: CreateStagingTable) -> dict[str, Any]:
        schema_id = await self._check_new_name(body.catalog_name, body.schema_name, body.name)
        table_id = uuid.uuid4()
        location = join(await self._managed_root(body.catalog_name), str(table_id))
        staging = StagingTable(table_id, body.catalog_name, body.schema_name, body.name, location, now_ms(),
                               schema_id, CALLER.get())
        row = TableRow(table_id=table_id, realm=REALM, catalog=STAGING_CATALOG, namespace="", name=str(table_id),
                       format=FORMAT, location=location)
        await self.registry.create(row, state=staging, row_state=staging.row_state())
        return {"name": body.name, "catalog_name": body.catalog_name, "schema_name": body.schema_name,
                "id": str(table_id), "staging_location": location}

    def _staging_id(self, location: str, managed_root: str) -> uuid.UUID:
        _refuse_unsafe(location)
        root = rules.normalize_uri(managed_root)
        loc = rules.normalize_uri(location)
        parent, _, last = loc.rpartition("/")
        if parent != root:
            raise BadRequest(f"storage_location {location!r} of a MANAGED table must be the staging_location "
                             f"returned by POST /staging-tables (under {managed_root})")
        try:
            return uuid.UUID(last)
        except ValueError:
            raise NoSuchTable(f"Staging table does not exist at {location!r}") from None

    async def create_table(self, body: CreateTable) -> dict[str, Any]:
        schema_id = await self._check_new_name(body.catalog_name, body.schema_name, body.name)
        full = (body.catalog_name, body.schema_name, body.name)
        columns = column_infos(body.columns, "columns")
        if body.storage_location is None:
            raise BadRequest("storage_location is required")
        if body.data_source_format is None:
            raise BadRequest("data_source_format is required")
        if body.table_type == "EXTERNAL":
            return await self._create_external(body, full, columns)
        if body.table_type != "MANAGED":
            raise BadRequest(f"table_type {body.table_type} is not supported: MANAGED or EXTERNAL")
        if body.data_source_format != "DELTA":
            raise BadRequest(f"a MANAGED table must have data_source_format DELTA, got {body.data_source_format}")
        table_id = self._staging_id(body.storage_location, await self._managed_root(body.catalog_name))
        # Refuse an unknown or used location before reading anything there; the create re-checks (it may race).
        staging = await self.registry.submit(table_id, CheckStaging(full, body.storage_location, schema_id))
        first = rules.check_first_commit(table_id, await read_first_commit(self.files, staging.location))
        # Seed order: the table at the location first, then its declared features and properties (error (2)).
        rules.check_required_properties(table_id, body.properties, "properties")
        try:
            table = await self.registry.submit(table_id, CreateFromStaging(
                full, body.storage_location, schema_id, first, columns, body.comment, dict(body.properties),
                now_ms(), CALLER.get()))
        except NoSuchNamespace:
            await self.get_schema(body.catalog_name, body.schema_name)  # the schema may have gone since we looked
            raise
        self.names.remember(full, table_id)
        return dict(table.info)

    async def _create_external(self, body: CreateTable, full: FullName, columns: list[dict]) -> dict[str, Any]:
        location = body.storage_location.rstrip("/")
        # The client's own location, but spelled so that every reader resolves it to the same absolute place.
        _refuse_unsafe(location)
        parsed = urlparse(location)
        if not (parsed.path.startswith("/") or (parsed.scheme and parsed.netloc)):
            raise BadRequest(f"storage_location {location!r} must be an absolute path or a URI")
        if rules.is_within(join(self.config.warehouse_uri, MANAGED_DIR), location):
            raise BadRequest(f"storage_location {location!r} of an EXTERNAL table must not be inside the managed "
                             f"storage root")
        if self.services.auth is not None:
            await self._refuse_in_a_warehouse(location)
        table_id = uuid.uuid4()
        info = table_info(table_id, full, "EXTERNAL", body.data_source_format, columns, location, body.comment,
                          dict(body.properties), now_ms(), CALLER.get())
        table = DeltaTable(table_id, freeze(info), last=-1, published=-1, unpublished=(), newest=None)
        row = TableRow(table_id=table_id, realm=REALM, catalog=full[0], namespace=full[1], name=full[2],
                       format=FORMAT, location=location)
        try:
            await self.registry.create(row, state=table, row_state=table.row_state(),
                                       changes=[feed_change("created", table)])
        except NotFound:   # (the create's only not-found: its schema was dropped meanwhile)
            raise NoSuchNamespace(f"Schema does not exist: {full[0]}.{full[1]}") from None
        self.names.remember(full, table_id)
        return dict(table.info)

    async def _refuse_in_a_warehouse(self, location: str) -> None:
        """A warehouse's places belong to namespaces and catalogs under their grants (Iceberg's, Lance's, a
        catalog's storage root); an EXTERNAL table in one, or around one, would claim it (locations are exclusive)
        though a Delta grant does not reach it. Every warehouse, as the database has them now (in a cluster,
        another member may have just created one)."""
        if self.config.cluster:
            await self.services.warehouses.load()
        for w in self.services.warehouses.all():
            if rules.is_within(w.location, location) or rules.is_within(location, w.location):
                raise BadRequest(f"storage_location {location!r} of an EXTERNAL table must lie outside every "
                                 f"warehouse while authentication is on (it overlaps warehouse {w.name!r})")

    async def _find(self, full: FullName) -> uuid.UUID:
        """The id of the table named `full`, from the store (`self.names` caches it): NoSuchTable, or the error of
        the level that is missing."""
        row = await self.store.find_table(REALM, *full)
        if row is None:
            await self.get_schema(full[0], full[1])  # say which level is missing
            raise _gone(full)
        return row.table_id

    async def get_table(self, full: FullName) -> dict[str, Any]:
        table = await self.names.submit(full, lambda: LoadTable(full))
        return dict(table.info)

    async def list_tables(self, catalog: str, schema: str, page_token: str | None,
                          limit: int) -> tuple[list[dict], str | None]:
        await self.get_schema(catalog, schema)
        rows, nxt = page(await self.store.list_tables(REALM, catalog, schema, kind="table",
                                                      after=decode_page_token(page_token), limit=one_more(limit)),
                         limit, cursor=lambda r: r.cursor)
        return [dict(r.state["info"]) for r in rows if "info" in r.state], nxt

    async def delete_table(self, full: FullName) -> None:
        await self.names.submit(full, lambda: DropTable(full, self.store, self.files))
        self.names.forget(full)

    async def securable(self, raw_table_id: str) -> Resource:
        """The table's place for access checks: (FORMAT, catalog, schema, Table(name)), cached (`self.securables`).
        An unknown id (or another protocol's table's: its name must not show in a Delta answer) is placed at the
        root, and not remembered: only a Delta-wide grant lets such a request through (to its 404)."""
        try:
            return await self.securables.ref(parse_table_id(raw_table_id))
        except NoSuchTable:
            return (FORMAT,)

    async def _securable_of(self, table_id: uuid.UUID) -> Resource:
        row = await self.store.get_table(table_id)
        if row is None or row.realm != REALM:  # another format's table's id is no Delta table: unknown
            raise NoSuchTable(f"Table does not exist: {table_id}")
        if row.catalog == STAGING_CATALOG:
            s = row.state.get("staging", {})
            return table_securable((FORMAT, s.get("catalog_name", ""), s.get("schema_name", "")), s.get("name", ""))
        return table_securable((FORMAT, row.catalog, row.namespace), row.name)

    # -- commits -----------------------------------------------------------------------------------------------

    async def plan_commit(self, req: CommitRequest) -> PlannedPart:
        """A commit as a part of a commit that spans tables (a cross-format commit): it answers with nothing."""
        proposal = Commit(req, self.config.delta_max_unpublished_commits, now_ms(),
                          service_publishes=self.config.maintenance_publish_delta)
        return PlannedPart(parse_table_id(req.table_id), proposal, _nothing)

    async def commit(self, req: CommitRequest) -> None:
        planned = await self.plan_commit(req)
        table_id = planned.table_id
        try:
            await self.registry.submit(table_id, planned.proposal)
        except AppliedReplyLost:
            return  # ratified: the answer to a commit carries nothing else
        except VersionPublished as exc:
            # The version was ratified and published long enough ago to have left memory. Ratified commits
            # never change, so the stored log answers whether this is a replay of that very commit.
            v = req.commit_info.version
            entries = await self.store.read_log(table_id, start=v, end=v)
            if entries and entries[0].payload.get("file_name") == req.commit_info.file_name:
                return
            found = entries[0].payload.get("file_name") if entries else "an earlier commit"
            raise CommitConflict(f"{exc.message}; version {v} was ratified as {found}: rebuild the snapshot and "
                                 f"retry at a later version") from None

    async def get_commits(self, req: GetCommitsRequest) -> tuple[list[dict], int]:
        return await self.registry.submit(parse_table_id(req.table_id),
                                          GetCommits(req, self.config.delta_commits_page_size))

    # -- credentials and metrics -------------------------------------------------------------------------------

    async def temporary_table_credentials(self, req: GenerateTemporaryTableCredential) -> dict[str, Any]:
        location = await self.registry.submit(parse_table_id(req.table_id), Locate(req.table_id))
        return rules.temporary_credentials(location, req.operation, self._s3_keys(location), _expiration_ms())

    async def temporary_path_credentials(self, req: GenerateTemporaryPathCredential) -> dict[str, Any]:
        return rules.temporary_credentials(req.url, req.operation, self._s3_keys(req.url), _expiration_ms())

    def _s3_keys(self, location: str):
        # Normalized first: Delta's Hadoop client spells the warehouse's s3:// as s3a://.
        return vendable_s3_keys(self.services.warehouses, self.services.auth is not None, rules.normalize_uri(location))

    async def write_metrics(self, req: MetricsRequest) -> None:
        """Keep a commit's metrics (bounded: coordinator/reports.py)."""
        table_id = parse_table_id(req.table_id)
        await self.registry.submit(table_id, CheckMetrics(req))
        report = req.report.commit_report if req.report is not None else None
        if report is None:
            return
        await reports.keep(self.store, self.config, REPORTS, table_id, report.commit_version,
                           report.model_dump(exclude_none=True))


def _expiration_ms() -> int:
    """When vended credentials are to be asked for again (UC's `expiration_time`, epoch ms)."""
    return int((time.time() + VENDED_KEYS_TTL_S) * 1000)
