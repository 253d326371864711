"""The Iceberg REST catalog's operations (`IcebergService`, what `api/iceberg/` calls), behind the HTTP layer and
in front of the table actors: namespaces, tables, views, multi-table transactions, credentials, metrics reports.

Namespaces are plain rows (no commit sequencing needed). Every table operation that reads or changes a table's
metadata is a proposal to that table's actor (`proposals.py`); a table that does not exist yet (create, register,
the stage-create + `assert-create` commit) is inserted through the registry's `create`, where the unique name is
the compare-and-set. Names resolve to table ids through `coordinator.names`.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import orjson

from storage.errors import NamespaceMissing
from storage.files import is_below, is_within, join, path_segment
from storage.records import NAMESPACE_SEP, join_namespace

from coordinator.credentials import vendable_s3_keys
from coordinator.decision import PlannedPart
from coordinator import name_limits, reports
from coordinator.errors import (AlreadyExists, AppliedReplyLost, BadRequest, CommitConflict, NoSuchNamespace,
                                NoSuchTable, NoSuchView, NotFound, Unprocessable, LocationTaken)
from coordinator.idempotency import IdempotencyKey
from coordinator.names import Names
from coordinator.paging import decode_page_token, one_more, page
from coordinator.placement import check_namespace_directory_free, check_no_namespace_inside

from . import rebase
from .changes import SetLocationUpdate
from .files import read_registered
from .models import answer_json
from .proposals import CommitTable, DropTable, LoadTable, RenameTable, ReplaceView, creation, idempotency_record, now_ms
from .rules import apply_commit, check_requirements, check_view_requirements, new_table_metadata, new_view_metadata
from .rules.catalog import check_name, check_namespace, creates_table, format_version, location_refused, name_taken
from .rows import FORMAT, REALM, REPORTS
from .state import IcebergTable, TableIdent

if TYPE_CHECKING:
    from coordinator.format import Services

log = logging.getLogger(__name__)


def _no_namespace(namespace: tuple[str, ...]) -> NoSuchNamespace:
    return NoSuchNamespace(f"Namespace does not exist: {'.'.join(namespace)}")


def _gone(name: tuple[TableIdent, str]) -> NotFound:
    """A table or view that does not exist (or no longer under this name)."""
    ident, kind = name
    return (NoSuchView if kind == "view" else NoSuchTable)(f"{kind.capitalize()} does not exist: {ident}")


def _metadata_location(table: IcebergTable) -> dict[str, str]:
    return {"metadata-location": table.metadata_location}


def storage_credentials(location: str, keys) -> list[dict[str, Any]]:
    """`/credentials`' `storage-credentials` for a table at `location`: vended S3 keys (`vendable_s3_keys`) in
    Iceberg's FileIO property names, or none."""
    if keys is None:
        return []
    config = {"s3.access-key-id": keys["access_key_id"], "s3.secret-access-key": keys["secret_access_key"]}
    for ours, theirs in (("endpoint", "s3.endpoint"), ("region", "client.region"),
                         ("session_token", "s3.session-token")):
        if ours in keys:
            config[theirs] = keys[ours]
    return [{"prefix": location, "config": config}]


class IcebergService:
    def __init__(self, services: Services):
        self.services = services
        self.store = services.store
        self.registry = services.registry
        self.files = services.files
        # (ident, kind) -> table id: a table and a view may not share a name, but a name looked up as one kind
        # must not find the other
        self.names: Names[tuple[TableIdent, str], uuid.UUID] = Names(self.registry, self._find, _gone)

    @property
    def warehouse(self) -> str:
        return self.services.config.warehouse_uri

    def root(self, catalog: str) -> str:
        """Where a catalog prefix's tables lie: the root of the warehouse it names, else the default warehouse
        (whose prefixes each have a directory there, `namespace_dir`)."""
        return self.services.warehouses.root(catalog) or self.warehouse

    # -- namespaces --------------------------------------------------------------------------------------------

    async def create_namespace(self, catalog: str, namespace: tuple[str, ...], properties: dict[str, str],
                               idempotency_key: IdempotencyKey | None = None) -> dict[str, Any]:
        check_namespace(namespace)
        name_limits.check_namespace(namespace)
        if catalog:
            name_limits.check_name("catalog", catalog)
        result = {"namespace": list(namespace), "properties": properties}
        record = idempotency_key.record(200, orjson.dumps(result)) if idempotency_key else None
        # The parent is checked and share-locked in the insert itself (not looked up before): a concurrent drop of
        # it either sees this child and refuses, or comes first and this fails. A child without its parent would
        # be unreachable: no listing leads to it.
        parent = (REALM, catalog, join_namespace(namespace[:-1])) if len(namespace) > 1 else None
        await check_namespace_directory_free(self.store, self.namespace_dir(TableIdent(catalog, namespace, "")),
                                             ".".join(namespace))
        try:
            await self.store.create_namespace(REALM, catalog, join_namespace(namespace), properties, record,
                                              parent=parent)
        except NamespaceMissing:
            raise NoSuchNamespace(f"Parent namespace does not exist: {'.'.join(namespace[:-1])}; create it before "
                                  f"{'.'.join(namespace)}") from None
        return result

    async def load_namespace(self, catalog: str, namespace: tuple[str, ...]) -> dict[str, str]:
        props = await self.store.get_namespace(REALM, catalog, join_namespace(namespace))
        if props is None:
            raise _no_namespace(namespace)
        return props

    async def list_namespaces(self, catalog: str, parent: tuple[str, ...], page_token: str | None,
                              page_size: int | None) -> tuple[list[tuple[str, ...]], str | None]:
        if parent:
            await self.load_namespace(catalog, parent)
        paths = await self.store.list_namespaces(REALM, catalog, join_namespace(parent),
                                                 after=decode_page_token(page_token, "pageToken"),
                                                 limit=one_more(page_size))
        paths, nxt = page(paths, page_size)
        return [tuple(p.split(NAMESPACE_SEP)) for p in paths], nxt

    async def drop_namespace(self, catalog: str, namespace: tuple[str, ...],
                             idempotency_key: IdempotencyKey | None = None) -> None:
        record = idempotency_key.record(204) if idempotency_key else None
        try:
            await self.store.drop_namespace(REALM, catalog, join_namespace(namespace), idempotency=record)
        except NamespaceMissing:
            raise _no_namespace(namespace) from None

    async def update_namespace_properties(self, catalog: str, namespace: tuple[str, ...], removals: list[str],
                                          updates: dict[str, str],
                                          idempotency_key: IdempotencyKey | None = None) -> dict[str, list[str]]:
        overlap = set(removals) & set(updates)
        if overlap:
            raise Unprocessable(f"properties both updated and removed: {sorted(overlap)}")
        # The answer depends on the properties before the change; it is recorded with the change, so the
        # record is finished inside the store's transaction from `before`.
        before = await self.load_namespace(catalog, namespace)
        # `missing` is optional in the spec, but pyiceberg requires it and Java's handlers always send it.
        result = {"updated": sorted(updates), "removed": sorted(k for k in removals if k in before),
                  "missing": sorted(k for k in removals if k not in before)}
        record = idempotency_key.record(200, orjson.dumps(result)) if idempotency_key else None
        try:
            await self.store.update_namespace_properties(REALM, catalog, join_namespace(namespace), removals,
                                                         updates, record)
        except NamespaceMissing:   # dropped meanwhile
            raise _no_namespace(namespace) from None
        return result

    # -- tables ------------------------------------------------------------------------------------------------

    async def list_tables(self, catalog: str, namespace: tuple[str, ...], page_token: str | None,
                          page_size: int | None, kind: str = "table") -> tuple[list[TableIdent], str | None]:
        await self.load_namespace(catalog, namespace)
        rows = await self.store.list_tables(REALM, catalog, join_namespace(namespace), kind=kind,
                                            after=decode_page_token(page_token, "pageToken"),
                                            limit=one_more(page_size))
        rows, nxt = page(rows, page_size, lambda row: row.cursor)
        idents = [TableIdent(catalog, namespace, r.name) for r in rows]
        return idents, nxt

    async def _find(self, name: tuple[TableIdent, str]) -> uuid.UUID:
        """The id of the table or view `name` denotes, from the store (`self.names` caches it)."""
        ident, kind = name
        row = await self.store.find_table(REALM, ident.catalog, ident.ns_path, ident.name)
        if row is None or row.kind != kind:
            raise _gone(name)
        return row.table_id

    async def _resolve(self, ident: TableIdent, kind: str = "table") -> uuid.UUID:
        return await self.names.id((ident, kind))

    async def _submit(self, ident: TableIdent, make_proposal, kind: str = "table") -> Any:
        """Hand the proposal to the named table's (or view's) actor; the name is resolved again once if it moved."""
        return await self.names.submit((ident, kind), make_proposal)

    async def load_table(self, ident: TableIdent) -> IcebergTable:
        return await self._submit(ident, lambda: LoadTable(ident))

    async def replay(self, route: str, metadata_location: str,
                     current: Callable[[], Awaitable[IcebergTable]]) -> bytes:
        """A finalized table or view answer, from the metadata file it named. If that file is gone (removed by
        `write.metadata.delete-after-commit.enabled`, or purged), from `current()`: the spec lets a replay
        "reflect a newer state of the catalog" (Idempotency-Key)."""
        try:
            return answer_json(route, metadata_location, await self.files.read(metadata_location))
        except Exception as exc:  # noqa: BLE001 - missing, or unreadable in the object store: either way, rebuild
            log.info("replaying %s from the current state: its metadata file %s is unreadable (%s)",
                     route, metadata_location, exc)
        table = await current()
        return answer_json(route, table.metadata_location, table.metadata_json)

    def namespace_dir(self, ident: TableIdent) -> str:
        # Names become directory names only through path_segment: a namespace `..` or a prefix `%2e%2e` must not
        # lead out of the warehouse, and `?` or `#` must not cut the URI short. A prefix's directory ends in `~`,
        # which no namespace level's does: prefix `x` with namespace `n` and namespace `x.n` are two places.
        own_root = self.services.warehouses.root(ident.catalog)
        if own_root is not None:   # a warehouse's prefix: its namespaces are the top directories of its root
            return join(own_root, *(path_segment(level) for level in ident.namespace))
        prefix = [path_segment(ident.catalog) + "~"] if ident.catalog else []
        return join(self.warehouse, *prefix, *(path_segment(level) for level in ident.namespace))

    def default_location(self, ident: TableIdent, table_uuid: str) -> str:
        """A directory of the table's own, named after a table-uuid generated by the service (never the client's:
        a directory no table had before)."""
        name = f"{path_segment(ident.name)}-{uuid.UUID(table_uuid).hex}"
        return self.check_location(join(self.namespace_dir(ident), name), catalog=ident.catalog)

    def check_location(self, location: str, ident: TableIdent | None = None, catalog: str | None = None) -> str:
        """A place for `ident`'s files: below the warehouse (never the warehouse itself, which would hold every
        other table) and, with authentication on, inside its namespace's directory, so that a client's files stay
        where its namespace grants reach: one with `create` in one namespace cannot claim, or read through a
        register, another namespace's place."""
        location = location.rstrip("/")
        root = self.root(ident.catalog if ident is not None else catalog or "")
        if not is_below(root, location):
            raise location_refused(location, root)
        if ident is not None and self.services.auth is not None:
            own = self.namespace_dir(ident)
            if not is_below(own, location):
                raise BadRequest(f"location {location!r} must lie inside {own}, the directory of the namespace "
                                 f"{'.'.join(ident.namespace)}: with authentication on, a table's files stay "
                                 f"where its namespace's grants reach")
        return location

    async def _check_chosen(self, location: str, ident: TableIdent) -> str:
        """A location the client chose: `check_location`, and neither a namespace's directory nor one holding such
        a directory (coordinator/placement.py), where every table placed by default would overlap it."""
        location = self.check_location(location, ident)
        own_root = self.services.warehouses.root(ident.catalog) is not None
        await check_no_namespace_inside(self.store, self.services.formats, self.root(ident.catalog), location,
                                        own=(REALM, ident.catalog), own_root=ident.catalog if own_root else None)
        return location

    async def _check_creatable(self, ident: TableIdent) -> None:
        """A new table or view (created, registered or renamed to) needs a valid name in an existing namespace."""
        check_name(ident.name)
        await self.load_namespace(ident.catalog, ident.namespace)

    async def create_table(self, ident: TableIdent, *, schema: dict, location: str | None,
                           partition_spec: dict | None, write_order: dict | None, properties: dict[str, str],
                           stage_create: bool, idempotency_key: IdempotencyKey | None = None) -> IcebergTable:
        await self._check_creatable(ident)
        table_uuid = str(uuid.uuid4())
        owns = not location
        location = await self._check_chosen(location, ident) if location else self.default_location(ident, table_uuid)
        properties = rebase.with_default(properties, self.services.config.rebase_appends)
        metadata = new_table_metadata(location=location, schema=schema, partition_spec=partition_spec,
                                      sort_order=write_order, properties=properties,
                                      format_version=format_version(properties), table_uuid=table_uuid,
                                      now_ms=now_ms())
        if stage_create:
            # Nothing is written: the client commits the table later with `assert-create`.
            return IcebergTable(ident, metadata, "", orjson.dumps(metadata))
        return await self._insert(ident, metadata, table_uuid, idempotency_key, owns_location=owns)

    async def _insert(self, ident: TableIdent, metadata: dict, table_uuid: str,
                      idempotency_key: IdempotencyKey | None, metadata_location: str | None = None,
                      kind: str = "table", owns_location: bool = False) -> IcebergTable:
        new = creation(ident, metadata, table_uuid, metadata_location, kind, owns_location)
        try:
            await self.registry.create(new.row, state=new.state, row_state=new.row_state, log_entries=new.log,
                                       files=new.files, idempotency=idempotency_record(idempotency_key, 200, new.state),
                                       changes=new.changes)
        except AlreadyExists:
            row = await self.store.find_table(REALM, ident.catalog, ident.ns_path, ident.name)
            raise name_taken(row, ident, kind) from None
        except NotFound:   # the create's only not-found: its namespace was dropped meanwhile
            raise _no_namespace(ident.namespace) from None
        self.names.remember((ident, kind), new.row.table_id)
        return new.state

    async def register_table(self, ident: TableIdent, metadata_location: str,
                             idempotency_key: IdempotencyKey | None = None) -> IcebergTable:
        await self._check_creatable(ident)
        # Only files in the warehouse are read (the answer would otherwise tell which files exist anywhere the
        # service can read), and only tables located there are taken (their commits write metadata there).
        self.check_location(metadata_location, ident)
        own = self.namespace_dir(ident)
        within = own if is_below(own, metadata_location) else self.root(ident.catalog)
        metadata = await read_registered(self.files, metadata_location, within)
        await self._check_chosen(metadata["location"], ident)
        return await self._insert(ident, metadata, metadata["table-uuid"], idempotency_key,
                                  metadata_location=metadata_location)

    async def commit_table(self, ident: TableIdent, requirements: list, updates: list,
                           idempotency_key: IdempotencyKey | None = None) -> IcebergTable:
        if creates_table(requirements):
            return await self._commit_create(ident, requirements, updates, idempotency_key)
        await self._check_relocation(ident, requirements, updates)
        async def proposal(table_id: uuid.UUID, read: dict[int | None, rebase.ReadLists]) -> CommitTable:
            if None not in read:   # (the first offer: nothing asked for yet)
                ahead = await rebase.read_ahead(self.files, self.registry.ahead(table_id), requirements, updates)
                read.update({None: ahead} if ahead is not None else {})
            return CommitTable(ident, requirements, updates, idempotency_key, self.files, self.root(ident.catalog),
                               read.get(None))
        try:
            return await self._rebasing(lambda read: self.names.submit_to(
                (ident, "table"), lambda table_id: proposal(table_id, read)))
        except AppliedReplyLost:
            # Applied, but the owner's answer was lost: the table as it is now includes this commit (and perhaps
            # later ones), which is what a client refreshes to after a commit anyway.
            return await self.load_table(ident)

    async def _rebasing(self, offer: Callable[[dict[int | None, rebase.ReadLists]], Awaitable[Any]],
                        read: dict[int | None, rebase.ReadLists] | None = None) -> Any:
        """`offer(read)`, offered again with what an append's rebase needs read (coordinator/iceberg/rebase.py) for
        as long as an actor asks for it, a bounded number of times. `read` holds it by the part of a transaction it
        is for (None: a table's own commit), from the start what was read ahead (`rebase.read_ahead`)."""
        read = {} if read is None else read
        while True:
            try:
                answer = await offer(read)
            except rebase.RebaseNeeded as needed:
                read[needed.part] = await rebase.read_for_rebase(self.files, needed, read.get(needed.part))
                continue
            if read:
                self.services.metrics.rebased.labels(FORMAT).inc(len(read))
            return answer

    async def _check_relocation(self, ident: TableIdent, requirements: list, updates: list,
                                kind: str = "table") -> None:
        """`set-location` onto, above or below another table's location: refused before any file is written
        there (the write checks again, under the lock every placement takes). The requirements are checked
        first, against the state now (the actor checks them again): as in Java's `CatalogHandlers.commit`, a
        failed requirement (409, refresh and retry) is the answer before anything the updates get wrong."""
        moves = [u for u in updates if isinstance(u, SetLocationUpdate) and is_within(self.root(ident.catalog), u.location)]
        if moves and requirements:   # (the others: no move, or one the commit itself refuses)
            if kind == "table":
                check_requirements((await self.load_table(ident)).metadata, requirements)
            else:
                check_view_requirements((await self.load_view(ident)).metadata, requirements)
        for u in moves:
            await self._check_chosen(u.location, ident)
            if await self.store.location_taken(u.location, exclude=await self._resolve(ident, kind)):
                raise LocationTaken(u.location)

    async def _commit_create(self, ident: TableIdent, requirements: list, updates: list,
                             idempotency_key: IdempotencyKey | None) -> IcebergTable:
        """The create transaction (stage-create, then commit with `assert-create`): the table must not exist."""
        metadata, owns = await self._create_transaction_metadata(ident, requirements, updates)
        return await self._insert(ident, metadata, metadata["table-uuid"], idempotency_key, owns_location=owns)

    async def _create_transaction_metadata(self, ident: TableIdent, requirements: list, updates: list
                                           ) -> tuple[dict, bool]:
        """The new table's metadata: at the location the updates set (which must be in the warehouse), else at
        the default location; and whether it is the default one (IcebergTable.owns_location). A location the
        updates set is the client's, even the one a stage-create handed out: it may have chosen it again."""
        await self._check_creatable(ident)
        await self._check_absent(ident)
        generated = str(uuid.uuid4())
        metadata = apply_commit(None, requirements, updates, base_location=None, now_ms=now_ms(),
                                table_uuid=generated)
        metadata["properties"] = rebase.with_default(metadata["properties"], self.services.config.rebase_appends)
        if not metadata.get("location"):
            # Named after the uuid generated here, never one the client assigned: a table dropped without purge
            # may have left its files in the directory named after its own.
            return {**metadata, "location": self.default_location(ident, generated)}, True
        await self._check_chosen(metadata["location"], ident)
        return metadata, False

    async def _check_absent(self, ident: TableIdent) -> None:
        """`assert-create` is a requirement, checked against the name as it is before any update is looked at
        (Java `CatalogHandlers.create`): on a table that exists it fails 409 CommitFailed whatever the updates
        say, not 400 over metadata the updates leave incomplete. (A create that loses a race for the name after
        this is refused AlreadyExists at the insert, as Java's commit of a new table is.)"""
        row = await self.store.find_table(REALM, ident.catalog, ident.ns_path, ident.name)
        if row is None:
            return
        if row.kind == "table":
            raise CommitConflict("Requirement failed: table already exists")
        raise name_taken(row, ident, "table")

    async def commit_transaction(self, changes: list[tuple[TableIdent, list, list]],
                                 idempotency_key: IdempotencyKey | None = None) -> None:
        """All table changes apply atomically or none do (coordinator.transaction); `assert-create` changes
        create their table in the same database transaction."""
        if len(changes) > 1:
            await self._check_requirements_first(changes)
        parts, creates = [], []
        for ident, requirements, updates in changes:
            if creates_table(requirements):
                # (Its files are written only once the commit found its location free: coordinator/commit.py.)
                metadata, owns = await self._create_transaction_metadata(ident, requirements, updates)
                creates.append(creation(ident, metadata, metadata["table-uuid"], owns_location=owns))
            else:
                planned = await self.plan_commit(ident, requirements, updates)
                parts.append((planned.table_id, planned.proposal))
        record = idempotency_key.record(204) if idempotency_key else None
        ahead: dict[int | None, rebase.ReadLists] = {}
        for i, (table_id, proposal) in enumerate(parts):
            lists = await rebase.read_ahead(self.files, self.registry.ahead(table_id), proposal.requirements,
                                            proposal.updates)
            ahead.update({i: lists} if lists is not None else {})
        await self._rebasing(lambda read: self.registry.transact(
            [(table_id, replace(proposal, read=read.get(i))) for i, (table_id, proposal) in enumerate(parts)],
            creates=creates, idempotency=record), ahead)
        for c in creates:
            self.names.remember((c.state.ident, "table"), c.row.table_id)

    async def plan_commit(self, ident: TableIdent, requirements: list, updates: list) -> PlannedPart:
        """One table's change as a part of a commit that spans tables (a transaction, or a cross-format commit):
        the table must exist; the part answers with its new metadata location."""
        if creates_table(requirements):
            raise BadRequest(f"{ident}: a commit across formats changes existing tables; create the table first")
        await self._check_relocation(ident, requirements, updates)
        proposal = CommitTable(ident, requirements, updates, files=self.files, warehouse=self.root(ident.catalog))
        # Resolved afresh, not from the cache: the caller does not retry when the table behind a cached name is gone
        # (renamed, or dropped and created again elsewhere), so a stale entry would refuse every later commit.
        self.names.forget((ident, "table"))
        return PlannedPart(await self._resolve(ident), proposal, _metadata_location)

    async def _check_requirements_first(self, changes: list[tuple[TableIdent, list, list]]) -> None:
        """Every change's requirements, in the order sent, before any change's updates: the actors validate their
        parts in table-id order, so a transaction with a table changed meanwhile (409: refresh and retry) could
        otherwise be answered 400 for another table's updates. Java's `CatalogHandlers` checks requirements before
        updates too. The actors check them again, while they hold their tables."""
        for ident, requirements, updates in changes:
            if creates_table(requirements):
                await self._check_absent(ident)
                check_requirements(None, requirements)
            elif requirements:
                metadata = (await self.load_table(ident)).metadata
                if rebase.append_of(metadata, requirements, updates) is None:   # (an append rebases in its actor)
                    check_requirements(metadata, requirements)

    async def report_metrics(self, ident: TableIdent, report: dict[str, Any]) -> None:
        """Keep a scan or commit report (bounded: coordinator/reports.py)."""
        await reports.keep(self.store, self.services.config, REPORTS, await self._resolve(ident), report["report-type"],
                           report)

    async def credentials(self, ident: TableIdent) -> list[dict[str, Any]]:
        """Vended storage credentials: none for local warehouses; the configured static S3 keys for s3://, but only
        while authentication is off. They are the service's own keys to the whole warehouse, so with grants in
        force they would let a reader of one table write or delete every other: clients then bring their own."""
        location = (await self.load_table(ident)).metadata["location"]
        keys = vendable_s3_keys(self.services.warehouses, self.services.auth is not None, location)
        return storage_credentials(location, keys)

    async def drop_table(self, ident: TableIdent, purge: bool, idempotency_key: IdempotencyKey | None = None) -> None:
        await self._submit(ident, lambda: DropTable(ident, purge, self.files, idempotency_key, self.root(ident.catalog),
                                                    self.store))
        self.names.forget((ident, "table"))

    async def rename_table(self, source: TableIdent, dest: TableIdent,
                           idempotency_key: IdempotencyKey | None = None) -> None:
        await self._rename(source, dest, idempotency_key, "table")

    async def _rename(self, source: TableIdent, dest: TableIdent, idempotency_key: IdempotencyKey | None,
                      kind: str) -> None:
        await self._check_creatable(dest)
        row = await self.store.find_table(REALM, dest.catalog, dest.ns_path, dest.name)
        if row is not None:
            raise name_taken(row, dest, kind)
        await self._submit(source, lambda: RenameTable(source, dest, idempotency_key), kind=kind)
        self.names.forget((source, kind))

    # -- views -------------------------------------------------------------------------------------------------

    async def create_view(self, ident: TableIdent, *, schema: dict, view_version: dict, location: str | None,
                          properties: dict[str, str], idempotency_key: IdempotencyKey | None = None) -> IcebergTable:
        await self._check_creatable(ident)
        view_uuid = str(uuid.uuid4())
        location = await self._check_chosen(location, ident) if location else self.default_location(ident, view_uuid)
        metadata = new_view_metadata(view_uuid=view_uuid, location=location, schema=schema, version=view_version,
                                     properties=properties, now_ms=now_ms())
        return await self._insert(ident, metadata, view_uuid, idempotency_key, kind="view")

    async def load_view(self, ident: TableIdent) -> IcebergTable:
        return await self._submit(ident, lambda: LoadTable(ident), kind="view")

    async def replace_view(self, ident: TableIdent, requirements: list, updates: list,
                           idempotency_key: IdempotencyKey | None = None) -> IcebergTable:
        await self._check_relocation(ident, requirements, updates, "view")
        return await self._submit(ident, lambda: ReplaceView(ident, requirements, updates, idempotency_key,
                                                             self.root(ident.catalog)),
                                  kind="view")

    async def drop_view(self, ident: TableIdent, idempotency_key: IdempotencyKey | None = None) -> None:
        await self._submit(ident, lambda: DropTable(ident, False, self.files, idempotency_key, kind="view"),
                           kind="view")
        self.names.forget((ident, "view"))

    async def rename_view(self, source: TableIdent, dest: TableIdent,
                          idempotency_key: IdempotencyKey | None = None) -> None:
        await self._rename(source, dest, idempotency_key, "view")

