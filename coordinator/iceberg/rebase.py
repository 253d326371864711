"""Concurrent appends to one Iceberg table, rebased by its actor instead of refused with 409.

An append names the snapshot it was built on (its `assert-ref-snapshot-id`). If another append landed first, the
spec's answer is 409: the client reloads, rewrites its manifest list on the new head and tries again, and once its
retries run out the append fails. Every commit of a table passes through one actor, in order, so the actor can do
that retry itself: an append only adds data files, and the snapshot it makes is the same on any head, its
manifests on top of the head's (Java's FastAppend does exactly this when it retries).

With the table property `commit.rebase-appends.enabled=true` (`coordinator serve --rebase-appends` sets it on new
tables), a commit is rebased when all of this holds, and answered 409 exactly as before otherwise:

- its updates are one `add-snapshot` whose summary's operation is `append` and one `set-snapshot-ref` of a branch
  to it, and the snapshot's parent is what it asserted the branch to be;
- the only requirement that fails is that `assert-ref-snapshot-id` on that branch (a first append to an empty
  table asserts the branch does not exist yet); every other one holds as sent;
- its manifest list holds its parent's manifests and data manifests of its own whose entries are all ADDED data
  files inheriting their sequence numbers: nothing it rewrote, deleted or merged.

The rebased snapshot keeps its id; its parent is the branch's head, its sequence number the table's last + 1, its
timestamp no earlier than the head's, its summary's totals recounted from the head's, and, in format v3, its
`first-row-id` is the table's `next-row-id` and `added-rows` what its new manifest list assigned. That new list is
written under a fresh name in `<location>/metadata/` (the head's manifests after the snapshot's own, which get the
commit's sequence number), made durable before the table's row as every commit's files are.

The files are read outside the actor (`read_for_rebase`, on a file thread), before the commit is offered: the
service asks `needed_on` of the state the table's actor expects (the one its write under way leaves, else the
durable one) whether the commit would be rebased there and what that needs read, reads it, and offers the commit
with what it read (`ReadLists`). The actor rebases it onto whatever the head is by then, checking again in its
order everything that was read: the commit's own manifests stay valid on any head, and a head whose list was not
read (it moved on meanwhile, or the service had no state to ask: another cluster member owns the table) makes the
actor raise `RebaseNeeded`, naming what to read; the service reads that and offers the commit again. The manifests of the lists the actor itself wrote are kept with the
table's state (`IcebergTable.rebased`), so appends in a row, or in one batch, need no further reads. Every file
read must lie below the table's location, be a regular file reached without a link and at most `MAX_LIST_BYTES`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import trio

from storage import errors as storage_errors
from storage.files import READ_TIMEOUT_S, is_below, join

from coordinator.errors import BadRequest, CommitConflict, Unavailable
from . import changes as m
from . import models
from .manifest_lists import DATA, Manifest, NotAvro, TooManyManifests, added_only, avro_codec, read_manifest_entries, \
    read_manifest_list, split_manifest_list, write_list, written_sequence_numbers
from .rules.builder import SNAPSHOT_INDEXES, implicit_refs
from .rules.requirements import check_requirements
from .state import IcebergTable

REBASE_PROPERTY = "commit.rebase-appends.enabled"
MAX_ATTEMPTS = 4             # offers of one commit with what was read, before its 409 stands (heads moving on)
MAX_LIST_BYTES = 64 << 20    # a manifest list or manifest the rebase reads
MAX_OWN_MANIFESTS = 64       # the snapshot's own manifests read and checked; an append with more is not rebased
MAX_LIST_MANIFESTS = 20_000  # entries of a manifest list a rebase holds (~0.5 KB each in memory); more: not rebased
KEPT_LISTS = 32              # manifest lists kept with the state (the parents of appends in flight: one per writer)
UNASSIGNED_SEQ = -1
NOT_REBASED = "not rebased"

# Java's SnapshotSummary totals: total = the parent's total + added - removed.
TOTALS = (("total-records", "added-records", "deleted-records"),
          ("total-files-size", "added-files-size", "removed-files-size"),
          ("total-data-files", "added-data-files", "deleted-data-files"),
          ("total-delete-files", "added-delete-files", "removed-delete-files"),
          ("total-position-deletes", "added-position-deletes", "removed-position-deletes"),
          ("total-equality-deletes", "added-equality-deletes", "removed-equality-deletes"))
FIRST_TOTALS = {total: "0" for total, _, _ in TOTALS}   # Java's totals of a table without a snapshot yet


def enabled(metadata: dict[str, Any]) -> bool:
    return str((metadata.get("properties") or {}).get(REBASE_PROPERTY, "")).strip().lower() == "true"


def with_default(properties: dict[str, str], default: bool) -> dict[str, str]:
    """A new table's properties, with `--rebase-appends` (`default`) unless its creator set the property."""
    return {**properties, REBASE_PROPERTY: "true"} if default and REBASE_PROPERTY not in properties else properties


# -- which commits are rebased ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Append:
    """A commit that can be rebased: its snapshot, the branch it moves, and its other requirements."""

    snapshot: models.Snapshot
    set_ref: m.SetSnapshotRefUpdate
    others: list

    @property
    def ref(self) -> str:
        return self.set_ref.ref_name


def append_of(base: dict[str, Any] | None, requirements: list, updates: list) -> Append | None:
    """The append this commit is, if it may be rebased on `base`: rebasing enabled, the shape above, its branch's
    `assert-ref-snapshot-id` failing and every other requirement holding; None otherwise (its 409 stands)."""
    if base is None or not enabled(base) or len(updates) != 2:
        return None
    add, set_ref = updates
    if not (isinstance(add, m.AddSnapshotUpdate) and isinstance(set_ref, m.SetSnapshotRefUpdate)):
        return None
    snapshot = add.snapshot
    if (snapshot.summary.get("operation") != "append" or set_ref.type != "branch"
            or set_ref.snapshot_id != snapshot.snapshot_id):
        return None
    asserts = [r for r in requirements if isinstance(r, m.AssertRefSnapshotId) and r.ref == set_ref.ref_name]
    if len(asserts) != 1 or asserts[0].snapshot_id != snapshot.parent_snapshot_id:
        return None
    head = _head(base, set_ref.ref_name)
    if head is None or head == asserts[0].snapshot_id:
        return None   # the branch is gone (nothing to rebase onto), or the assert holds: not this conflict
    others = [r for r in requirements if r is not asserts[0]]
    try:
        check_requirements(base, others)
    except CommitConflict:
        return None
    return Append(snapshot, set_ref, others)


def needed_on(state_metadata: dict[str, Any], kept: tuple, requirements: list, updates: list
              ) -> "RebaseNeeded | None":
    """What the actor's first decision of this commit would ask to be read (its RebaseNeeded) if the table were
    `state_metadata` (with the lists `kept`): None if the commit would not be rebased there, because its
    requirements hold (the common case, which must cost nearly nothing), or it is not a rebasable append, or
    the rebase refuses it (the actor then answers why). Pure; the service asks it before the first offer."""
    append = append_of(state_metadata, requirements, updates)
    if append is None:
        return None
    try:
        check_requirements(state_metadata, requirements)   # (fails: `append_of` found the branch's assert failing)
    except CommitConflict as conflict:   # the 409 the actor's first decision would answer, if not rebased
        try:
            rebase(state_metadata, append, None, kept, conflict, location=state_metadata["location"])
        except RebaseNeeded as needed:   # (nothing read yet: it always asks, unless it refuses)
            return needed
        except CommitConflict:
            pass
    return None


def _head(metadata: dict[str, Any], ref: str) -> int | None:
    refs = metadata.get("refs")
    entry = (implicit_refs(metadata) if refs is None else refs).get(ref)
    return None if entry is None or entry.get("type", "branch") != "branch" else entry.get("snapshot-id")


def snapshot_of(metadata: dict[str, Any], snapshot_id: int | None) -> dict[str, Any] | None:
    """The snapshot with that id: from the index the rules keep for large tables, else from the newest down (a
    head and an append's parent are near the end)."""
    if snapshot_id is None:
        return None
    snapshots = metadata.get("snapshots") or []
    index = SNAPSHOT_INDEXES.get(snapshots)
    if index is not None:
        return index.get(snapshot_id)
    return next((s for s in reversed(snapshots) if s.get("snapshot-id") == snapshot_id), None)


# -- what the actor asks to be read, and what was read ----------------------------------------------------------


class RebaseNeeded(CommitConflict):
    """The actor's answer to a rebasable commit whose files are not read yet (or whose head moved to a snapshot
    whose list is not known): the service reads `lists` (and the commit's own manifest list, `manifest_list`, if
    it was not read yet) and offers the commit again. Never a client's answer: anywhere that does not rebase it
    is the commit's conflict, 409, with the original message. Plain values only: it may cross the cluster channel."""

    offered_again = True   # not an outcome: the actor does not count it (coordinator/actor.py)

    def __init__(self, message: str, *, location: str, snapshot_id: int, manifest_list: str,
                 lists: tuple[str, ...]):
        super().__init__(message)
        self.location = location
        self.snapshot_id = snapshot_id
        self.manifest_list = manifest_list
        self.lists = lists


@dataclass(frozen=True)
class ReadLists:
    """What the service read for one commit's rebase (checked already): the snapshot's own manifests, the other
    manifests its list names, and other snapshots' manifest lists by path. Plain values: it crosses the cluster
    channel inside the proposal."""

    conflict: str                       # the commit's 409, answered if it is not rebased after all
    own: tuple[Manifest, ...]           # sequence numbers UNASSIGNED_SEQ where its entries inherit the commit's
    inherited: frozenset[str]           # the paths of the list's other manifests: they must be its parent's
    lists: tuple[tuple[str, tuple[Manifest, ...]], ...] = ()
    attempt: int = 1
    written: tuple[int, int] | None = None   # the least and largest sequence number its entries carry themselves
    location: str | None = None   # the table location its files were checked to lie below (None: not said)

    def manifests_of(self, path: str) -> tuple[Manifest, ...] | None:
        return next((found for p, found in self.lists if p == path), None)


@dataclass(frozen=True)
class Rebased:
    """The commit rebased: the requirements and updates that apply it on the head, and its new manifest list."""

    requirements: list
    updates: list
    list_location: str
    list_data: bytes
    manifests: tuple[Manifest, ...]
    parent_snapshot_id: int
    read: tuple[tuple[str, tuple[Manifest, ...]], ...] = ()   # the lists of others it was read with

    def kept(self, before: tuple) -> tuple:
        """The lists the actor keeps after this commit (`IcebergTable.rebased`): this one first, then those read
        for it (the next appends from the same parent need them again), then the ones kept before."""
        new = ((self.list_location, self.manifests), *self.read)
        paths = {p for p, _ in new}
        return (*new, *(entry for entry in before if entry[0] not in paths))[:KEPT_LISTS]


# -- the rebase itself (pure: run by the actor, in order) --------------------------------------------------------


def rebase(metadata: dict[str, Any], append: Append, read: ReadLists | None, kept: tuple, conflict: CommitConflict,
           *, location: str) -> Rebased:
    """`append` on the branch's head as it is in `metadata`. Raises RebaseNeeded if a file must be read first,
    CommitConflict if it cannot be rebased (saying why)."""
    snapshot = append.snapshot
    head_id = _head(metadata, append.ref)
    head = snapshot_of(metadata, head_id)
    parent = snapshot_of(metadata, snapshot.parent_snapshot_id)
    if head is None or (snapshot.parent_snapshot_id is not None and parent is None):
        raise _not_rebased(conflict, "its parent or the branch's head is not in the table's metadata")
    if snapshot_of(metadata, snapshot.snapshot_id) is not None:
        raise _not_rebased(conflict, f"snapshot id {snapshot.snapshot_id} is taken by another snapshot")

    def known(path: str) -> tuple[Manifest, ...] | None:
        found = next((manifests for p, manifests in kept if p == path), None)
        return found if found is not None or read is None else read.manifests_of(path)

    wanted = [s["manifest-list"] for s in (parent, head) if s is not None]
    missing = tuple(dict.fromkeys(p for p in wanted if known(p) is None))
    if read is not None and read.location != location:
        # read for another place: before a set-location or a rename, or by a member that did not say where
        for path in (snapshot.manifest_list, *(mf.path for mf in read.own)):
            if not is_below(location, path):
                raise _not_rebased(conflict, f"{path} is not within the table's location {location}")
    if read is None or missing:
        if read is not None and read.attempt >= MAX_ATTEMPTS:
            raise _not_rebased(conflict, "the branch kept moving to snapshots whose manifest lists were not read")
        for path in (snapshot.manifest_list, *missing):
            if not is_below(location, path):
                raise _not_rebased(conflict, f"{path} is not within the table's location {location}")
        raise RebaseNeeded(conflict.message, location=location, snapshot_id=snapshot.snapshot_id,
                           manifest_list=snapshot.manifest_list, lists=missing)
    if parent is not None:
        parents = {m.path for m in known(parent["manifest-list"])}
        if read.inherited != parents:
            lost, foreign = len(parents - read.inherited), len(read.inherited - parents)
            raise _not_rebased(conflict, f"its manifest list does not hold exactly its parent's manifests besides "
                                         f"its own ({lost} of the parent's missing, {foreign} others)")
    elif read.inherited:
        raise _not_rebased(conflict, f"its manifest list names {len(read.inherited)} manifests of other "
                                     f"snapshots, but it has no parent")

    specs = {spec.get("spec-id") for spec in metadata.get("partition-specs") or ()}
    gone = sorted({mf.partition_spec_id for mf in read.own} - specs)
    if gone:
        raise _not_rebased(conflict, f"its manifests use partition spec {gone[0]}, which the table no longer has")
    version = metadata.get("format-version", 2)
    sequence_number = (metadata.get("last-sequence-number") or 0) + 1 if version >= 2 else None
    heads = known(head["manifest-list"])
    if read.written is not None:
        _check_written(read.written, sequence_number, heads, conflict)
    manifests = (*(mf._replace(first_row_id=None) for mf in read.own), *heads)
    list_name = f"snap-{snapshot.snapshot_id}-rebased-{uuid.uuid4().hex}.avro"
    # (the client's snapshot, validated when it was parsed, copied with what the rebase changes: its dump
    # validated again cost three times as much, in the actor)
    changed: dict[str, Any] = {"parent_snapshot_id": head_id,
                               "timestamp_ms": max(snapshot.timestamp_ms, head.get("timestamp-ms") or 0),
                               "summary": recount(snapshot.summary, head.get("summary")),
                               "manifest_list": join(location, "metadata", list_name)}
    if sequence_number is not None:
        changed["sequence_number"] = sequence_number
    first_row_id = None
    if version >= 3:
        first_row_id = metadata.get("next-row-id") or 0
        manifests, added_rows = assign_row_ids(manifests, first_row_id)
        changed.update(first_row_id=first_row_id, added_rows=added_rows)
    data = write_list(changed["manifest_list"], version, snapshot.snapshot_id, head_id, sequence_number or 0,
                      manifests, avro_codec(metadata.get("properties") or {}), first_row_id)
    written = tuple(mf._replace(sequence_number=sequence_number or 0, min_sequence_number=sequence_number or 0)
                    if mf.sequence_number == UNASSIGNED_SEQ else mf for mf in manifests)
    requirements = [*append.others, m.AssertRefSnapshotId(ref=append.ref, snapshot_id=head_id)]
    updates = [m.AddSnapshotUpdate(snapshot=snapshot.model_copy(update=changed)), append.set_ref]
    return Rebased(requirements, updates, changed["manifest_list"], data, written, head_id,
                   tuple(entry for entry in read.lists if entry[0] in wanted))


def _check_written(written: tuple[int, int], sequence_number: int | None, heads: tuple[Manifest, ...],
                   conflict: CommitConflict) -> None:
    """Entries that carry their own (data) sequence number keep it: the client's idea of this commit's, at most
    the commit's. That is harmless unless delete files were committed after it, whose sequence numbers are then
    above the entry's and would delete its rows (equality deletes apply to data files with a lower number)."""
    low, high = written
    if sequence_number is None or high > sequence_number:
        raise _not_rebased(conflict, f"its entries carry sequence number {high}, beyond the commit's "
                                     f"({sequence_number})")
    if any(mf.content != DATA and mf.sequence_number > low for mf in heads):
        raise _not_rebased(conflict, f"its entries carry sequence number {low}, and delete files were committed "
                                     f"since")


def assign_row_ids(manifests: tuple[Manifest, ...], next_row_id: int) -> tuple[tuple[Manifest, ...], int]:
    """v3 row lineage, as Java's v3 manifest list writer assigns it: each data manifest without a `first_row_id`
    gets the next one, and the next moves on by its added and existing rows. Returns the rows assigned too."""
    out, start = [], next_row_id
    for mf in manifests:
        if mf.content == DATA and mf.first_row_id is None:
            mf = mf._replace(first_row_id=next_row_id)
            next_row_id += (mf.added_rows_count or 0) + (mf.existing_rows_count or 0)
        out.append(mf)
    return tuple(out), next_row_id - start


def recount(summary: dict[str, str], previous: dict[str, str] | None) -> dict[str, str]:
    """The summary with its totals counted from the new parent's (Java `SnapshotSummary.updateTotals`): a total
    the parent does not carry (or that is not a number) is left out, as Java leaves it out."""
    previous = FIRST_TOTALS if previous is None else previous
    out = {k: v for k, v in summary.items() if k not in FIRST_TOTALS}
    for total, added, removed in TOTALS:
        try:
            value = int(previous[total]) + int(summary.get(added, 0)) - int(summary.get(removed, 0))
        except (KeyError, ValueError):
            continue
        if value >= 0:
            out[total] = str(value)
    return out


def _not_rebased(conflict: CommitConflict, why: str) -> CommitConflict:
    return CommitConflict(f"{conflict.message} ({NOT_REBASED}: {why})")


# -- reading (outside the actor, on a file thread) ---------------------------------------------------------------


async def read_ahead(files, state: Any, requirements: list, updates: list) -> ReadLists | None:
    """What an append's rebase needs read, read before its first offer when the table as its actor expects it
    (`state`: the one its write under way leaves, else the durable one; `TableActor.ahead`) would rebase it
    (`needed_on`): appends that are rebased then pass through the actor once, which checks in its order what was
    read against its head as it is then. None, reading nothing, when its requirements hold there (most commits:
    the check costs a few dict lookups), it is no rebasable append, or there is no state (no actor here: another
    cluster member owns the table); None too when the reading refuses it, so that the actor decides first and the
    commit's answer is the one its order gives."""
    if not isinstance(state, IcebergTable):
        return None
    needed = needed_on(state.metadata, state.rebased, requirements, updates)
    if needed is None:
        return None
    try:
        return await read_for_rebase(files, needed, None)
    except (BadRequest, CommitConflict):
        return None


async def read_for_rebase(files, needed: RebaseNeeded, before: ReadLists | None) -> ReadLists:
    """What `needed` asks for, read and checked on a thread of the file IO's read pool (bounded in time as every
    read of a client's file is): the commit's own manifest list and manifests (unless `before` has them) and the
    other lists named. BadRequest for a file that is missing or unreadable as what it is named as (a link, not a
    regular file, too large, not Avro); CommitConflict for a commit that is not an append after all."""
    with trio.move_on_after(READ_TIMEOUT_S):
        return await files.reading(_read_for_rebase_sync, files, needed, before)
    raise Unavailable(f"reading the manifest lists to rebase snapshot {needed.snapshot_id} took longer than "
                      f"{READ_TIMEOUT_S:g} s; nothing changed, retry")


def _read_for_rebase_sync(files, needed: RebaseNeeded, before: ReadLists | None) -> ReadLists:
    conflict = CommitConflict(needed.message)
    lists, attempt = ((), 1) if before is None else (before.lists, before.attempt + 1)
    if before is None or before.location != needed.location:   # (or read for another place: checked there)
        own, inherited, written = _own_manifests(files, needed, conflict)
    else:
        own, inherited, written = before.own, before.inherited, before.written
    read = {p for p, _ in lists}
    for path in needed.lists:
        if path not in read:
            try:
                manifests = tuple(read_manifest_list(path, _read(files, path, needed.location, "manifest list",
                                                                 checked=True), MAX_LIST_MANIFESTS))
            except (BadRequest, NotAvro, TooManyManifests) as exc:   # the table's history, not this request: 409
                raise _not_rebased(conflict, f"cannot read the manifest list {path}: {exc}") from None
            lists = (*lists, (path, manifests))
    return ReadLists(needed.message, own, inherited, lists, attempt, written, needed.location)


def _own_manifests(files, needed: RebaseNeeded, conflict: CommitConflict
                   ) -> tuple[tuple[Manifest, ...], frozenset[str], tuple[int, int] | None]:
    path = needed.manifest_list
    try:
        listed_own, others = split_manifest_list(path, _read(files, path, needed.location, "manifest list",
                                                             checked=True), needed.snapshot_id, MAX_LIST_MANIFESTS)
    except NotAvro as exc:
        raise BadRequest(f"cannot rebase snapshot {needed.snapshot_id}: {exc}") from None
    except TooManyManifests as exc:
        raise _not_rebased(conflict, str(exc)) from None
    if len(listed_own) > MAX_OWN_MANIFESTS:
        raise _not_rebased(conflict, f"it adds {len(listed_own)} manifests, more than the {MAX_OWN_MANIFESTS} a "
                                     f"rebase reads")
    own, written = [], []
    for mf in listed_own:
        if mf.content != DATA or mf.existing_files_count or mf.deleted_files_count:
            raise _not_rebased(conflict, f"its manifest {mf.path} is not one of added data files only")
        try:
            entries = read_manifest_entries(mf.path, _read(files, mf.path, needed.location, "manifest"))
        except NotAvro as exc:
            raise BadRequest(f"cannot rebase snapshot {needed.snapshot_id}: {exc}") from None
        data_numbers = []
        for entry in entries:
            why = added_only(entry, needed.snapshot_id)
            if why is not None:
                raise _not_rebased(conflict, f"its manifest {mf.path} holds {why}")
            written += written_sequence_numbers(entry)
            if entry.sequence_number is not None:
                data_numbers.append(entry.sequence_number)
        # (the commit's number is UNASSIGNED_SEQ until the list is written: that of inheriting entries, and the
        # least unless an entry carries a lower one of its own, which `_check_written` checks to be harmless)
        own.append(mf._replace(sequence_number=UNASSIGNED_SEQ,
                               min_sequence_number=min(data_numbers) if data_numbers else UNASSIGNED_SEQ))
    return tuple(own), frozenset(others), (min(written), max(written)) if written else None


def _read(files, path: str, location: str, what: str, *, checked: bool = False) -> bytes:
    """A file the rebase reads: below the table's location, a regular file reached without a link, bounded.
    `checked`: a path `rebase` found below `location` before it raised the RebaseNeeded that named it (its
    manifest list and the lists it asks for; a commit's own manifests are checked here)."""
    if not checked and not is_below(location, path):
        raise BadRequest(f"the {what} {path} is not within the table's location {location}: a rebase reads only "
                         f"the table's own files")
    try:
        return files.read_within_sync(path, location, limit=MAX_LIST_BYTES)
    except storage_errors.FileMissing:
        raise BadRequest(f"the {what} {path} does not exist: write it before committing the snapshot") from None
    except storage_errors.FileRefused as exc:
        raise BadRequest(f"the {what} {path} cannot be read: {exc}") from None
    except storage_errors.FileUnavailable as exc:
        raise Unavailable(str(exc)) from None
    except OSError as exc:
        raise Unavailable(f"reading the {what} {path} failed ({exc}); nothing changed, retry") from None
