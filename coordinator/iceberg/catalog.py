"""The Iceberg REST catalog's operations, behind the HTTP layer and in front of the table actors.

Namespaces are plain rows (no commit sequencing needed). Every table operation that reads or changes a table's
metadata is a proposal to that table's actor; a table that does not exist yet (create, register, the
stage-create + `assert-create` commit) is inserted through the registry's `create`, where the unique name is
the compare-and-set.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable

import orjson
import trio

from storage import errors as storage_errors
from storage.errors import FileMissing
from storage.files import is_below, is_within, join, path_segment, unsafe_location
from storage.records import NAMESPACE_SEP, IdempotencyRecord, LogEntry, TableRow, join_namespace, split_namespace

from ..decision import Decision
from ..decision import Compaction, NewTable as Create
from ..purges import purge_after_drop
from ..errors import (AlreadyExists, AppliedReplyLost, BadRequest, CommitConflict, NotFound, Unavailable,
                      location_taken)
from ..idempotency import IdempotencyKey
from ..paging import decode_page_token, one_more, page
from ..placement import check_namespace_directory_free, check_no_namespace_inside

from . import apply_commit, check_requirements, new_table_metadata
from .models import AssertCreate, SetLocationUpdate
from .views import apply_view_commit, check_view_requirements, new_view_metadata

log = logging.getLogger(__name__)

REALM = "iceberg"
FORMAT = "iceberg"
VIEW_FORMAT = "iceberg-view"
COMMIT_TABLE_ROUTE = "commit-table"  # the one route answered with CommitTableResponse, not LoadResult


class Unprocessable(BadRequest):
    """Well-formed but contradictory, e.g. a property key both updated and removed: the spec answers 422
    (UnprocessableEntityException) there. Nothing applied, as for any BadRequest."""

    status = 422


@dataclass(frozen=True)
class TableIdent:
    catalog: str                # the REST `{prefix}`, "" when none
    namespace: tuple[str, ...]
    name: str

    @property
    def ns_path(self) -> str:
        return join_namespace(self.namespace)

    def __str__(self) -> str:
        return ".".join([*self.namespace, self.name])


# The metadata lists that grow with every commit. Their JSON is kept between commits and extended by appending
# only the new entries, so a commit to a table with 10,000 snapshots copies bytes instead of re-serializing them.
GROWING_LISTS = ("snapshots", "snapshot-log")


def _extends(new: list, old: list) -> bool:
    """Whether `new` is `old` with entries appended. These lists are only ever appended to or filtered in order
    (remove-snapshots, snapshot-log reconciliation), never reordered, and entries are copied on write, never
    edited: so if `new[n-1]` is the very object `old[n-1]`, nothing before it was removed and `new[:n]` holds
    exactly `old`'s objects. An O(1) test instead of comparing 10,000 entries."""
    n = len(old)
    return n > 0 and len(new) > n and new[n - 1] is old[n - 1] and new[0] is old[0]


def _list_parts(new: list, cached: tuple[list, memoryview] | None) -> list:
    """The JSON of a growing list as parts for one join: the previous commit's bytes (a view into its metadata
    file, not a copy) plus the new entries, or the whole list serialized."""
    if cached is not None:
        old, old_json = cached
        if new is old:
            return [old_json]
        if _extends(new, old):
            return [old_json[:-1], b",", orjson.dumps(new[len(old):])[1:]]
    return [orjson.dumps(new)]


def serialize_metadata(metadata: dict[str, Any], previous: "IcebergTable | None") -> tuple[bytes, dict]:
    """The metadata file's bytes, plus where each growing list's JSON lies in them, kept for the next commit.
    Lists are shared with the previous state by copy-on-write, so identity tells which entries are old. The file
    is assembled in one join: the cost of a commit to a table with 10,000 snapshots is one copy of its bytes."""
    lists = [k for k in GROWING_LISTS if isinstance(metadata.get(k), list) and metadata[k]]
    if not lists:
        return orjson.dumps(metadata), {}
    head = orjson.dumps({k: v for k, v in metadata.items() if k not in lists})
    parts: list = [head[:-1]]
    spans: dict[str, tuple[int, int]] = {}
    size = len(head) - 1
    for i, key in enumerate(lists):
        label = (b"," if i or len(head) > 2 else b"") + b'"' + key.encode() + b'":'
        parts.append(label)
        size += len(label)
        start = size
        for part in _list_parts(metadata[key], previous.list_json.get(key) if previous is not None else None):
            parts.append(part)
            size += len(part)
        spans[key] = (start, size)
    parts.append(b"}")
    data = b"".join(parts)
    view = memoryview(data)
    return data, {key: (metadata[key], view[a:b]) for key, (a, b) in spans.items()}


@dataclass(frozen=True)
class IcebergTable:
    """A table's in-memory state: its current metadata, where it was written, and its serialized JSON (kept so
    loads never re-serialize). `list_json` holds the JSON of the growing lists for the next commit.
    `owns_location`: the table lives in the directory the service gave it at creation and never left it, so
    nothing but its own files can be there (a purge deletes the whole tree; see DropTable)."""

    ident: TableIdent
    metadata: dict[str, Any]
    metadata_location: str
    metadata_json: bytes
    list_json: dict[str, tuple[list, memoryview]] = field(default_factory=dict, compare=False, repr=False)
    owns_location: bool = field(default=False, compare=False)

    def __reduce__(self):
        # Between cluster members (coordinator/cluster/channel.py) the JSON bytes are the compact form, and
        # `list_json` (a cache for the owner's next commit) stays behind.
        return _received_table, (self.ident, self.metadata_location, self.metadata_json, self.owns_location)

    @property
    def etag(self) -> str:
        """Each metadata file is written once, so its location identifies the content."""
        return '"' + hashlib.sha256(self.metadata_location.encode()).hexdigest()[:32] + '"'

    def refs_only(self) -> "IcebergTable":
        """`snapshots=refs`: only snapshots referenced by a branch or tag; the snapshot-log stays whole."""
        keep = {ref["snapshot-id"] for ref in self.metadata.get("refs", {}).values()}
        meta = {**self.metadata, "snapshots": [s for s in self.metadata.get("snapshots", [])
                                               if s["snapshot-id"] in keep]}
        return IcebergTable(self.ident, meta, self.metadata_location, orjson.dumps(meta),
                            owns_location=self.owns_location)

    def load_result(self) -> list[bytes]:
        """`LoadTableResult` as JSON, in parts around the cached metadata bytes (`_result_json`)."""
        return _result_json(self.metadata_location, self.metadata_json, _LOAD_TAIL)

    def commit_result(self) -> list[bytes]:
        """`CommitTableResponse`: the same without `config`."""
        return _result_json(self.metadata_location, self.metadata_json, _COMMIT_TAIL)


_LOAD_TAIL, _COMMIT_TAIL = b',"config":{}}', b"}"


def _result_json(metadata_location: str, metadata_json: bytes, tail: bytes) -> list[bytes]:
    """A result's JSON as parts, not joined: the metadata is megabytes at 10,000 snapshots, and the HTTP layer
    sends a large answer part by part (`api.common.json_response`) rather than copy it once more."""
    return [b'{"metadata-location":' + orjson.dumps(metadata_location) + b',"metadata":', metadata_json, tail]


def answer_json(route: str, metadata_location: str, metadata_json: bytes) -> list[bytes]:
    """What a table or view route answers: a table commit CommitTableResponse, the others LoadResult."""
    return _result_json(metadata_location, metadata_json, _COMMIT_TAIL if route == COMMIT_TABLE_ROUTE else _LOAD_TAIL)


class _ReceivedTable(IcebergTable):
    """A table state that came from another member: its dict is parsed from the bytes only if something asks for
    it. A forwarded commit is answered with the bytes alone, and parsing them anyway was ~5% of a member's CPU."""

    @functools.cached_property
    def metadata(self) -> dict[str, Any]:  # type: ignore[override]
        return orjson.loads(self.metadata_json)


def _received_table(ident: TableIdent, metadata_location: str, metadata_json: bytes,
                    owns_location: bool = False) -> IcebergTable:
    table = object.__new__(_ReceivedTable)
    for name, value in (("ident", ident), ("metadata_location", metadata_location),
                        ("metadata_json", metadata_json), ("list_json", {}), ("owns_location", owns_location)):
        object.__setattr__(table, name, value)
    return table


def _ident_of(row: TableRow) -> TableIdent:
    return TableIdent(row.catalog, split_namespace(row.namespace), row.name)


def _expand(row: TableRow, data: bytes) -> IcebergTable:
    """A table's state from its row and the bytes of its current metadata file (read, or kept while idle)."""
    return IcebergTable(_ident_of(row), orjson.loads(data), row.state["metadata-location"], data,
                        owns_location=row.state.get(OWN_LOCATION) is True)


OWN_LOCATION = "own-location"   # in a table row's state: IcebergTable.owns_location (absent: False)


def _row_state(metadata_location: str, owns_location: bool) -> dict[str, Any]:
    return {"metadata-location": metadata_location, **({OWN_LOCATION: True} if owns_location else {})}


@dataclass(frozen=True)
class UnreadableTable:
    """A table whose current metadata file is gone or not JSON (removed or damaged behind the catalog's back). It
    cannot be loaded or committed to until the file is restored, but it can be dropped: otherwise nothing, not
    even its namespace, could ever be removed through the API."""

    ident: TableIdent
    metadata_location: str
    reason: str

    def refuse(self) -> Unavailable:
        # (reload: the actor reads the file again before a later request, so a restored file serves at once)
        return Unavailable(f"table {self.ident}'s metadata file {self.metadata_location} cannot be read "
                           f"({self.reason}): restore the file, or drop the table", retry_after_s=30, reload=True)


# An idle table keeps only its metadata file's bytes (a tenth of the parsed dict's size); an unreadable one is
# not kept (None), so that a restored file is read again.
COMPACTION = Compaction(compact=lambda t: t.metadata_json if isinstance(t, IcebergTable) else None, expand=_expand)


def metadata_file_name(version: int) -> str:
    return f"{version:05d}-{uuid.uuid4()}.metadata.json"


def metadata_version(location: str) -> int:
    """The NNNNN of `.../metadata/NNNNN-<uuid>.metadata.json`; -1 for names not written by us."""
    name = location.rsplit("/", 1)[-1]
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- proposals (pure decisions against the actor's state) ----------------------------------------------------


@dataclass
class LoadTable:
    ident: TableIdent

    def decide(self, state: IcebergTable) -> Decision:
        _check_ident(state, self.ident)
        return Decision(state, reply=state)


@dataclass
class CommitTable:
    ident: TableIdent
    requirements: list
    updates: list
    idempotency_key: IdempotencyKey | None = None

    files: Any = None  # FileIO, for `write.metadata.delete-after-commit.enabled`
    warehouse: str | None = None  # where `set-location` may move the table, and what clean-up may delete

    def decide(self, state: IcebergTable) -> Decision:
        _check_ident(state, self.ident)
        new = apply_commit(state.metadata, self.requirements, self.updates,
                           base_location=state.metadata_location, now_ms=_now_ms())
        if new is state.metadata:
            return Decision(state, reply=state)  # nothing changed: no new metadata file
        _check_moved(self.warehouse, state.metadata, new)
        data, list_json = serialize_metadata(new, state)
        return _next_version(state, new, data, list_json, self.idempotency_key,
                             after_durable=_delete_after_commit(self.files, state, new, self.warehouse))


@dataclass
class DropTable:
    ident: TableIdent
    purge: bool
    files: Any
    idempotency_key: IdempotencyKey | None = None
    warehouse: str | None = None  # purge deletes only what lies below it
    store: Any = None             # purge asks it whether the location is still the table's own

    def decide(self, state: IcebergTable | UnreadableTable) -> Decision:
        """purgeRequested: "purge the underlying table's data and metadata", once the drop is durable. Java
        (`CatalogUtil.dropTableData`) deletes every file the metadata reaches. Here only what lies in the table's
        own location is deleted: every path in the metadata (manifest lists, statistics, the metadata log of a
        registered table) is the client's word, and a purge must never reach another table's files. Then:
        - with `gc.enabled` (Java's guard: false when data files may be shared with another table), data,
          manifests and metadata (`delete_own_location`: only while no other table is at, above or below it).
          The location is claimed until then (Decision.purge). In a location the service gave the table and that
          it never left (IcebergTable.owns_location) that is the whole tree; in any other (chosen by the client,
          registered, or moved to) only the files the metadata reaches (PurgeClaim.metadata_location), as Java
          does: such a place may also hold files of a table that moved away from it or was dropped without purge;
        - without, the files the metadata names there (metadata files, manifest lists, statistics), not data
          files: unique names no new table writes, so nothing is claimed.
        Files outside the location (a table moved by `set-location` leaves its older ones behind) stay."""
        _check_ident(state, self.ident, unreadable_ok=True)
        after = claim = None
        if self.purge and self.warehouse is not None and isinstance(state, IcebergTable):
            location = state.metadata.get("location")
            if not (location and is_below(self.warehouse, location)):
                after = functools.partial(_not_purged, state.ident, location)
            elif _gc_enabled(state.metadata):
                claim, after = purge_after_drop(self.store, self.files, location,
                                                None if state.owns_location else state.metadata_location)
            else:
                after = functools.partial(_purge_named_files, self.files, self.store, location, state)
        return Decision(None, reply=None, delete=True, after_durable=after, purge=claim,
                        idempotency=_idempotency(self.idempotency_key, 204, None))


async def _not_purged(ident: TableIdent, location: str | None) -> None:
    log.warning("purge of %s: location %s is not below the warehouse; no files deleted", ident, location)


async def _purge_named_files(files, store, location: str, table: IcebergTable) -> None:
    """A purge with `gc.enabled=false` (DropTable): the files the metadata names in the table's location."""
    if await store.location_taken(location):
        log.warning("purge of %s: another table lives at, above or below %s; no files deleted", table.ident,
                    location)
        return
    meta = table.metadata
    named = [table.metadata_location, *(e.get("metadata-file") for e in meta.get("metadata-log", [])),
             *(s.get("manifest-list") for s in meta.get("snapshots", [])),
             *(f.get("statistics-path") for f in (*meta.get("statistics", []), *meta.get("partition-statistics", [])))]
    # As any purge of listed files: only within the location (links included), paths naming nothing skipped.
    await trio.to_thread.run_sync(files.delete_listed_sync, location, [u for u in named if isinstance(u, str)])


def _gc_enabled(metadata: dict[str, Any]) -> bool:
    """Java's `gc.enabled` guard: false when data files may be shared with another table."""
    return str(metadata.get("properties", {}).get("gc.enabled", "true")).lower() != "false"

@dataclass
class RenameTable:
    ident: TableIdent
    to: TableIdent
    idempotency_key: IdempotencyKey | None = None

    def decide(self, state: IcebergTable) -> Decision:
        _check_ident(state, self.ident)
        return Decision(replace(state, ident=self.to), reply=None,
                        rename=(self.to.catalog, self.to.ns_path, self.to.name),
                        idempotency=_idempotency(self.idempotency_key, 204, None))


@dataclass
class ReplaceView:
    ident: TableIdent
    requirements: list
    updates: list
    idempotency_key: IdempotencyKey | None = None

    warehouse: str | None = None  # where `set-location` may move the view

    def decide(self, state: IcebergTable) -> Decision:
        _check_ident(state, self.ident)
        new = apply_view_commit(state.metadata, self.requirements, self.updates, now_ms=_now_ms())
        if new is state.metadata:
            return Decision(state, reply=state)
        _check_moved(self.warehouse, state.metadata, new)
        return _next_version(state, new, orjson.dumps(new), {}, self.idempotency_key)


def _next_version(state: IcebergTable, new: dict[str, Any], data: bytes, list_json: dict,
                  idempotency_key: IdempotencyKey | None, after_durable=None) -> Decision:
    """Write `new` (serialized as `data`) as the table's or view's next metadata file, under its location."""
    version = metadata_version(state.metadata_location) + 1
    location = join(new["location"], "metadata", metadata_file_name(version))
    moved = new["location"] if new["location"] != state.metadata.get("location") else None
    owns = state.owns_location and moved is None   # moved (even back): the place may hold others' files now
    table = IcebergTable(state.ident, new, location, data, list_json, owns)
    return Decision(table, reply=table, row_state=_row_state(location, owns),
                    log=[LogEntry(version, {"metadata-location": location, "previous": state.metadata_location})],
                    # (written from within the table's place: a link planted in `metadata/` leads nowhere)
                    files=[(location, data, None, new["location"])],
                    idempotency=_idempotency(idempotency_key, 200, table), after_durable=after_durable, relocate=moved)


def _creation(ident: TableIdent, metadata: dict[str, Any], table_uuid: str, metadata_location: str | None = None,
              kind: str = "table", owns_location: bool = False) -> Create:
    """A new table's or view's row, state, first log entry and metadata file (none when `metadata_location`
    names an existing file: register). `owns_location`: its location is the one `default_location` gave it."""
    data = orjson.dumps(metadata)
    files = []
    if metadata_location is None:
        metadata_location = join(metadata["location"], "metadata", metadata_file_name(0))
        files = [(metadata_location, data)]
    row = TableRow(table_id=uuid.UUID(table_uuid), realm=REALM, catalog=ident.catalog, namespace=ident.ns_path,
                   name=ident.name, format=FORMAT if kind == "table" else VIEW_FORMAT,
                   location=metadata["location"], kind=kind)
    return Create(row, IcebergTable(ident, metadata, metadata_location, data, owns_location=owns_location),
                  _row_state(metadata_location, owns_location),
                  [LogEntry(max(metadata_version(metadata_location), 0),
                            {"metadata-location": metadata_location, "previous": None})],
                  files)


def _name_taken(row: TableRow | None, ident: TableIdent, kind: str) -> AlreadyExists:
    """A create (or rename) of a `kind` refused for its name: which kind holds it, in Java's words (a view's name
    is taken by a table: "Table with same name already exists"), so that the client looks for the right object."""
    if row is not None and row.kind != kind:
        return AlreadyExists(f"{row.kind.capitalize()} with same name already exists: {ident}", kind=row.kind)
    return AlreadyExists(f"{kind.capitalize()} already exists: {ident}", kind=kind)


def _creates_table(requirements: list) -> bool:
    """`assert-create`: the change creates its table (the create transaction after a stage-create)."""
    return any(isinstance(r, AssertCreate) for r in requirements)


def _refusal(location: str | None, warehouse: str) -> BadRequest:
    """Why table files may not go to `location`: it is unsafe in itself, or outside the warehouse."""
    why = unsafe_location(location or "")
    return BadRequest(f"location {location!r} is refused: {why}" if why else
                      f"location {location!r} is not below the warehouse {warehouse!r}")


def _check_moved(warehouse: str | None, old: dict[str, Any], new: dict[str, Any]) -> None:
    """`set-location` moves where the next metadata files are written: only to a place below the warehouse."""
    location = new.get("location")
    if warehouse is not None and location != old.get("location") and not is_within(warehouse, location or ""):
        raise _refusal(location, warehouse)


def _delete_after_commit(fileio, old: IcebergTable, new: dict[str, Any], warehouse: str | None = None):
    """`write.metadata.delete-after-commit.enabled`: once the new metadata is durable, delete the metadata
    files that fell off the metadata-log (trimmed to `write.metadata.previous-versions-max`). Only those in the
    table's own location (now, or before this commit moved it), and through the guards of any purge of listed
    files: a registered table's log is the client's word and may name another table's current metadata."""
    if fileio is None or warehouse is None or new.get("properties", {}).get(
            "write.metadata.delete-after-commit.enabled", "false").lower() != "true":
        return None
    kept = {e["metadata-file"] for e in new.get("metadata-log", [])}
    dropped = [e["metadata-file"] for e in old.metadata.get("metadata-log", []) if e["metadata-file"] not in kept]
    if old.metadata_location not in kept:
        dropped.append(old.metadata_location)
    places = {loc for loc in (new.get("location"), old.metadata.get("location"))
              if isinstance(loc, str) and is_below(warehouse, loc)}
    batches = [(place, [u for u in dropped if isinstance(u, str) and is_within(place, u)]) for place in places]
    batches = [(place, uris) for place, uris in batches if uris]
    if not batches:
        return None

    async def delete() -> None:
        for place, uris in batches:
            await trio.to_thread.run_sync(fileio.delete_listed_sync, place, uris)
    return delete


def _check_ident(state: IcebergTable | UnreadableTable, ident: TableIdent, *, unreadable_ok: bool = False) -> None:
    # The name was resolved to an id before the request reached the actor; a rename since then means the
    # name no longer denotes this table.
    if state.ident != ident:
        raise NotFound(f"Table does not exist: {ident}", kind="table-moved")
    if isinstance(state, UnreadableTable) and not unreadable_ok:
        raise state.refuse()


def _idempotency(key: IdempotencyKey | None, status: int, table: IcebergTable | None) -> IdempotencyRecord | None:
    if key is None:
        return None
    # The answer is the whole metadata (megabytes at 10,000 snapshots): not stored, but rebuilt on replay from the
    # metadata file this change wrote, which no later change rewrites (`IcebergCatalog.replay`).
    return key.record(status, None, body_ref=None if table is None else table.metadata_location)


# -- the catalog ---------------------------------------------------------------------------------------------


class IcebergCatalog:
    def __init__(self, coordinator):
        self.c = coordinator
        self.store = coordinator.store
        self.registry = coordinator.registry
        self.files = coordinator.files
        self.registry.register_format(FORMAT, self._load_state, COMPACTION)
        self.registry.register_format(VIEW_FORMAT, self._load_state, COMPACTION)
        self._ids: dict[tuple[TableIdent, str], uuid.UUID] = {}

    @property
    def warehouse(self) -> str:
        return self.c.config.warehouse_uri

    async def _load_state(self, row: TableRow) -> IcebergTable | UnreadableTable:
        location = row.state["metadata-location"]
        try:
            return _expand(row, await self.files.read(location))
        except (NotFound, FileMissing, orjson.JSONDecodeError) as exc:   # other errors (storage unreachable): raised
            log.error("table %s.%s: metadata file %s cannot be read: %s", row.namespace, row.name, location, exc)
            return UnreadableTable(_ident_of(row), location,
                                   "missing" if isinstance(exc, (NotFound, FileMissing)) else "not valid JSON")

    # -- namespaces --------------------------------------------------------------------------------------------

    async def create_namespace(self, catalog: str, namespace: tuple[str, ...], properties: dict[str, str],
                               idempotency_key: IdempotencyKey | None = None) -> dict[str, Any]:
        _check_namespace(namespace)
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
        except (NotFound, storage_errors.NamespaceMissing):
            raise NotFound(f"Parent namespace does not exist: {'.'.join(namespace[:-1])}; create it before "
                           f"{'.'.join(namespace)}", kind="namespace") from None
        return result

    async def load_namespace(self, catalog: str, namespace: tuple[str, ...]) -> dict[str, str]:
        props = await self.store.get_namespace(REALM, catalog, join_namespace(namespace))
        if props is None:
            raise NotFound(f"Namespace does not exist: {'.'.join(namespace)}", kind="namespace")
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
        await self.store.drop_namespace(REALM, catalog, join_namespace(namespace), idempotency=record)

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
        await self.store.update_namespace_properties(REALM, catalog, join_namespace(namespace), removals, updates,
                                                     record)
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

    async def _resolve(self, ident: TableIdent, kind: str = "table") -> uuid.UUID:
        table_id = self._ids.get((ident, kind))
        if table_id is None:
            row = await self.store.find_table(REALM, ident.catalog, ident.ns_path, ident.name)
            if row is None or row.kind != kind:
                raise NotFound(f"{kind.capitalize()} does not exist: {ident}", kind=kind)
            table_id = row.table_id
            if len(self._ids) > 100_000:
                self._ids.clear()
            self._ids[(ident, kind)] = table_id
        return table_id

    async def _submit(self, ident: TableIdent, make_proposal, kind: str = "table") -> Any:
        """Resolve the name and hand the proposal to the table's actor; re-resolve once if the name moved."""
        for attempt in (0, 1):
            table_id = await self._resolve(ident, kind)
            try:
                return await self.registry.submit(table_id, make_proposal())
            except NotFound as exc:
                self._ids.pop((ident, kind), None)
                if attempt or exc.kind not in ("table-moved", "table"):
                    raise NotFound(f"{kind.capitalize()} does not exist: {ident}", kind=kind) from None

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

    async def table_exists(self, ident: TableIdent) -> bool:
        try:
            await self.load_table(ident)
            return True
        except NotFound:
            return False

    def namespace_dir(self, ident: TableIdent) -> str:
        # Names become directory names only through path_segment: a namespace `..` or a prefix `%2e%2e` must not
        # lead out of the warehouse, and `?` or `#` must not cut the URI short. A prefix's directory ends in `~`,
        # which no namespace level's does: prefix `x` with namespace `n` and namespace `x.n` are two places.
        prefix = [path_segment(ident.catalog) + "~"] if ident.catalog else []
        return join(self.warehouse, *prefix, *(path_segment(level) for level in ident.namespace))

    def default_location(self, ident: TableIdent, table_uuid: str) -> str:
        """A directory of the table's own, named after a table-uuid generated by the service (never the client's:
        a directory no table had before)."""
        name = f"{path_segment(ident.name)}-{uuid.UUID(table_uuid).hex}"
        return self.check_location(join(self.namespace_dir(ident), name))

    def check_location(self, location: str, ident: TableIdent | None = None) -> str:
        """A place for `ident`'s files: below the warehouse (never the warehouse itself, which would hold every
        other table) and, with authentication on, inside its namespace's directory, so that a client's files stay
        where its namespace grants reach: one with `create` in one namespace cannot claim, or read through a
        register, another namespace's place."""
        location = location.rstrip("/")
        if not is_below(self.warehouse, location):
            raise _refusal(location, self.warehouse)
        if ident is not None and self.c.auth is not None:
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
        await check_no_namespace_inside(self.store, self.warehouse, location, ident.catalog)
        return location

    async def _check_creatable(self, ident: TableIdent) -> None:
        """A new table or view (created, registered or renamed to) needs a valid name in an existing namespace."""
        _check_name(ident.name)
        await self.load_namespace(ident.catalog, ident.namespace)

    async def create_table(self, ident: TableIdent, *, schema: dict, location: str | None,
                           partition_spec: dict | None, write_order: dict | None, properties: dict[str, str],
                           stage_create: bool, idempotency_key: IdempotencyKey | None = None) -> IcebergTable:
        await self._check_creatable(ident)
        table_uuid = str(uuid.uuid4())
        owns = not location
        location = await self._check_chosen(location, ident) if location else self.default_location(ident, table_uuid)
        metadata = new_table_metadata(location=location, schema=schema, partition_spec=partition_spec,
                                      sort_order=write_order, properties=properties,
                                      format_version=_format_version(properties), table_uuid=table_uuid,
                                      now_ms=_now_ms())
        if stage_create:
            # Nothing is written: the client commits the table later with `assert-create`.
            return IcebergTable(ident, metadata, "", orjson.dumps(metadata))
        return await self._insert(ident, metadata, table_uuid, idempotency_key, owns_location=owns)

    async def _insert(self, ident: TableIdent, metadata: dict, table_uuid: str,
                      idempotency_key: IdempotencyKey | None, metadata_location: str | None = None,
                      kind: str = "table", owns_location: bool = False) -> IcebergTable:
        new = _creation(ident, metadata, table_uuid, metadata_location, kind, owns_location)
        try:
            await self.registry.create(new.row, state=new.state, row_state=new.row_state, log_entries=new.log,
                                       files=new.files, idempotency=_idempotency(idempotency_key, 200, new.state))
        except AlreadyExists:
            row = await self.store.find_table(REALM, ident.catalog, ident.ns_path, ident.name)
            raise _name_taken(row, ident, kind) from None
        self._ids[(ident, kind)] = new.row.table_id
        return new.state

    async def register_table(self, ident: TableIdent, metadata_location: str,
                             idempotency_key: IdempotencyKey | None = None) -> IcebergTable:
        await self._check_creatable(ident)
        # Only files in the warehouse are read (the answer would otherwise tell which files exist anywhere the
        # service can read), and only tables located there are taken (their commits write metadata there).
        self.check_location(metadata_location, ident)
        try:
            metadata = orjson.loads(await self.files.read(metadata_location))
        except (NotFound, FileMissing):
            raise BadRequest(f"metadata-location does not exist: {metadata_location}") from None
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"metadata-location is not valid JSON: {exc}") from None
        if not isinstance(metadata, dict) or not isinstance(metadata.get("table-uuid"), str) \
                or not isinstance(metadata.get("location"), str):
            raise BadRequest("metadata-location does not hold Iceberg table metadata")
        try:
            uuid.UUID(metadata["table-uuid"])
        except ValueError:
            raise BadRequest(f"table-uuid {metadata['table-uuid']!r} in metadata-location is not a UUID") from None
        await self._check_chosen(metadata["location"], ident)
        return await self._insert(ident, metadata, metadata["table-uuid"], idempotency_key,
                                  metadata_location=metadata_location)

    async def commit_table(self, ident: TableIdent, requirements: list, updates: list,
                           idempotency_key: IdempotencyKey | None = None) -> IcebergTable:
        if _creates_table(requirements):
            return await self._commit_create(ident, requirements, updates, idempotency_key)
        await self._check_relocation(ident, requirements, updates)
        try:
            return await self._submit(ident, lambda: CommitTable(ident, requirements, updates, idempotency_key,
                                                                 self.files, self.warehouse))
        except AppliedReplyLost:
            # Applied, but the owner's answer was lost: the table as it is now includes this commit (and perhaps
            # later ones), which is what a client refreshes to after a commit anyway.
            return await self.load_table(ident)

    async def _check_relocation(self, ident: TableIdent, requirements: list, updates: list,
                                kind: str = "table") -> None:
        """`set-location` onto, above or below another table's location: refused before any file is written
        there (the write checks again, under the lock every placement takes). The requirements are checked
        first, against the state now (the actor checks them again): as in Java's `CatalogHandlers.commit`, a
        failed requirement (409, refresh and retry) is the answer before anything the updates get wrong."""
        moves = [u for u in updates if isinstance(u, SetLocationUpdate) and is_within(self.warehouse, u.location)]
        if moves and requirements:   # (the others: no move, or one the commit itself refuses)
            if kind == "table":
                check_requirements((await self.load_table(ident)).metadata, requirements)
            else:
                check_view_requirements((await self.load_view(ident)).metadata, requirements)
        for u in moves:
            await self._check_chosen(u.location, ident)
            if await self.store.location_taken(u.location, exclude=await self._resolve(ident, kind)):
                raise location_taken(u.location)

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
        metadata = apply_commit(None, requirements, updates, base_location=None, now_ms=_now_ms(),
                                table_uuid=generated)
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
        raise _name_taken(row, ident, "table")

    async def commit_transaction(self, changes: list[tuple[TableIdent, list, list]],
                                 idempotency_key: IdempotencyKey | None = None) -> None:
        """All table changes apply atomically or none do (coordinator.transaction); `assert-create` changes
        create their table in the same database transaction."""
        if len(changes) > 1:
            await self._check_requirements_first(changes)
        parts, creates = [], []
        for ident, requirements, updates in changes:
            if _creates_table(requirements):
                metadata, owns = await self._create_transaction_metadata(ident, requirements, updates)
                creates.append(_creation(ident, metadata, metadata["table-uuid"], owns_location=owns))
                # Checked here, not in coordinator.transaction: a Lance batch may free a location (deregister) and
                # take it again (register) in one transaction, which only the insert's own check sees rightly.
                if await self.store.location_taken(metadata["location"]):  # before its files are written there
                    raise location_taken(metadata["location"])
            else:
                await self._check_relocation(ident, requirements, updates)
                parts.append((await self._resolve(ident), CommitTable(ident, requirements, updates,
                                                                      files=self.files, warehouse=self.warehouse)))
        record = idempotency_key.record(204) if idempotency_key else None
        try:
            await self.registry.transact(parts, creates=creates, idempotency=record)
        except NotFound as exc:
            if exc.kind == "table-moved":
                raise NotFound(str(exc), kind="table") from None
            raise
        for c in creates:
            self._ids[(c.state.ident, "table")] = c.row.table_id

    async def _check_requirements_first(self, changes: list[tuple[TableIdent, list, list]]) -> None:
        """Every change's requirements, in the order sent, before any change's updates: the actors validate their
        parts in table-id order, so a transaction with a table changed meanwhile (409: refresh and retry) could
        otherwise be answered 400 for another table's updates. Java's `CatalogHandlers` checks requirements before
        updates too. The actors check them again, while they hold their tables."""
        for ident, requirements, _ in changes:
            if _creates_table(requirements):
                await self._check_absent(ident)
                check_requirements(None, requirements)
            elif requirements:
                check_requirements((await self.load_table(ident)).metadata, requirements)

    async def report_metrics(self, ident: TableIdent, report: dict[str, Any]) -> None:
        table_id = await self._resolve(ident)
        await self.store.add_iceberg_report(table_id, report["report-type"], report)

    async def credentials(self, ident: TableIdent) -> list[dict[str, Any]]:
        """Vended storage credentials: none for local warehouses; the configured static S3 keys for s3://, but only
        while authentication is off. They are the service's own keys to the whole warehouse, so with grants in
        force they would let a reader of one table write or delete every other: clients then bring their own."""
        table = await self.load_table(ident)
        location = table.metadata["location"]
        opts = self.c.config.s3_options
        if not location.startswith(("s3://", "s3a://")) or "access_key_id" not in opts or self.c.auth is not None:
            return []
        config = {"s3.access-key-id": opts["access_key_id"], "s3.secret-access-key": opts["secret_access_key"]}
        for ours, theirs in (("endpoint", "s3.endpoint"), ("region", "client.region"),
                             ("session_token", "s3.session-token")):
            if ours in opts:
                config[theirs] = opts[ours]
        return [{"prefix": location, "config": config}]

    async def drop_table(self, ident: TableIdent, purge: bool, idempotency_key: IdempotencyKey | None = None) -> None:
        await self._submit(ident, lambda: DropTable(ident, purge, self.files, idempotency_key, self.warehouse,
                                                    self.store))
        self._ids.pop((ident, "table"), None)

    async def rename_table(self, source: TableIdent, dest: TableIdent,
                           idempotency_key: IdempotencyKey | None = None) -> None:
        await self._rename(source, dest, idempotency_key, "table")

    async def _rename(self, source: TableIdent, dest: TableIdent, idempotency_key: IdempotencyKey | None,
                      kind: str) -> None:
        await self._check_creatable(dest)
        row = await self.store.find_table(REALM, dest.catalog, dest.ns_path, dest.name)
        if row is not None:
            raise _name_taken(row, dest, kind)
        await self._submit(source, lambda: RenameTable(source, dest, idempotency_key), kind=kind)
        self._ids.pop((source, kind), None)

    # -- views -------------------------------------------------------------------------------------------------

    async def create_view(self, ident: TableIdent, *, schema: dict, view_version: dict, location: str | None,
                          properties: dict[str, str], idempotency_key: IdempotencyKey | None = None) -> IcebergTable:
        await self._check_creatable(ident)
        view_uuid = str(uuid.uuid4())
        location = await self._check_chosen(location, ident) if location else self.default_location(ident, view_uuid)
        metadata = new_view_metadata(view_uuid=view_uuid, location=location, schema=schema, version=view_version,
                                     properties=properties, now_ms=_now_ms())
        return await self._insert(ident, metadata, view_uuid, idempotency_key, kind="view")

    async def load_view(self, ident: TableIdent) -> IcebergTable:
        return await self._submit(ident, lambda: LoadTable(ident), kind="view")

    async def replace_view(self, ident: TableIdent, requirements: list, updates: list,
                           idempotency_key: IdempotencyKey | None = None) -> IcebergTable:
        await self._check_relocation(ident, requirements, updates, "view")
        return await self._submit(ident, lambda: ReplaceView(ident, requirements, updates, idempotency_key,
                                                             self.warehouse),
                                  kind="view")

    async def drop_view(self, ident: TableIdent, idempotency_key: IdempotencyKey | None = None) -> None:
        await self._submit(ident, lambda: DropTable(ident, False, self.files, idempotency_key), kind="view")
        self._ids.pop((ident, "view"), None)

    async def rename_view(self, source: TableIdent, dest: TableIdent,
                          idempotency_key: IdempotencyKey | None = None) -> None:
        await self._rename(source, dest, idempotency_key, "view")


def _format_version(properties: dict[str, str]) -> int | None:
    value = properties.get("format-version")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"properties.format-version must be an integer, got {value!r}") from None


def _check_name(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or "\x00" in name:
        raise BadRequest(f"invalid table name: {name!r}")


def _check_namespace(namespace: tuple[str, ...]) -> None:
    # A level with `/` could never be addressed: routing decodes the path's %2F before splitting it.
    if not namespace or any(not level or NAMESPACE_SEP in level or "/" in level or "\x00" in level
                            for level in namespace):
        raise BadRequest(f"invalid namespace: {list(namespace)!r}")
