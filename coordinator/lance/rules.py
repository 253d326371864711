"""Lance commit rules: pure `decide(state) -> Decision` proposals for the table actor.

The coordinator is Lance's external manifest store (spec: "External Manifest Store"; `managed_versioning`).
A writer stages its manifest itself and asks for version N; the server FINALIZES: the version is recorded in the
commit log, then the staged bytes become `_versions/<final name>` (`Decision.published`: written only by the
process whose database write applied, so a fenced former owner can never overwrite a committed manifest), and the
staging file is gone (locally it is renamed into place, in one step; on an object store it is deleted afterwards,
best effort). Until then it is what restores a final manifest lost to a crash, see `LanceCatalog._load_state`.
Everything that needs I/O (reading the staged manifest) is done by the catalog before the proposal reaches the
actor, so these rules can be re-decided and composed freely.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable

from storage.files import local_path
from storage.records import LogEntry, PurgeClaim

from ..decision import Decision, Proposal
from ..errors import BadRequest, CommitConflict, CoordinatorError, NotFound
from .table import LanceTable, TableVersion, in_ranges, manifest_uri

log = logging.getLogger(__name__)

AfterDurable = Callable[[], Awaitable[None]]


def show(ident: list[str] | tuple[str, ...]) -> str:
    return ".".join(ident)


@dataclass
class ReadTable:
    """A read: answered from the actor's memory with the immutable table snapshot."""

    def decide(self, state: LanceTable) -> Decision:
        return Decision(state, reply=state)


@dataclass
class CreateVersion:
    """CreateTableVersion with put-if-not-exists semantics (spec: `/v1/table/{id}/version/create`).

    - The next version is always `high_water + 1`; a number once recorded (even if its record was deleted) is
      never handed out again, so a reader can never see two different manifests under one version.
    - An existing version is a conflict (409, ConcurrentModification: the writer rebases and retries) unless it
      is the same commit again (same staged path, or byte-identical manifest): then it is answered again (200),
      so a client whose first answer was lost learns that its commit landed.
    """

    version: int
    staging_uri: str
    data: bytes | None            # the staged manifest; None when it no longer exists
    sha256: str | None
    scheme: str
    timestamp_ms: int
    metadata: dict[str, str] | None = None
    # `staging_uri` is a staging file (`is_staged`), the server's to remove once the final manifest is in place:
    # locally, publishing consumes it (renamed into place, its bytes checked, or removed after a copy:
    # storage.files.FileWrite); on an object store `remove_staging` deletes it afterwards, as it does a local one
    # whose version a later operation of the same batch took back (Steps).
    staged: bool = False
    remove_staging: Callable[[str], Awaitable[None]] | None = None
    trim: bool = True   # Steps trims once, after the batch's last operation (LanceTable.trimmed)

    def decide(self, state: LanceTable) -> Decision:
        existing = state.find(self.version)
        if existing is not None:
            if existing.staging_uri == self.staging_uri or (self.sha256 and existing.sha256 == self.sha256):
                return Decision(state, reply=existing)
            raise CommitConflict(f"version {self.version} of table {show(state.ident)} already exists; the latest "
                                 f"version is {state.latest.version}: rebase and retry", kind="version-exists")
        if self.version == 0:
            raise BadRequest("version must be >= 1: Lance versions start at 1")
        if self.version <= state.high_water and not state.covers(self.version):
            raise CommitConflict(f"version {self.version} of table {show(state.ident)} already exists; the latest "
                                 f"version is {state.high_water}: rebase and retry", kind="version-exists")
        if self.version <= state.high_water:
            raise CommitConflict(f"version {self.version} of table {show(state.ident)} was recorded before and its "
                                 f"record deleted; version numbers are never reused: the next version is "
                                 f"{state.high_water + 1}", kind="version-exists")
        if self.version != state.high_water + 1:
            # A writer whose view is ahead of the table: it saw a manifest that was never recorded (a write that
            # bypassed the namespace, or a refused one's). A conflict, so that it rebases on the recorded latest
            # version; and a reload, whose clean-up removes that manifest, or every writer would keep seeing it.
            raise CommitConflict(f"version {self.version} is not the next version of table {show(state.ident)}: "
                                 f"the next version is {state.high_water + 1}; rebase and retry",
                                 kind="version-exists", reload=True)
        if self.data is None:
            raise BadRequest(f"the staged manifest {self.staging_uri} does not exist: write it before creating "
                             f"version {self.version}")
        final = manifest_uri(state.location, self.version, self.scheme)
        entry = TableVersion(self.version, final, len(self.data), self.timestamp_ms, self.scheme,
                             self.staging_uri, self.sha256, None, self.metadata or None)
        new = state.with_version(entry, trim=self.trim)
        consumed = self.staged and self.staging_uri != final
        # (written from within the table's place: a link planted in `_versions/` leads nowhere)
        published = (final, self.data, self.staging_uri if consumed else None, state.location)
        after = None
        if consumed and local_path(self.staging_uri) is None:
            after = self.discard_staging()
        return Decision(new, reply=entry, row_state=new.row_state(), log=[LogEntry(self.version, entry.payload())],
                        published=[published], after_durable=after)

    def discard_staging(self) -> AfterDurable | None:
        """Removes the staged manifest when publishing will not (an object store; a version taken back)."""
        if not self.staged or self.remove_staging is None:
            return None
        return functools.partial(self.remove_staging, self.staging_uri)


@dataclass
class DeleteVersions:
    """BatchDeleteTableVersions: drop version RECORDS in [start, end) ranges (end -1 = through the latest). The
    manifests and data stay on storage (spec: "deletes version tracking records, NOT the actual table data")."""

    ranges: list[tuple[int, int]]
    # Records only in the commit log (below the table's `log_below`) are counted by the catalog beforehand:
    # `older_count` of them, in a state whose `log_below` and `deletes` were these.
    older_than: int = 0
    older_count: int = 0
    deletes_seen: int = 0
    checked: bool = False   # Steps checked `counted_in` against the batch's first state already

    def counted_in(self, state: LanceTable) -> bool:
        """Whether the older records were counted in this state (or one that differs only in memory)."""
        return state.log_below == self.older_than and state.deletes == self.deletes_seen

    def decide(self, state: LanceTable) -> Decision:
        if not self.checked and not self.counted_in(state):
            # Versions left memory, or another delete applied, since the count: nothing applied, count again.
            raise CommitConflict("the table's versions changed while their records were counted", kind="recount")
        new, count = state.without_ranges(self.ranges)
        count += self.older_count
        if count == 0:
            return Decision(state, reply=0)
        return Decision(new, reply=count, row_state=new.row_state(), log_delete=list(self.ranges))


@dataclass
class RemoveTable:
    """Deregister (`purge` None: the files stay) or drop (`purge` deletes the table's files once the row is gone).
    The reply is the table as it was."""

    purge: Callable[[], Awaitable[None]] | None = None
    claim: PurgeClaim | None = None   # on what `purge` deletes, until it has (registry.purge_after_drop)

    def decide(self, state: LanceTable) -> Decision:
        return Decision(None, reply=state, delete=True, after_durable=self.purge, purge=self.claim)


@dataclass
class Steps:
    """Several operations of one batch on one table, applied in request order, each seeing the ones before it.

    One Decision for the whole sequence (the multi-table transaction takes one per table). The reply maps each
    operation's index in the batch to its own reply. An error names the operation it came from.
    """

    steps: list[tuple[int, str, Proposal]] = field(default_factory=list)

    def decide(self, state: LanceTable) -> Decision:
        replies: dict[int, Any] = {}
        current = state
        # (log entry, its published files, what removes its staged manifest if the entry is taken back)
        created: list[tuple[LogEntry, list, AfterDurable | None]] = []
        deleted_ranges: list[tuple[int, int]] = []
        afters: list[AfterDurable] = []
        removed_by: int | None = None
        purge: PurgeClaim | None = None
        # A delete's older records were counted against the state the batch starts from; later deletes in the
        # batch were counted without the ranges of earlier ones (LanceCatalog._version_deletion).
        deletions = [p for _, _, p in self.steps if isinstance(p, DeleteVersions)]
        if not all(p.counted_in(state) for p in deletions):
            raise CommitConflict("the table's versions changed while their records were counted", kind="recount")
        for index, label, proposal in self.steps:
            if isinstance(proposal, DeleteVersions):
                proposal = replace(proposal, checked=True)
            elif isinstance(proposal, CreateVersion):
                proposal = replace(proposal, trim=False)
            if removed_by is not None:
                raise NotFound(f"operation {index} ({label}): the table was deregistered by operation {removed_by} "
                               f"of this batch", kind="table")
            try:
                d = proposal.decide(current)
            except CoordinatorError as exc:
                exc.message = f"operation {index} ({label}): {exc.message}"
                exc.args = (exc.message,)
                raise
            replies[index] = d.reply
            if d.after_durable is not None:
                afters.append(d.after_durable)
            if d.delete:
                removed_by = index
                purge = d.purge
                current = d.state
                afters.extend(discard for *_, discard in created if discard is not None)
                continue
            if d.log_delete:
                # The store applies deletions before inserts; a version this batch created and a later operation
                # deletes must therefore not be inserted at all (nor its manifest written).
                afters.extend(discard for e, _, discard in created
                              if discard is not None and in_ranges(e.version, d.log_delete))
                created = [c for c in created if not in_ranges(c[0].version, d.log_delete)]
                deleted_ranges.extend(d.log_delete)
            if d.log:
                # (an object store's staged manifest is removed afterwards in any case: d.after_durable)
                discard = (proposal.discard_staging() if isinstance(proposal, CreateVersion)
                           and d.after_durable is None else None)
                created.extend((e, d.published if i == 0 else [], discard if i == 0 else None)
                               for i, e in enumerate(d.log))
            current = d.state
        after = _chain(afters)
        if removed_by is not None:
            return Decision(None, reply=replies, delete=True, after_durable=after, purge=purge)
        # One write, so the deletion counter rises once, as the row's version does (it is loaded as that version).
        current = replace(current, deletes=state.deletes + (current.deletes > state.deletes)).trimmed()
        return Decision(current, reply=replies, row_state=current.row_state(), log=[e for e, *_ in created],
                        log_delete=deleted_ranges, published=[f for _, fs, _ in created for f in fs],
                        after_durable=after)


def _chain(afters: list[AfterDurable]) -> AfterDurable | None:
    if not afters:
        return None

    async def run() -> None:
        for fn in afters:
            try:
                await fn()
            except Exception as exc:  # clean-up only: the commit already stands
                log.warning("lance clean-up after commit failed: %s", exc)
    return run
