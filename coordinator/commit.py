"""The one commit path: how every accepted change becomes durable before anyone hears of it.

A commit is a set of table parts. Each part is one table's share: a batch of its requests that its actor decided
in order against its in-memory state, one table of a multi-table or cross-format commit (decided by that table's
actor, which holds the table until the outcome), or a table the commit creates. Whatever made it, a commit is
written in the same four steps:

1. the parts' files with fresh names (`Decision.files`: Iceberg metadata files) are made durable; a writer that
   then loses the race leaves only orphans nobody references. A new table's location is checked free first, so
   that nothing is written into another table's place;
2. every part's row is written in ONE store transaction: a compare-and-set on each row (or the insert of a new
   one), joined by the group-commit writer with every other commit waiting at the same moment. This is the
   commit's decision point;
3. the parts' fixed-name files (`Decision.published`: Lance's `_versions/N.manifest`) are made durable. Only the
   store may decide who writes such a name, so they come after it;
4. `write` returns, and only then may the callers be answered.

`write` returns normally once all four steps are done, or raises exactly one of these, each saying whether the
commit applied (the one place where a store's refusal gets its meaning):

- not applied: `Unavailable` (files could not be written, the database was unreachable, or a row moved under
  its writer), `NotOwner` (the writer's shard lease moved), `TableExists`/`ViewExists`, `NoSuchNamespace`,
  `LocationTaken`;
- applied: `Unpublished` (step 3 failed; the table's loader restores the files from what the rows record);
- unknown: `OutcomeUnknown` (the database's answer was lost).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import trio

from storage import faults
from storage.errors import StorageError
from storage.files import FileWrite, file_write
from storage.interface import Files, TableRows
from storage.records import IdempotencyRecord, Refusal, TableRow, TableWrite, WriteGroup

from . import events
from .decision import Decision
from .errors import (CoordinatorError, LocationTaken, NoSuchNamespace, NotOwner, TableExists, Unavailable, Unpublished,
                     ViewExists, from_storage)
from .name_limits import check_table_key

log = logging.getLogger(__name__)


@dataclass
class Part:
    """One table's share of a commit: its row's write, and the files that go with it."""

    write: TableWrite
    files: list[FileWrite] = field(default_factory=list)       # fresh names: durable before the row
    published: list[FileWrite] = field(default_factory=list)   # fixed names: durable after it, before answers

    @property
    def new(self) -> TableRow | None:
        """The row this part inserts, if it creates its table."""
        return self.write.insert


def table_part(row: TableRow, epoch: int | None, decisions: list[Decision], securable: events.Securable) -> Part:
    """The changes `decisions` made to the table `row`, in order, as its part of a commit: one compare-and-set of
    its row (fenced with `epoch`, its actor's lease's; None: the row's own), with its log rows, files and events
    (seen by whoever may read the table's `securable`)."""
    w = TableWrite(table_id=row.table_id, expected_version=row.row_version,
                   epoch=row.epoch if epoch is None else epoch, bump=len(decisions))
    part = Part(w)
    name = (row.catalog, row.namespace, row.name)
    for d in decisions:
        if d.rename is not None:
            name = d.rename
        if d.changes:   # one commit per request, named as that request leaves the table
            w.events.extend(events.records(row.table_id, name, d.changes, securable))
        if d.row_state is not None:
            w.state = d.row_state
        w.log.extend(d.log)
        w.log_delete.extend(d.log_delete)
        w.delete = w.delete or d.delete
        w.rename = d.rename or w.rename
        w.relocate = d.relocate or w.relocate
        w.purge = d.purge or w.purge
        part.files.extend(d.files)
        part.published.extend(d.published)
    return part


@dataclass
class Commit:
    parts: list[Part]
    idempotency: list[IdempotencyRecord] = field(default_factory=list)

    def group(self) -> WriteGroup:
        return WriteGroup([p.write for p in self.parts], list(self.idempotency))


async def write(commit: Commit, store: TableRows, files: Files) -> None:
    """Make `commit` durable (steps 1-3 above) or raise the one error that says whether it applied."""
    for part in commit.parts:
        _check_names(part.write)
    for part in commit.parts:
        if part.new is not None and part.new.location and part.files:
            await _check_place_free(store, part.new)
    fresh = [f for p in commit.parts for f in p.files]
    # Nothing below may be abandoned half-way by a cancelled requester or a shutdown: other callers' outcomes, and
    # the actors holding their tables, wait on it.
    with trio.CancelScope(shield=True):
        try:
            await files.write_many(fresh)
        except Exception as exc:  # a full or read-only warehouse, say: the store was not asked, nothing applied
            await _discard_new_tables_files(commit, files)
            raise Unavailable(f"could not write the table files ({exc}); nothing applied, retry") from exc
        if faults.ARMED and fresh:
            faults.hit("after-files")
        try:
            result = await store.write(commit.group())
        except StorageError as exc:
            raise from_storage(exc) from None
        if not result.applied:
            await _discard_new_tables_files(commit, files)
            raise refusal_error(commit, result.refusal)
        published = [f for p in commit.parts for f in p.published]
        if faults.ARMED and published:
            faults.hit("before-publish")
        if published:
            try:
                await files.write_many(published)
            except Exception as exc:
                log.error("commit recorded but its files could not be written: %s", exc)
                raise Unpublished(f"the commit was recorded but its files could not be written yet ({exc}); "
                                  f"retry") from exc
        if faults.ARMED:
            faults.hit("before-reply")


def _check_names(w: TableWrite) -> None:
    """A new table's name within the limits every protocol shares: over them the store could not index it, and
    nothing is applied. (A rename is one proposal among its table's batch: its own `decide` checks the name.)"""
    if w.insert is not None:
        check_table_key(w.insert.catalog, w.insert.namespace, w.insert.name)


def refusal_error(commit: Commit, refusal: Refusal | None) -> CoordinatorError:
    """What a store's refusal means to the client: nothing applied, and why."""
    new = next((p.new for p in commit.parts if p.new is not None), None)
    first = commit.parts[0].write.table_id if commit.parts else None
    if refusal is Refusal.FENCED:
        return NotOwner(f"table {first}'s shard moved to another member; nothing applied, retry")
    if refusal is Refusal.NAME_TAKEN:
        return _name_taken(new) if new is not None else TableExists("Table already exists under the new name")
    if refusal is Refusal.NO_NAMESPACE:
        namespace = new.namespace.replace("\x1f", ".") if new is not None else "of the new name"
        return NoSuchNamespace(f"Namespace does not exist: {namespace}")
    if refusal is Refusal.LOCATION_TAKEN:
        return LocationTaken(new.location if new is not None else None)
    # Our row changed under us (a new owner, fencing) or an interrupted write did not apply. The writing actor
    # reloads before serving again.
    return Unavailable(f"table {first} changed concurrently or its write was interrupted; nothing applied, retry")


async def _check_place_free(store: TableRows, new: TableRow) -> None:
    """A new table's location must be free before its files are written there. The name first (spec: 409 "already
    exists"): a create run twice would otherwise be told that its own table's location is taken. The store checks
    both again when it inserts the row; this only keeps files out of another table's place."""
    if await store.location_taken(new.location):
        if await store.find_table(new.realm, new.catalog, new.namespace, new.name) is not None:
            raise _name_taken(new)
        raise LocationTaken(new.location)


def _name_taken(new: TableRow) -> CoordinatorError:
    kind = ViewExists if new.kind == "view" else TableExists
    return kind(f"{new.kind.capitalize()} already exists: {new.name}")


async def _discard_new_tables_files(commit: Commit, files: Files) -> None:
    """A refused new table's files (a lost race for the name, say) would be orphans outside any table: removed.
    The others' files have fresh names inside existing tables: left, as orphans a later commit never references."""
    for part in commit.parts:
        if part.new is None or not part.files:
            continue
        try:
            await files.discard([file_write(f)[0] for f in part.files], part.new.location)
        except Exception as exc:  # the refusal is the answer; a leftover file is only litter
            log.warning("removing the files of a refused create failed: %s", exc)


def written_row(row: TableRow | None, w: TableWrite) -> TableRow:
    """The table's row as it is once `w` applied (`row`: as it was; None for a table `w` inserts)."""
    if w.insert is not None:
        return replace(w.insert, row_version=w.new_version, state=w.state if w.state is not None else w.insert.state)
    changes: dict = {"row_version": w.new_version}
    if w.state is not None:
        changes["state"] = w.state
    if w.rename is not None:
        changes["catalog"], changes["namespace"], changes["name"] = w.rename
    return replace(row, **changes)
