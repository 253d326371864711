"""The Lance Namespace catalog: namespaces in PostgreSQL, one table actor per table, versions in its commit log.

Names live in realm "lance" (catalog ""), separate from Iceberg's and Unity Catalog's. Namespaces are rows of
the shared `namespaces` table; a table is a `tables` row whose small state is its properties and version
high-water mark, and whose versions are its commit-log entries (`coordinator.lance.table.TableVersion`).

Everything that changes a table goes through its actor; a batch commit goes through the core's multi-table
transaction (`Registry.transact`), so single and batched commits share one path.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import trio

from storage import errors as storage_errors
from storage.errors import FileMissing, FileRefused
from storage.files import NOT_A_FILE, is_below, is_within, join, path_segment, unsafe_location
from storage.records import LogEntry, TableRow, join_namespace, split_namespace

from ..decision import Proposal
from ..errors import (AlreadyExists, AppliedReplyLost, BadRequest, CommitConflict, NotEmpty, NotFound,
                      Unavailable, from_storage)
from ..paging import decode_page_token, one_more, page
from ..placement import check_namespace_directory_free, check_no_namespace_inside
from ..decision import Compaction, NewTable as Create
from ..purges import purge_after_drop

from . import storage as lance_storage
from .models import CreateTableVersionEntry, CreateTableVersionRequest, parse_mode
from .rules import CreateVersion, DeleteVersions, ReadTable, RemoveTable, Steps, show
from .table import (INT64_MAX, MANIFEST_MAGIC, NAMING_SCHEMES, VERSIONS_KEPT, LanceTable, TableVersion,
                    check_staging_path, infer_scheme, is_staged, manifest_uri, object_path, resolve_path)

log = logging.getLogger(__name__)

REALM = "lance"
CATALOG = ""
FORMAT = "lance"
CASCADE_ROUNDS = 10   # a cascade drop drops the tables declared while it ran this many times before giving up
Ident = tuple[str, ...]   # namespace levels + table name
VersionRequest = CreateTableVersionRequest | CreateTableVersionEntry   # a batch entry is read as a request


@dataclass(frozen=True)
class TableRef:
    """What a name resolves to. A Lance table is never renamed, so (id, location) is fixed for the row's life."""

    table_id: uuid.UUID
    location: str


@dataclass
class Page:
    items: list[Any]
    next_token: str | None


class LanceCatalog:
    def __init__(self, coordinator):
        self.c = coordinator
        self.store = coordinator.store
        self.registry = coordinator.registry
        self.files = coordinator.files
        self.registry.register_format(FORMAT, self._load_state,
                                      Compaction(compact=LanceTable.dormant, expand=lambda row, state: state))
        self._refs: dict[Ident, TableRef] = {}
        # Namespaces a cascade drop is emptying here: nothing new is created in or below them meanwhile, or
        # steady declares could keep the drop from ever finding them empty (`_drop_cascading`).
        self._dropping: Counter[Ident] = Counter()

    @property
    def warehouse(self) -> str:
        return self.c.config.warehouse_uri

    async def _load_state(self, row: TableRow) -> LanceTable:
        # The latest VERSIONS_KEPT versions (one more tells whether there are older ones).
        entries = await self.store.read_log(row.table_id, limit=VERSIONS_KEPT + 1, descending=True)
        versions = [TableVersion.from_payload(e.version, e.payload) for e in reversed(entries[:VERSIONS_KEPT])]
        high = max(int(row.state.get("high_water", 0)), versions[-1].version if versions else 0)
        state = LanceTable(split_namespace(row.namespace), row.name, row.location or "",
                           dict(row.state.get("properties") or {}), versions, high,
                           log_below=versions[0].version if len(entries) > VERSIONS_KEPT else 0,
                           deletes=row.row_version)
        await self._restore_final_manifests(state)
        await self._remove_unrecorded_manifests(row, state)
        return state

    async def _restore_final_manifests(self, state: LanceTable) -> None:
        """A final manifest is written once its version is recorded, so a crash in between leaves a recorded
        version without it. Its staged manifest is gone only once the final one is in place (renamed into it, or
        removed after the copy), so it is still there: copy it back, from the latest version down to the first
        whose final manifest exists (earlier ones were written before that one). Without a matching staged copy
        the version is logged and the table served; a storage error fails the load instead, so that nothing is
        answered while a restorable file is missing."""
        for v in reversed(state.versions):
            # (a directory put in its place is not it, nor a link: only a file reached without following one)
            found = await self.files.size(v.manifest_uri, within=state.location)
            if found is not None and v.size in (None, found):
                return
            data = None
            if v.staging_uri not in (None, v.manifest_uri):   # a final name the client handed in has no copy
                try:
                    data = await self.files.read(v.staging_uri, within=state.location)
                except (NotFound, BadRequest, FileMissing, FileRefused):   # (gone, or not a file: a link, say)
                    pass
            if data is None or len(data) != v.size or hashlib.sha256(data).hexdigest() != v.sha256:
                log.error("table %s: version %d's manifest %s is missing and %s holds no copy of it",
                          show(state.ident), v.version, v.manifest_uri, v.staging_uri)
                continue
            await self.files.write_many([(v.manifest_uri, data, None, state.location)])
            log.warning("table %s: restored version %d's manifest %s from %s", show(state.ident), v.version,
                        v.manifest_uri, v.staging_uri)
            if is_staged(v.staging_uri):   # as CreateVersion's clean-up
                try:
                    await self.files.delete(v.staging_uri, within=state.location)
                except Exception as exc:
                    log.warning("removing staged manifest %s failed: %s", v.staging_uri, exc)

    async def _remove_unrecorded_manifests(self, row: TableRow, state: LanceTable) -> None:
        """Final manifests above the high-water mark were never recorded: ours are written only after their
        version is, but a client may put one there itself (a final name handed in as `manifest_path`) and its
        commit then be refused or lost (crash, database failure). Lance probes final paths before committing, so
        such a file would make every writer skip a version we then refuse. The actor loads before serving and
        reloads after every failed write, so it removes them here: files for versions above the high-water mark
        are in our table (a declared location must hold no manifests) and were never acknowledged."""
        orphans = []
        version = state.high_water + 1
        while True:
            ages = [(uri, await self.files.age_s(uri)) for uri in
                    (manifest_uri(state.location, version, s) for s in NAMING_SCHEMES)]
            found = [(uri, age) for uri, age in ages if age is not None]
            if not found:
                break
            # A young one may be a writer's final name handed in as manifest_path, its version/create still on
            # its way: left for a later load (config.lance_unrecorded_grace_s).
            orphans += [uri for uri, age in found if age >= self.c.config.lance_unrecorded_grace_s]
            version += 1
        if not orphans or await trio.to_thread.run_sync(self.files.leads_elsewhere, state.location):
            return   # (a link between the warehouse and the table's place: the manifests found may be anyone's)
        # Wait out a transaction that may still be writing this row (a lost connection): its outcome decides
        # whether these files are orphans. FOR UPDATE blocks until it has committed or rolled back.
        current = await self.store.settled_row_version(row.table_id)
        if current != row.row_version:
            raise Unavailable(f"table {show(state.ident)} changed while it was loading; retry")
        for uri in orphans:
            log.warning("removing manifest %s: its version was never recorded", uri)
            try:
                await self.files.delete(uri, within=state.location)
            except OSError as exc:
                if exc.errno not in NOT_A_FILE:
                    raise
                # Reached through a link (the table's `_versions/`, say): not ours to delete, and no reason to
                # refuse to load the table either.
                log.warning("not removing %s: %s", uri, exc)

    # -- namespaces --------------------------------------------------------------------------------------------

    async def create_namespace(self, ns: Ident, mode: str | None, properties: dict[str, str] | None
                               ) -> dict[str, str]:
        mode = parse_mode(mode, ("create", "existok", "overwrite"), "create", "mode")
        _check_levels(ns, "namespace")
        if not ns:
            if mode == "create":
                raise AlreadyExists("the root namespace always exists", kind="namespace")
            return {}
        props = dict(properties or {})
        self._not_being_dropped(ns[:-1])
        await check_namespace_directory_free(self.store, self.namespace_dir(ns), show(ns))
        try:
            await self.store.create_namespace(REALM, CATALOG, join_namespace(ns), props, parent=_parent(ns))
        except (AlreadyExists, storage_errors.NamespaceExists):
            if mode == "create":
                raise
            if mode == "existok":
                return await self.describe_namespace(ns)
            # Overwrite: "the existing namespace is dropped and a new empty namespace with this name is created".
            try:
                await self.drop_namespace(ns, None, "cascade")
            except (NotFound, storage_errors.NamespaceMissing):
                pass   # a concurrent overwrite or drop came first: gone all the same
            await self.store.create_namespace(REALM, CATALOG, join_namespace(ns), props, parent=_parent(ns))
        return props

    async def describe_namespace(self, ns: Ident) -> dict[str, str]:
        _check_levels(ns, "namespace")
        if not ns:
            return {}
        props = await self.store.get_namespace(REALM, CATALOG, join_namespace(ns))
        if props is None:
            raise NotFound(f"Namespace does not exist: {show(ns)}", kind="namespace")
        return props

    async def list_namespaces(self, ns: Ident, page_token: str | None, limit: int | None) -> Page:
        await self.describe_namespace(ns)
        paths = await self.store.list_namespaces(REALM, CATALOG, join_namespace(ns),
                                                 after=decode_page_token(page_token), limit=one_more(limit))
        paths, nxt = page(paths, limit)
        return Page([split_namespace(p)[-1] for p in paths], nxt)

    async def drop_namespace(self, ns: Ident, mode: str | None, behavior: str | None) -> dict[str, str]:
        mode = parse_mode(mode, ("fail", "skip"), "fail", "mode")
        behavior = parse_mode(behavior, ("restrict", "cascade"), "restrict", "behavior")
        _check_levels(ns, "namespace")
        if not ns:
            raise BadRequest("the root namespace cannot be dropped")
        path = join_namespace(ns)
        try:
            props = await self.describe_namespace(ns)
            if behavior == "cascade":
                await self._drop_cascading(ns)
            else:
                await self.store.drop_namespace(REALM, CATALOG, path)
        except (NotFound, storage_errors.NamespaceMissing) as exc:
            if mode == "skip" and (isinstance(exc, storage_errors.NamespaceMissing) or exc.kind == "namespace"):
                return {}
            raise
        except (NotEmpty, storage_errors.NamespaceNotEmpty):
            raise NotEmpty(f"Namespace is not empty: {show(ns)}; drop its tables and namespaces first or use "
                           f"behavior Cascade", kind="namespace") from None
        return props

    async def _drop_cascading(self, ns: Ident) -> None:
        """Spec, Cascade: "all tables and child namespaces in the namespace are dropped before the namespace is
        dropped". Tables go through their actors (so none keeps serving from memory and their files are purged),
        then the namespaces, in a transaction that keeps new tables out. Tables declared meanwhile are dropped in
        another round (in a cluster, where other members go on creating, up to CASCADE_ROUNDS)."""
        self._dropping[ns] += 1
        try:
            await self._drop_rounds(ns)
        finally:
            self._dropping[ns] -= 1
            if not self._dropping[ns]:
                del self._dropping[ns]

    async def _drop_rounds(self, ns: Ident) -> None:
        path = join_namespace(ns)
        for _ in range(CASCADE_ROUNDS):
            for child in [path] + await self.store.list_namespaces(REALM, CATALOG, path, recursive=True):
                for row in await self.store.list_tables(REALM, CATALOG, child):
                    try:
                        await self.drop_table((*split_namespace(row.namespace), row.name))
                    except NotFound:
                        pass
            try:
                return await self.store.drop_namespace(REALM, CATALOG, path, cascade=True)
            except storage_errors.NamespaceNotEmpty as exc:
                if not isinstance(exc, storage_errors.NamespaceRefilled):
                    raise
        raise CommitConflict(f"Namespace {show(ns)} was not dropped: tables kept being created in it; the tables "
                             f"dropped so far stay dropped; retry", kind="namespace")

    # -- tables: resolution ----------------------------------------------------------------------------------

    async def _resolve(self, ident: Ident) -> TableRef:
        ref = self._refs.get(ident)
        if ref is None:
            ns, name = ident[:-1], ident[-1]
            row = await self.store.find_table(REALM, CATALOG, join_namespace(ns), name)
            if row is None:
                await self.describe_namespace(ns)   # say "namespace" when that is what is missing
                raise NotFound(f"Table does not exist: {show(ident)}", kind="table")
            ref = TableRef(row.table_id, row.location or "")
            if len(self._refs) > 100_000:
                self._refs.clear()
            self._refs[ident] = ref
        return ref

    async def _submit(self, ident: Ident, make: Callable[[TableRef], Awaitable[Proposal]]) -> Any:
        """Resolve the name, build the proposal (it may read files) and hand it to the table's actor. A cached
        name whose table has since gone is resolved once more (it may have been declared again)."""
        _check_table_ident(ident)
        for attempt in (0, 1):
            ref = await self._resolve(ident)
            try:
                return await self.registry.submit(ref.table_id, await make(ref))
            except NotFound as exc:
                if exc.kind != "table":
                    raise
                self._refs.pop(ident, None)
                if attempt:
                    raise NotFound(f"Table does not exist: {show(ident)}", kind="table") from None

    async def _read(self, ident: Ident) -> LanceTable:
        return (await self._read_ref(ident))[1]

    async def _read_ref(self, ident: Ident) -> tuple[TableRef, LanceTable]:
        refs = []

        async def make(ref: TableRef) -> Proposal:
            refs.append(ref)
            return ReadTable()
        state = await self._submit(ident, make)
        return refs[-1], state

    async def _version(self, ref: TableRef, state: LanceTable, version: int | None) -> TableVersion | None:
        """Version `version` (None: the latest) of the table, from memory or, if older, from the commit log."""
        if version is None:
            if state.latest is not None or state.complete:
                return state.latest
            found = await self._logged_versions(ref.table_id, None, 1, descending=True)
            return found[0] if found else None
        if state.covers(version):
            return state.find(version)
        if version < 1:
            return None
        found = await self._logged_versions(ref.table_id, version - 1, 1, descending=False)
        return found[0] if found and found[0].version == version else None

    async def _logged_versions(self, table_id: uuid.UUID, after: int | None, limit: int | None,
                               descending: bool) -> list[TableVersion]:
        """`LanceTable.page` from the commit log, for versions older than those in memory (`after` within int64,
        as `list_table_versions` makes sure)."""
        if descending:
            entries = await self.store.read_log(table_id, end=None if after is None else after - 1, limit=limit,
                                                descending=True)
        else:
            entries = await self.store.read_log(table_id, start=0 if after is None else after + 1, limit=limit)
        return [TableVersion.from_payload(e.version, e.payload) for e in entries]

    # -- tables ------------------------------------------------------------------------------------------------

    def namespace_dir(self, ns: Ident) -> str:
        return join(self.warehouse, *(path_segment(level) for level in ns))

    def default_location(self, ident: Ident, table_id: uuid.UUID) -> str:
        return join(self.namespace_dir(ident[:-1]), f"{path_segment(ident[-1])}-{table_id.hex}")

    def check_location(self, location: str, ident: Ident) -> str:
        """Below the warehouse (never the warehouse itself) and, with authentication on, inside the table's
        namespace's directory: a client's files stay where its namespace grants reach, so `create` in one
        namespace cannot claim another's place."""
        location = location.rstrip("/")
        unsafe = unsafe_location(location)
        if unsafe is not None:
            raise BadRequest(f"location {location!r} is refused: {unsafe}")
        if not location or not is_below(self.warehouse, location):
            raise BadRequest(f"location {location!r} must be below the warehouse {self.warehouse!r}")
        own = self.namespace_dir(ident[:-1])
        if self.c.auth is not None and not is_below(own, location):
            raise BadRequest(f"location {location!r} must lie inside {own}, the directory of the namespace "
                             f"{show(ident[:-1]) or '(root)'}: with authentication on, a table's files stay where "
                             f"its namespace's grants reach")
        return location

    async def check_no_namespace_inside(self, location: str) -> None:
        await check_no_namespace_inside(self.store, self.warehouse, location)

    async def check_unused(self, location: str) -> None:
        """A declared table starts with no versions, so its location must hold none (use register for that)."""
        if await trio.to_thread.run_sync(lance_storage.list_manifests, self.files, location):
            raise BadRequest(f"location {location} already holds a Lance table: register it instead of declaring")

    def _not_being_dropped(self, ns: Ident) -> None:
        for depth in range(1, len(ns) + 1):
            if self._dropping[ns[:depth]]:
                raise CommitConflict(f"Namespace {show(ns[:depth])} is being dropped; nothing was created; retry",
                                     kind="namespace")

    def _new_table(self, ident: Ident, location: str | None, properties: dict[str, str] | None
                   ) -> tuple[TableRow, LanceTable]:
        _check_table_ident(ident)
        self._not_being_dropped(ident[:-1])
        table_id = uuid.uuid4()
        loc = self.check_location(location, ident) if location else self.default_location(ident, table_id)
        state = LanceTable(ident[:-1], ident[-1], loc, dict(properties or {}))
        row = TableRow(table_id=table_id, realm=REALM, catalog=CATALOG, namespace=join_namespace(ident[:-1]),
                       name=ident[-1], format=FORMAT, location=loc)
        return row, state

    async def declare_table(self, ident: Ident, location: str | None, properties: dict[str, str] | None
                            ) -> LanceTable:
        row, state = self._new_table(ident, location, properties)
        await self.describe_namespace(ident[:-1])
        if location:
            await self.check_no_namespace_inside(row.location)
            await self.check_unused(row.location)
        try:
            await self.registry.create(row, state=state, row_state=state.row_state())
        except AlreadyExists:
            raise AlreadyExists(f"Table already exists: {show(ident)}", kind="table") from None
        self._refs[ident] = TableRef(row.table_id, row.location)
        return state

    async def describe_table(self, ident: Ident, version: int | None = None, branch: str | None = None
                             ) -> LanceTable:
        _no_branch(branch)
        ref, state = await self._read_ref(ident)
        if version is not None and await self._version(ref, state, version) is None:
            raise NotFound(f"version {version} of table {show(ident)} does not exist", kind="version")
        return state

    async def register_table(self, ident: Ident, location: str, mode: str | None,
                             properties: dict[str, str] | None) -> LanceTable:
        mode = parse_mode(mode, ("create", "overwrite"), "create", "mode")
        row, state = self._new_table(ident, location, properties)
        await self.describe_namespace(ident[:-1])
        await self.check_no_namespace_inside(row.location)
        existing = await self.store.find_table(REALM, CATALOG, row.namespace, row.name)
        if existing is not None and mode == "create":
            raise AlreadyExists(f"Table already exists: {show(ident)}", kind="table")
        found = await trio.to_thread.run_sync(lance_storage.list_manifests, self.files, row.location)
        if not found:
            raise BadRequest(f"no Lance table at {row.location}: its _versions/ directory holds no manifest")
        tail = (await self.files.read(found[-1].uri))[-len(MANIFEST_MAGIC):]
        if tail != MANIFEST_MAGIC:
            raise BadRequest(f"no Lance table at {row.location}: {found[-1].uri} is not a Lance manifest")
        versions = tuple(TableVersion(m.version, m.uri, m.size, m.mtime_ms, m.scheme) for m in found)
        state = LanceTable(state.namespace, state.name, state.location, state.properties, versions,
                           versions[-1].version).trimmed()
        entries = [LogEntry(v.version, v.payload()) for v in versions]
        if existing is not None and mode == "overwrite":
            # Replace the registration atomically: deregister the old row and insert the new in one transaction.
            await self.registry.transact([(existing.table_id, RemoveTable())],
                                         creates=[Create(row, state, state.row_state(), entries)])
        else:
            try:
                await self.registry.create(row, state=state, row_state=state.row_state(), log_entries=entries)
            except AlreadyExists:
                raise AlreadyExists(f"Table already exists: {show(ident)}", kind="table") from None
        self._refs[ident] = TableRef(row.table_id, row.location)
        return state

    async def deregister_table(self, ident: Ident) -> LanceTable:
        async def make(_ref: TableRef) -> Proposal:
            return RemoveTable()
        state = await self._submit(ident, make)
        self._refs.pop(ident, None)
        return state

    async def drop_table(self, ident: Ident) -> LanceTable:
        async def make(ref: TableRef) -> Proposal:
            # Only what lies in our warehouse is ours to delete. A partial, not a closure: in a cluster the proposal
            # may travel to the table's owner (coordinator/cluster/channel.py).
            if not is_within(self.warehouse, ref.location):
                return RemoveTable()
            claim, deletion = purge_after_drop(self.store, self.files, ref.location)
            return RemoveTable(deletion, claim)
        state = await self._submit(ident, make)
        self._refs.pop(ident, None)
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

    async def _prepare_version(self, location: str, req: VersionRequest) -> CreateVersion:
        """Read the staged manifest (outside the actor: I/O) and check it, so the rule itself stays pure."""
        _no_branch(req.branch)
        if req.naming_scheme is not None and req.naming_scheme not in NAMING_SCHEMES:
            raise BadRequest(f"naming_scheme must be one of {', '.join(NAMING_SCHEMES)}, got {req.naming_scheme!r}")
        staging = resolve_path(location, req.manifest_path)
        name = check_staging_path(location, staging, req.version)
        scheme = req.naming_scheme or infer_scheme(name, req.version) or "V2"
        try:
            data = await self.files.read(staging, within=location)   # (a link planted there is refused)
        except (NotFound, FileMissing):
            data = None
        except FileRefused as exc:
            raise from_storage(exc) from None
        sha = None
        if data is not None:
            if req.manifest_size is not None and req.manifest_size != len(data):
                raise BadRequest(f"manifest_size {req.manifest_size} does not match the staged manifest "
                                 f"({len(data)} bytes at {req.manifest_path})")
            if data[-len(MANIFEST_MAGIC):] != MANIFEST_MAGIC:
                raise BadRequest(f"{req.manifest_path} is not a Lance manifest (no {MANIFEST_MAGIC!r} footer)")
            sha = hashlib.sha256(data).hexdigest()
        staged = is_staged(staging)
        return CreateVersion(req.version, staging, data, sha, scheme, int(time.time() * 1000), req.metadata, staged,
                             functools.partial(self.files.delete, within=location) if staged else None)

    async def create_table_version(self, ident: Ident, req: CreateTableVersionRequest) -> TableVersion:
        async def make(ref: TableRef) -> Proposal:
            return await self._prepare_version(ref.location, req)
        try:
            return await self._submit(ident, make)
        except AppliedReplyLost:
            return await self.describe_table_version(ident, req.version)  # applied: its record is the answer

    async def describe_table_version(self, ident: Ident, version: int | None, branch: str | None = None
                                     ) -> TableVersion:
        _no_branch(branch)
        ref, state = await self._read_ref(ident)
        entry = await self._version(ref, state, version)
        if entry is None:
            what = "has no versions" if version is None else f"has no version {version}"
            raise NotFound(f"table {show(ident)} {what}", kind="version")
        if version is not None and not await self._still_there(ref, state, [entry]):
            raise NotFound(f"table {show(ident)} has no version {version} any more: its manifest "
                           f"{object_path(entry.manifest_uri)} was deleted (cleanup_old_versions)", kind="version")
        return entry

    async def _still_there(self, ref: TableRef, state: LanceTable, versions: list[TableVersion]
                           ) -> list[TableVersion]:
        """`versions` less those whose manifest is gone. Lance's `cleanup_old_versions` deletes old versions'
        manifests itself and tells the namespace nothing; a version that cannot be opened is none (lance's own
        directory namespace lists `_versions/` and shows only what is there). Cleanup never takes the latest
        version, so the commit path's `version/list` limit 1 costs no listing."""
        latest = state.latest or await self._version(ref, state, None)
        listed: dict[str, set[str]] = {}   # directory -> its names, listed once (all are usually `_versions/`)
        gone = set()
        for v in versions:
            if latest is not None and v.version >= latest.version:
                continue
            directory, _, name = v.manifest_uri.rpartition("/")
            if directory not in listed:
                listed[directory] = await self.files.names_in(directory)
            if name not in listed[directory]:
                gone.add(v.version)
        return [v for v in versions if v.version not in gone] if gone else versions

    async def list_table_versions(self, ident: Ident, limit: int | None, page_token: str | None,
                                  descending: bool, branch: str | None = None) -> Page:
        _no_branch(branch)
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
            versions = await self._logged_versions(ref.table_id, after, one_more(limit), descending)
        nxt = None
        if limit is not None and len(versions) > limit:
            versions = versions[:limit]
            nxt = str(versions[-1].version) if versions else None
        # The token counts what was recorded, so a page may come back short of versions cleaned up since.
        return Page(await self._still_there(ref, state, versions), nxt)

    async def delete_table_versions(self, ident: Ident, ranges: list[tuple[int, int]],
                                    branch: str | None = None) -> int:
        _no_branch(branch)

        async def make(ref: TableRef) -> Proposal:
            return await self._version_deletion(ref, ranges)
        return await _recounting(lambda: self._submit(ident, make))

    async def _version_deletion(self, ref: TableRef, ranges: list[tuple[int, int]],
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
        all; (kind, reply) in request order. See `_Batch` for the semantics."""
        ops = [_Op(kind, tuple(ident), request) for kind, ident, request in operations]
        return await _recounting(lambda: self._batch(ops))

    async def _batch(self, ops: list[_Op]) -> list[tuple[str, Any]]:
        try:
            return await _Batch(self, ops).run()
        except _StaleName:
            # A cached name whose table has gone (dropped, maybe declared again): forget and plan once more.
            for op in ops:
                self._refs.pop(op.ident, None)
        try:
            return await _Batch(self, ops).run()
        except _StaleName:
            raise NotFound("a table of this batch was dropped while the batch was being applied; nothing was "
                           "applied", kind="table") from None


RECOUNTS = 5   # attempts of a version deletion whose count of older records went stale meanwhile


async def _recounting(attempt: Callable[[], Awaitable[Any]]) -> Any:
    """`attempt()`, again while a version deletion in it finds its count of older records stale (it applied
    nothing then), at most RECOUNTS times."""
    for _ in range(RECOUNTS):
        try:
            return await attempt()
        except CommitConflict as exc:
            if exc.kind != "recount":
                raise
    raise Unavailable("the table's versions kept changing while their records were counted; nothing was applied, "
                      "retry", retry_after_s=1)


class _StaleName(Exception):
    """An actor found its table gone although the batch had just resolved its name."""


@dataclass
class _Op:
    kind: str            # one of models.OPERATION_KINDS
    ident: Ident
    request: Any

    @property
    def label(self) -> str:
        return f"{self.kind} {show(self.ident)}"


@dataclass
class _Target:
    """One table as the batch sees it: an existing row, or one the batch declares."""

    ident: Ident
    ref: TableRef | None = None
    new: tuple[TableRow, LanceTable] | None = None
    declared_by: int | None = None
    steps: list[tuple[int, str, Proposal]] = field(default_factory=list)


class _Batch:
    """BatchCommitTables semantics:

    - Operations apply in request order; each sees the effects of those before it (a version created by an
      earlier operation exists for a later one; a table deregistered earlier is gone for later ones; a name
      deregistered earlier may be declared again).
    - All or nothing: every table's part is validated by its actor and all rows are written in one database
      transaction (`Registry.transact`). Any rejection rejects the whole batch with that operation's error
      (its message names the operation index); nothing is applied.
    - Operations on a table declared in the same batch are folded into its creation; deregistering a table the
      same batch declared is refused as pointless.
    - Staged manifests are read before anything is decided; their final copies are written once the commit is
      recorded (like every version/create) and staging files are removed after that.
    """

    def __init__(self, catalog: LanceCatalog, ops: list[_Op]):
        self.catalog = catalog
        self.ops = ops
        self.live: dict[Ident, _Target | None] = {}
        self.targets: list[_Target] = []
        self.deleted: dict[Ident, list[tuple[int, int]]] = {}   # version ranges earlier operations delete

    async def _target(self, index: int, op: _Op) -> _Target:
        if op.ident in self.live:
            target = self.live[op.ident]
            if target is None:
                raise NotFound(f"operation {index} ({op.label}): the table was deregistered by an earlier operation "
                               f"of this batch", kind="table")
            return target
        try:
            ref = await self.catalog._resolve(op.ident)
        except NotFound as exc:
            exc.message = f"operation {index} ({op.label}): {exc.message}"
            exc.args = (exc.message,)
            raise
        target = _Target(op.ident, ref=ref)
        self.live[op.ident] = target
        self.targets.append(target)
        return target

    async def _plan(self) -> None:
        cat = self.catalog
        for index, op in enumerate(self.ops):
            try:
                _check_table_ident(op.ident)
            except BadRequest as exc:
                raise BadRequest(f"operation {index} ({op.kind}): {exc.message}") from None
            if op.kind == "declare_table":
                if op.ident in self.live:   # declared, or deregistered (None), by an earlier operation
                    taken = self.live[op.ident] is not None
                else:
                    taken = await cat.store.find_table(REALM, CATALOG, join_namespace(op.ident[:-1]),
                                                       op.ident[-1]) is not None
                if taken:
                    raise AlreadyExists(f"operation {index} ({op.label}): Table already exists: {show(op.ident)}",
                                        kind="table")
                await cat.describe_namespace(op.ident[:-1])
                target = _Target(op.ident, new=cat._new_table(op.ident, op.request.location, op.request.properties),
                                 declared_by=index)
                if op.request.location:
                    await cat.check_no_namespace_inside(target.new[1].location)
                    await cat.check_unused(target.new[1].location)
                self.live[op.ident] = target
                self.targets.append(target)
                continue
            target = await self._target(index, op)
            location = target.ref.location if target.ref else target.new[1].location
            if op.kind == "create_table_version":
                proposal = await cat._prepare_version(location, op.request)
            elif op.kind == "delete_table_versions":
                _no_branch(op.request.branch)
                ranges = [(r.start_version, r.end_version) for r in op.request.ranges]
                earlier = self.deleted.setdefault(op.ident, [])
                # A table this batch declares has every version in memory.
                proposal = DeleteVersions(ranges) if target.ref is None else await cat._version_deletion(
                    target.ref, ranges, earlier)
                earlier.extend(ranges)
            else:  # deregister_table
                if target.new is not None:
                    raise BadRequest(f"operation {index} ({op.label}): the table is declared by operation "
                                     f"{target.declared_by} of this same batch; leave out both operations")
                proposal = RemoveTable()
                self.live[op.ident] = None
            target.steps.append((index, op.label, proposal))

    async def run(self) -> list[Any]:
        await self._plan()
        cat = self.catalog
        parts, creates, replies, after = [], [], {}, []
        for t in self.targets:
            if t.new is None:
                parts.append((t.ref.table_id, Steps(t.steps)))
                continue
            row, initial = t.new
            d = Steps(t.steps).decide(initial)   # pure; raises (nothing applied) like an actor would
            replies.update(d.reply)
            replies[t.declared_by] = d.state
            creates.append(Create(row, d.state, d.state.row_state(), d.log, published=d.published))
            if d.after_durable is not None:
                after.append(d.after_durable)
        try:
            part_replies = await cat.registry.transact(parts, creates=creates)
        except NotFound as exc:
            if exc.kind == "table" and not exc.message.startswith("operation "):
                raise _StaleName() from exc
            raise
        for r in part_replies:
            replies.update(r)
        for t in self.targets:
            if t.new is not None:
                cat._refs[t.ident] = TableRef(t.new[0].table_id, t.new[0].location)
            elif any(isinstance(p, RemoveTable) for _, _, p in t.steps):
                cat._refs.pop(t.ident, None)
        for fn in after:
            await fn()   # a Steps chain: it logs and swallows a failed clean-up itself
        return [(op.kind, replies[i]) for i, op in enumerate(self.ops)]


# -- helpers -----------------------------------------------------------------------------------------------------


def _check_levels(levels: Ident, what: str) -> None:
    for level in levels:
        # `/` too: a route's %2F is decoded before routing, so a level holding it could never be addressed
        if not level or "\x1f" in level or "\x1e" in level or "\x00" in level or "/" in level:
            raise BadRequest(f"invalid {what} identifier {list(levels)!r}: an empty level, a control character "
                             f"or '/'")


def _check_table_ident(ident: Ident) -> None:
    if not ident:
        raise BadRequest("a table identifier needs at least a table name")
    _check_levels(ident, "table")


def _no_branch(branch: str | None) -> None:
    if branch not in (None, "", "main"):
        raise BadRequest(f"branch {branch!r}: this server manages the main branch only", kind="unsupported")


def _parent(ns: Ident) -> tuple[str, str, str] | None:
    """The namespace a nested namespace is created in, which must exist (the store locks it against a drop)."""
    return (REALM, CATALOG, join_namespace(ns[:-1])) if len(ns) > 1 else None
