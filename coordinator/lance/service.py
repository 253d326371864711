"""The Lance Namespace service: namespaces in PostgreSQL, one table actor per table, versions in its commit log.

Names live in Lance's realm (catalog "": rows.py), separate from the other formats'. Namespaces are rows of
the shared `namespaces` table; a table is a `tables` row whose small state is its properties and version
high-water mark, and whose versions are its commit-log entries (`coordinator.lance.state.TableVersion`).

Everything that changes a table goes through its actor; a batch commit goes through the core's multi-table
transaction (`Registry.transact`, planned in `batch.py`), so single and batched commits share one path.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import trio

from storage.files import join, location_key, path_segment
from storage.records import LogEntry, TableRow, join_namespace, split_namespace

from ..decision import NewTable, PlannedPart, Proposal
from ..errors import (AlreadyExists, AppliedReplyLost, BadRequest, NoSuchNamespace, NoSuchTable, NoSuchVersion,
                      NotFound, Recount, TableExists, Unavailable)
from ..names import Names
from ..paging import decode_page_token, one_more, page
from ..placement import check_no_namespace_inside
from ..warehouses import DEFAULT as DEFAULT_WAREHOUSE

from . import files as lance_files, rules, state as lance_state
from .batch import commit_batch
from .layout import infer_scheme, is_staged, object_path, resolve_path, show
from .models import CreateTableVersionEntry, CreateTableVersionRequest, Page, parse_mode
from .namespaces import LanceNamespaces
from .proposals import CreateVersion, DeleteVersions, ReadTable, RemoveTable, feed_change
from .rows import CATALOG, FORMAT, REALM
from .rules import Ident, check_branch, check_table_ident
from .state import INT64_MAX, LanceTable, TableRef, TableVersion

if TYPE_CHECKING:
    from ..format import Services

log = logging.getLogger(__name__)

VersionRequest = CreateTableVersionRequest | CreateTableVersionEntry   # a batch entry is read as a request


def _gone(ident: Ident) -> NoSuchTable:
    return NoSuchTable(f"Table does not exist: {show(ident)}")


def _table_id(ref: TableRef) -> uuid.UUID:
    return ref.table_id


class LanceService:
    def __init__(self, services: Services):
        self.services = services
        self.store = services.store
        self.registry = services.registry
        self.files = services.files
        # A table's name -> its id and location, cached; a proposal to a table gone meanwhile is handed over once
        # more under the name resolved afresh (it may have been declared again).
        self.names: Names[Ident, TableRef] = Names(self.registry, self._find, _gone, table_id=_table_id)
        self.namespaces = LanceNamespaces(self.store, services.warehouses, self.warehouse, self.drop_table)

    @property
    def warehouse(self) -> str:
        return self.services.config.warehouse_uri

    # -- namespaces (namespaces.py) ---------------------------------------------------------------------------

    async def create_namespace(self, ns: Ident, mode: str | None, properties: dict[str, str] | None
                               ) -> dict[str, str]:
        return await self.namespaces.create(ns, mode, properties)

    async def describe_namespace(self, ns: Ident) -> dict[str, str]:
        return await self.namespaces.describe(ns)

    async def list_namespaces(self, ns: Ident, page_token: str | None, limit: int | None) -> Page:
        return await self.namespaces.list(ns, page_token, limit)

    async def drop_namespace(self, ns: Ident, mode: str | None, behavior: str | None) -> dict[str, str]:
        return await self.namespaces.drop(ns, mode, behavior)

    # -- tables: resolution ----------------------------------------------------------------------------------

    async def _find(self, ident: Ident) -> TableRef:
        """What a table's name stands for, from the store (`self.names` caches it): NoSuchTable, or NoSuchNamespace
        when that is what is missing."""
        ns, name = ident[:-1], ident[-1]
        row = await self.store.find_table(REALM, CATALOG, join_namespace(ns), name)
        if row is None:
            await self.describe_namespace(ns)   # say "namespace" when that is what is missing
            raise _gone(ident)
        return TableRef(row.table_id, row.location or "")

    async def current_id(self, ident: Ident) -> uuid.UUID | None:
        row = await self.store.find_table(REALM, CATALOG, join_namespace(ident[:-1]), ident[-1])
        return None if row is None else row.table_id

    async def _submit(self, ident: Ident, make: Callable[[TableRef], Awaitable[Proposal]]) -> Any:
        """Resolve the name, build the proposal (it may read files) and hand it to the table's actor (Names)."""
        check_table_ident(ident)
        return await self.names.submit_to(ident, make)

    async def _read(self, ident: Ident) -> LanceTable:
        return (await self._read_ref(ident))[1]

    async def _read_ref(self, ident: Ident) -> tuple[TableRef, LanceTable]:
        refs = []

        async def make(ref: TableRef) -> Proposal:
            refs.append(ref)
            return ReadTable(recent=True)   # every caller reads older versions from the log if they are not in it
        state = await self._submit(ident, make)
        return refs[-1], state

    async def _version(self, ref: TableRef, state: LanceTable, version: int | None) -> TableVersion | None:
        """Version `version` (None: the latest) of the table, from memory or, if older, from the commit log."""
        if version is None:
            if state.latest is not None or state.complete:
                return state.latest
            found = await self._logged_versions(ref.table_id, state, None, 1, descending=True)
            return found[0] if found else None
        if state.covers(version):
            return state.find(version)
        if version < 1:
            return None
        found = await self._logged_versions(ref.table_id, state, version - 1, 1, descending=False)
        return found[0] if found and found[0].version == version else None

    async def _logged_versions(self, table_id: uuid.UUID, state: LanceTable, after: int | None, limit: int | None,
                               descending: bool) -> list[TableVersion]:
        """`LanceTable.page` from the commit log, for versions older than those in memory (`after` within int64,
        as `list_table_versions` makes sure), up to the high-water mark of the reader's `state`: a version
        recorded since may not have its final manifest in place yet (it is written after the record, and the
        version is answered only then), so a reader sees no version its state could not show."""
        if descending:
            entries = await self.store.read_log(table_id, end=state.high_water if after is None else
                                                min(after - 1, state.high_water), limit=limit, descending=True)
        else:
            entries = await self.store.read_log(table_id, start=0 if after is None else after + 1,
                                                end=state.high_water, limit=limit)
        return lance_state.from_log(entries)

    # -- tables ------------------------------------------------------------------------------------------------

    def namespace_dir(self, ns: Ident) -> str:
        return self.namespaces.directory(ns)

    def default_location(self, ident: Ident, table_id: uuid.UUID) -> str:
        return join(self.namespace_dir(ident[:-1]), f"{path_segment(ident[-1])}-{table_id.hex}")

    def check_location(self, location: str, ident: Ident) -> str:
        return rules.check_location(self.namespaces.root(ident[:-1]), location, self.namespace_dir(ident[:-1]),
                                    ident[:-1],
                                    self.services.auth is not None)

    async def check_no_namespace_inside(self, location: str) -> None:
        warehouse = self.services.warehouses.containing(location)
        if warehouse is None or warehouse.name == DEFAULT_WAREHOUSE:
            await check_no_namespace_inside(self.store, self.services.formats, self.warehouse, location)
        else:
            await check_no_namespace_inside(self.store, self.services.formats, warehouse.location, location,
                                            own_root=warehouse.name)

    async def check_unused(self, location: str) -> None:
        """A declared table starts with no versions, so the location the client chose holds none, nor anyone
        else's files (rules.check_declarable)."""
        manifests = await trio.to_thread.run_sync(lance_files.list_manifests, self.files, location)
        rules.check_declarable(location, manifests,
                               await trio.to_thread.run_sync(lance_files.foreign_file, self.files, location))

    def new_table(self, ident: Ident, location: str | None, properties: dict[str, str] | None
                  ) -> tuple[TableRow, LanceTable]:
        """The row and state of a table to declare or register (nothing written yet)."""
        check_table_ident(ident)
        self.namespaces.not_being_dropped(ident[:-1])
        table_id = uuid.uuid4()
        loc = self.check_location(location, ident) if location else self.default_location(ident, table_id)
        state = LanceTable(ident[:-1], ident[-1], loc, dict(properties or {}))
        row = TableRow(table_id=table_id, realm=REALM, catalog=CATALOG, namespace=join_namespace(ident[:-1]),
                       name=ident[-1], format=FORMAT, location=loc)
        return row, state

    async def declare_table(self, ident: Ident, location: str | None, properties: dict[str, str] | None
                            ) -> LanceTable:
        await self.namespaces.learn(ident[:-1])
        row, state = self.new_table(ident, location, properties)
        await self.describe_namespace(ident[:-1])
        if location:
            await self.check_no_namespace_inside(row.location)
            await self.check_unused(row.location)
        await self._create(ident, row, state)
        return state

    async def _create(self, ident: Ident, row: TableRow, state: LanceTable, entries: list[LogEntry] = ()) -> None:
        """The registry's create, its refusals as the typed errors they mean here: the name is taken, or the
        namespace was dropped meanwhile."""
        try:
            await self.registry.create(row, state=state, row_state=state.row_state(), log_entries=entries,
                                       changes=[feed_change("created", state)])
        except AlreadyExists:
            raise TableExists(f"Table already exists: {show(ident)}") from None
        except NotFound as exc:
            raise NoSuchNamespace(exc.message) from None
        self.names.remember(ident, TableRef(row.table_id, row.location))

    async def describe_table(self, ident: Ident, version: int | None = None, branch: str | None = None
                             ) -> LanceTable:
        check_branch(branch)
        ref, state = await self._read_ref(ident)
        if version is not None and await self._version(ref, state, version) is None:
            raise NoSuchVersion(f"version {version} of table {show(ident)} does not exist")
        return state

    async def register_table(self, ident: Ident, location: str, mode: str | None,
                             properties: dict[str, str] | None) -> LanceTable:
        mode = parse_mode(mode, ("create", "overwrite"), "create", "mode")
        await self.namespaces.learn(ident[:-1])
        row, state = self.new_table(ident, location, properties)
        await self.describe_namespace(ident[:-1])
        await self.check_no_namespace_inside(row.location)
        existing = await self.store.find_table(REALM, CATALOG, row.namespace, row.name)
        rules.check_name_free(ident, existing is not None and mode == "create")
        found = await trio.to_thread.run_sync(lance_files.list_manifests, self.files, row.location)
        rules.check_registrable(row.location, found,
                                await self.files.read(found[-1].uri, row.location) if found else None)
        versions = tuple(TableVersion(m.version, m.uri, m.size, m.mtime_ms, m.scheme) for m in found)
        state = LanceTable(state.namespace, state.name, state.location, state.properties, versions,
                           versions[-1].version).trimmed()
        entries = [LogEntry(v.version, v.payload()) for v in versions]
        if existing is not None and mode == "overwrite":
            # Replace the registration atomically: deregister the old row and insert the new in one transaction.
            await self.registry.transact([(existing.table_id, RemoveTable())],
                                         creates=[NewTable(row, state, state.row_state(), entries,
                                                           changes=[feed_change("created", state)])])
            self.names.remember(ident, TableRef(row.table_id, row.location))
        else:
            await self._create(ident, row, state, entries)
        return state

    async def deregister_table(self, ident: Ident) -> LanceTable:
        async def make(_ref: TableRef) -> Proposal:
            return RemoveTable()
        state = await self._submit(ident, make)
        self.names.forget(ident)
        return state

    async def drop_table(self, ident: Ident) -> LanceTable:
        await self.namespaces.learn(ident[:-1])   # (which warehouse its default location lies in)

        async def make(ref: TableRef) -> Proposal:
            # Only what lies in our warehouse is ours to delete; all of it only in the directory the service gave
            # the table (named after its id: nobody's but its own), else only Lance's own files (RemoveTable).
            if self.services.warehouses.containing(ref.location) is None:
                return RemoveTable()
            own = location_key(ref.location) == location_key(self.default_location(ident, ref.table_id))
            return RemoveTable(purge=ref.location, files=self.files, store=self.store, own_location=own)
        state = await self._submit(ident, make)
        self.names.forget(ident)
        return state

    async def list_tables(self, ns: Ident | None, page_token: str | None, limit: int | None,
                          include_declared: bool = True) -> Page:
        """Tables of one namespace (names), or of all namespaces (`ns` None: full identifiers)."""
        if ns is not None:
            await self.describe_namespace(ns)
        rows = await self.store.list_tables(REALM, CATALOG, None if ns is None else join_namespace(ns),
                                            after=decode_page_token(page_token), limit=one_more(limit))
        rows, nxt = page(rows, limit, lambda row: row.cursor)
        if not include_declared:
            rows = [r for r in rows if int(r.state.get("high_water", 0)) > 0]
        items = [r.name if ns is not None else (*split_namespace(r.namespace), r.name) for r in rows]
        return Page(items, nxt)

    # -- versions ----------------------------------------------------------------------------------------------

    async def prepare_version(self, location: str, req: VersionRequest) -> CreateVersion:
        """Read the staged manifest (outside the actor: I/O) and check it, so the rule itself stays pure."""
        check_branch(req.branch)
        rules.check_naming_scheme(req.naming_scheme)
        staging = resolve_path(location, req.manifest_path)
        name = rules.check_staging_path(location, staging, req.version)
        scheme = req.naming_scheme or infer_scheme(name, req.version) or "V2"
        data = await lance_files.read_staged(self.files, location, staging)
        sha = None
        if data is not None:
            rules.check_staged_manifest(data, req.manifest_size, req.manifest_path)
            sha = hashlib.sha256(data).hexdigest()
        staged = is_staged(staging)
        return CreateVersion(req.version, staging, data, sha, scheme, int(time.time() * 1000), req.metadata, staged,
                             functools.partial(self.files.delete, within=location) if staged else None)

    async def create_table_version(self, ident: Ident, req: CreateTableVersionRequest) -> TableVersion:
        async def make(ref: TableRef) -> Proposal:
            return await self.prepare_version(ref.location, req)
        try:
            return await self._submit(ident, make)
        except AppliedReplyLost:
            return await self.describe_table_version(ident, req.version)  # applied: its record is the answer

    async def plan_commit(self, ident: Ident, req: CreateTableVersionRequest) -> PlannedPart:
        """A new version as a part of a commit that spans tables (a cross-format commit): it answers with the
        version it created."""
        check_table_ident(ident)
        # Resolved afresh, not from the cache: a cross-format commit is not retried here when the table behind a
        # cached name is gone (dropped and declared again elsewhere), so a stale entry would refuse it every time.
        self.names.forget(ident)
        ref = await self.names.ref(ident)
        return PlannedPart(ref.table_id, await self.prepare_version(ref.location, req), TableVersion.to_spec)

    async def describe_table_version(self, ident: Ident, version: int | None, branch: str | None = None
                                     ) -> TableVersion:
        check_branch(branch)
        ref, state = await self._read_ref(ident)
        entry = await self._version(ref, state, version)
        if entry is None:
            what = "has no versions" if version is None else f"has no version {version}"
            raise NoSuchVersion(f"table {show(ident)} {what}")
        if version is not None and not await self._still_there(ref, state, [entry]):
            raise NoSuchVersion(f"table {show(ident)} has no version {version} any more: its manifest "
                                f"{object_path(entry.manifest_uri)} was deleted (cleanup_old_versions)")
        return entry

    async def _still_there(self, ref: TableRef, state: LanceTable, versions: list[TableVersion]
                           ) -> list[TableVersion]:
        """`versions` less those whose manifest Lance's clean-up deleted (lance_files.cleaned_up)."""
        latest = state.latest or await self._version(ref, state, None)
        gone = await lance_files.cleaned_up(self.files, versions, latest)
        return [v for v in versions if v.version not in gone] if gone else versions

    async def list_table_versions(self, ident: Ident, limit: int | None, page_token: str | None,
                                  descending: bool, branch: str | None = None) -> Page:
        check_branch(branch)
        ref, state = await self._read_ref(ident)
        after = None
        if page_token:
            try:
                after = int(page_token)
            except ValueError:
                after = -1
            if not 0 <= after <= INT64_MAX:   # every token handed out is a version number
                raise BadRequest(f"invalid page_token: {page_token!r}") from None
        versions = state.page(after, one_more(limit), descending)
        if versions is None:   # reaches back beyond the versions in memory
            versions = await self._logged_versions(ref.table_id, state, after, one_more(limit), descending)
        nxt = None
        if limit is not None and len(versions) > limit:
            versions = versions[:limit]
            nxt = str(versions[-1].version) if versions else None
        # The token counts what was recorded, so a page may come back short of versions cleaned up since.
        return Page(await self._still_there(ref, state, versions), nxt)

    async def delete_table_versions(self, ident: Ident, ranges: list[tuple[int, int]],
                                    branch: str | None = None) -> int:
        check_branch(branch)

        async def make(ref: TableRef) -> Proposal:
            return await self.version_deletion(ref, ranges)
        return await recounting(lambda: self._submit(ident, make))

    async def version_deletion(self, ref: TableRef, ranges: list[tuple[int, int]],
                               earlier: list[tuple[int, int]] = ()) -> DeleteVersions:
        """DeleteVersions, with the records it deletes below the versions in memory counted from the log (less
        those in `earlier` ranges, which an earlier operation of the same batch deletes)."""
        state = await self.registry.submit(ref.table_id, ReadTable())
        older = 0 if state.complete else await self.store.count_log(ref.table_id, ranges, below=state.log_below,
                                                                     excluding=list(earlier))
        return DeleteVersions(ranges, state.log_below, older, state.deletes)

    # -- batches -----------------------------------------------------------------------------------------------

    async def batch_create_versions(self, entries: list[tuple[Ident, VersionRequest]]) -> list[TableVersion]:
        return [reply for _, reply in await self.batch_commit([("create_table_version", ident, req)
                                                                for ident, req in entries])]

    async def batch_commit(self, operations: list[tuple[str, Ident, Any]]) -> list[tuple[str, Any]]:
        """Apply every operation (kind, table identifier, spec request), across any tables, atomically or not at
        all; (kind, reply) in request order. See `batch.Batch` for the semantics."""
        return await recounting(lambda: commit_batch(self, operations))

    async def transact(self, parts: list[tuple[uuid.UUID, Proposal]], creates: list[NewTable]) -> list[Any]:
        return await self.registry.transact(parts, creates=creates)


RECOUNTS = 5   # attempts of a version deletion whose count of older records went stale meanwhile


async def recounting(attempt: Callable[[], Awaitable[Any]]) -> Any:
    """`attempt()`, again while a version deletion in it finds its count of older records stale (it applied
    nothing then), at most RECOUNTS times."""
    for _ in range(RECOUNTS):
        try:
            return await attempt()
        except Recount:
            pass
    raise Unavailable("the table's versions kept changing while their records were counted; nothing was applied, "
                      "retry", retry_after_s=1)
