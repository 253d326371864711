"""The proposals an Iceberg table's actor decides (`decide(state) -> Decision`, pure against its state): load,
commit, drop, rename, replace a view; and a new table's or view's creation (`creation`), which the registry
inserts instead. Thin glue: the rules are `rules/`'s, the files `files.py`'s.
"""

from __future__ import annotations

import functools
import sys
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

import orjson

from storage.files import is_below, join
from storage.records import IdempotencyRecord, LogEntry, TableRow

from coordinator.crossable import crossing
from coordinator.decision import Change, Decision, NewTable
from coordinator.errors import CommitConflict, NameMoved
from coordinator.events import name_parts
from coordinator.idempotency import IdempotencyKey
from coordinator.name_limits import check_table_key
from coordinator.purges import purge_after_drop

from . import rebase
from .files import delete_after_commit, gc_enabled, reachable_files, metadata_file_name, metadata_version, not_purged, \
    purge_named_files
from . import changes as _changes, manifest_lists as _manifest_lists, models as _models, state as _state
from .rules import apply_commit, apply_view_commit, views as _views
from .rules.catalog import check_moved
from .rows import FORMAT, REALM, VIEW_FORMAT
from .state import IcebergTable, TableIdent, UnreadableTable, row_state, serialize_metadata


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class LoadTable:
    ident: TableIdent

    def decide(self, state: IcebergTable) -> Decision:
        check_ident(state, self.ident)
        return Decision(state, reply=state)


@dataclass
class CommitTable:
    counts_as_commit = True  # a change to the table's contents: counted and timed per outcome (/metrics)
    ident: TableIdent
    requirements: list
    updates: list
    idempotency_key: IdempotencyKey | None = None

    files: Any = None  # FileIO, for `write.metadata.delete-after-commit.enabled`
    warehouse: str | None = None  # where `set-location` may move the table, and what clean-up may delete
    read: rebase.ReadLists | None = None  # what the service read to rebase this append (rebase.py)

    def decide(self, state: IcebergTable) -> Decision:
        check_ident(state, self.ident)
        try:
            new = apply_commit(state.metadata, self.requirements, self.updates,
                               base_location=state.metadata_location, now_ms=now_ms())
        except CommitConflict as conflict:
            return self._rebased(state, conflict)
        if new is state.metadata:
            return Decision(state, reply=state)  # nothing changed: no new metadata file
        check_moved(self.warehouse, state.metadata, new)
        data, list_json = serialize_metadata(new, state)
        return next_version(state, new, data, list_json, self.idempotency_key,
                            after_durable=delete_after_commit(self.files, state, new, self.warehouse),
                            rebased=state.rebased)   # (lists never change: still right after any commit)

    def _rebased(self, state: IcebergTable, conflict: CommitConflict) -> Decision:
        """An append whose branch moved on, on the head as it is now (rebase.py); `conflict` if it is not one."""
        append = rebase.append_of(state.metadata, self.requirements, self.updates)
        if append is None:
            raise conflict
        done = rebase.rebase(state.metadata, append, self.read, state.rebased, conflict,
                             location=state.metadata["location"])
        new = apply_commit(state.metadata, done.requirements, done.updates, base_location=state.metadata_location,
                           now_ms=now_ms())
        data, list_json = serialize_metadata(new, state)
        decision = next_version(state, new, data, list_json, self.idempotency_key,
                                after_durable=delete_after_commit(self.files, state, new, self.warehouse),
                                rebased=done.kept(state.rebased))
        # (the new manifest list before the metadata that names it, from within the table's place)
        decision.files.insert(0, (done.list_location, done.list_data, None, state.metadata["location"]))
        return decision


@dataclass
class DropTable:
    ident: TableIdent
    purge: bool
    files: Any
    idempotency_key: IdempotencyKey | None = None
    warehouse: str | None = None  # purge deletes only what lies below it
    store: Any = None             # purge asks it whether the location is still the table's own
    kind: str = "table"           # or "view": what the commit feed says was dropped

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
        check_ident(state, self.ident, unreadable_ok=True)
        after = claim = None
        if self.purge and self.warehouse is not None and isinstance(state, IcebergTable):
            location = state.metadata.get("location")
            if not (location and is_below(self.warehouse, location)):
                after = functools.partial(not_purged, state.ident, location)
            elif gc_enabled(state.metadata):
                claim, after = purge_after_drop(self.store, self.files, location,
                                                None if state.owns_location else state.metadata_location,
                                                reachable_files)
            else:
                after = functools.partial(purge_named_files, self.files, self.store, location, state)
        return Decision(None, reply=None, delete=True, after_durable=after, purge=claim,
                        idempotency=idempotency_record(self.idempotency_key, 204, None),
                        changes=[feed_change(self.kind, "dropped", state.metadata_location)])


@dataclass
class RenameTable:
    ident: TableIdent
    to: TableIdent
    idempotency_key: IdempotencyKey | None = None

    def decide(self, state: IcebergTable) -> Decision:
        check_ident(state, self.ident)
        check_table_key(self.to.catalog, self.to.ns_path, self.to.name)
        was = self.ident
        return Decision(replace(state, ident=self.to), reply=None,
                        rename=(self.to.catalog, self.to.ns_path, self.to.name),
                        idempotency=idempotency_record(self.idempotency_key, 204, None),
                        changes=[feed_change(kind_of(state.metadata), "renamed", state.metadata_location,
                                             {"previous-name": name_parts(was.catalog, was.ns_path, was.name)})])


@dataclass
class ReplaceView:
    ident: TableIdent
    requirements: list
    updates: list
    idempotency_key: IdempotencyKey | None = None

    warehouse: str | None = None  # where `set-location` may move the view

    def decide(self, state: IcebergTable) -> Decision:
        check_ident(state, self.ident)
        new = apply_view_commit(state.metadata, self.requirements, self.updates, now_ms=now_ms())
        if new is state.metadata:
            return Decision(state, reply=state)
        check_moved(self.warehouse, state.metadata, new)
        return next_version(state, new, orjson.dumps(new), {}, self.idempotency_key)


def next_version(state: IcebergTable, new: dict[str, Any], data: bytes, list_json: dict,
                 idempotency_key: IdempotencyKey | None, after_durable=None, rebased: tuple = ()) -> Decision:
    """Write `new` (serialized as `data`) as the table's or view's next metadata file, under its location.
    `rebased`: the manifest lists the actor keeps for its next rebases (IcebergTable.rebased)."""
    version = metadata_version(state.metadata_location) + 1
    location = join(new["location"], "metadata", metadata_file_name(version))
    moved = new["location"] if new["location"] != state.metadata.get("location") else None
    owns = state.owns_location and moved is None   # moved (even back): the place may hold others' files now
    table = IcebergTable(state.ident, new, location, data, list_json, owns, rebased)
    return Decision(table, reply=table, row_state=row_state(location, owns),
                    changes=[feed_change(kind_of(new), "committed", location, main_moved(state.metadata, new))],
                    log=[LogEntry(version, {"operation": _new_snapshot_operation(state.metadata, new),
                                             "metadata-location": location, "previous": state.metadata_location,
                                             "last-updated-ms": new.get("last-updated-ms")})],
                    # (written from within the table's place: a link planted in `metadata/` leads nowhere)
                    files=[(location, data, None, new["location"])],
                    idempotency=idempotency_record(idempotency_key, 200, table), after_durable=after_durable,
                    relocate=moved)


def _new_snapshot_operation(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """The operation (append, overwrite, ...) of the snapshot a commit made current, for the commit's history;
    None when the current snapshot did not change. A new snapshot is the list's last: found without a scan."""
    current = new.get("current-snapshot-id")
    if current is None or current == old.get("current-snapshot-id"):
        return None
    snapshots = new.get("snapshots") or []
    if snapshots and snapshots[-1].get("snapshot-id") == current:
        return (snapshots[-1].get("summary") or {}).get("operation")
    return None


def creation(ident: TableIdent, metadata: dict[str, Any], table_uuid: str, metadata_location: str | None = None,
             kind: str = "table", owns_location: bool = False) -> NewTable:
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
    return NewTable(row, IcebergTable(ident, metadata, metadata_location, data, owns_location=owns_location),
                    row_state(metadata_location, owns_location),
                    [LogEntry(max(metadata_version(metadata_location), 0),
                              {"metadata-location": metadata_location, "previous": None,
                               "last-updated-ms": metadata.get("last-updated-ms")})],
                    files, changes=[feed_change(kind, "created", metadata_location, main_moved({}, metadata))])


def kind_of(metadata: dict[str, Any]) -> str:
    return "view" if "view-uuid" in metadata else "table"


def feed_change(kind: str, what: str, metadata_location: str, extra: dict[str, Any] | None = None) -> Change:
    """The commit feed's event: `iceberg.table.committed` (or `.view.`, `.created`, ...), with the number in the
    metadata file's name as the version."""
    return Change(f"{FORMAT}.{kind}.{what}", {"format": FORMAT, "version": max(metadata_version(metadata_location), 0),
                                             "metadata-location": metadata_location, **(extra or {})})


def main_moved(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """When the commit moved the `main` branch (the current snapshot): its `snapshot-id`, and that snapshot's
    `parent-snapshot-id` and `sequence-number` as committed (an append the actor rebased has a parent and number
    its client did not send); else nothing."""
    main = (new.get("refs") or {}).get("main", {}).get("snapshot-id", new.get("current-snapshot-id"))
    before = (old.get("refs") or {}).get("main", {}).get("snapshot-id", old.get("current-snapshot-id"))
    if main in (None, -1) or main == before:
        return {}
    snapshot = rebase.snapshot_of(new, main) or {}
    return {"snapshot-id": main, "parent-snapshot-id": snapshot.get("parent-snapshot-id"),
            "sequence-number": snapshot.get("sequence-number", 0)}


def check_ident(state: IcebergTable | UnreadableTable, ident: TableIdent, *, unreadable_ok: bool = False) -> None:
    # The name was resolved to an id before the request reached the actor; a rename since then means the
    # name no longer denotes this table.
    if state.ident != ident:
        raise NameMoved(f"Table does not exist: {ident}")
    if isinstance(state, UnreadableTable) and not unreadable_ok:
        raise state.refuse()


def idempotency_record(key: IdempotencyKey | None, status: int, table: IcebergTable | None
                       ) -> IdempotencyRecord | None:
    if key is None:
        return None
    # The answer is the whole metadata (megabytes at 10,000 snapshots): not stored, but rebuilt on replay from the
    # metadata file this change wrote, which no later change rewrites (`IcebergService.replay`).
    return key.record(status, None, body_ref=None if table is None else table.metadata_location)


# What an Iceberg request carries to its table's owner in a cluster, and the owner's answers (coordinator/crossable).
crossing(sys.modules[__name__], _changes, _manifest_lists, _models, rebase, _state, _views)
