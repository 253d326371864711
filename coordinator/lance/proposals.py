"""Lance's proposals: what the table actor runs (`decide(state) -> Decision`), thin glue over `rules.py`.

The coordinator is Lance's external manifest store (spec: "External Manifest Store"; `managed_versioning`).
A writer stages its manifest itself and asks for version N; the server FINALIZES: the version is recorded in the
commit log, then the staged bytes become `_versions/<final name>` (`Decision.published`: written only by the
process whose database write applied, so a fenced former owner can never overwrite a committed manifest), and the
staging file is gone (locally it is renamed into place, in one step; on an object store it is deleted afterwards,
best effort). Until then it is what restores a final manifest lost to a crash, see
`files.restore_final_manifests`. Everything that needs I/O (reading the staged manifest) is done by the service
before the proposal reaches the actor, so these proposals can be re-decided and composed freely.
"""

from __future__ import annotations

import functools
import logging
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable

from storage.files import local_path
from storage.records import LogEntry, PurgeClaim

from ..crossable import crossing
from ..decision import Change, Decision, Proposal
from ..errors import CoordinatorError
from ..purges import purge_after_drop
from . import models as _models, rules, state as _state
from .files import own_files
from .layout import manifest_uri, own_files_claim
from .rows import FORMAT
from .state import LanceTable, TableVersion, in_ranges

log = logging.getLogger(__name__)

AfterDurable = Callable[[], Awaitable[None]]


@dataclass
class ReadTable:
    """A read: answered from the actor's memory with the immutable table snapshot.

    `recent`: the reader looks older versions up in the commit log when the snapshot does not hold them (as it
    does for an idle table's, `LanceTable.dormant`), so a reply that crosses the cluster channel to the member
    that forwarded the read carries only the latest few versions, not up to 2 x VERSIONS_KEPT of them: what is
    left out is in the commit log, where every version the actor holds was durable before it held it. A read
    that needs the snapshot as the actor has it (a version deletion's count, `rules.check_counted`) leaves it
    off."""

    recent: bool = False

    def decide(self, state: LanceTable) -> Decision:
        return Decision(state, reply=state)

    def reply_for_peer(self, state: LanceTable) -> LanceTable:
        return state.dormant() if self.recent else state


@dataclass
class CreateVersion:
    """CreateTableVersion with put-if-not-exists semantics (spec: `/v1/table/{id}/version/create`).

    - The next version is always `high_water + 1` (rules.check_next_version).
    - An existing version is a conflict (VersionExists) unless it is the same commit again (rules.same_commit):
      then it is answered again (200).
    """

    counts_as_commit = True  # a change to the table's contents: counted and timed per outcome (/metrics)
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
            if rules.same_commit(existing, self.staging_uri, self.sha256):
                return Decision(state, reply=existing)
            raise rules.version_taken(state, self.version)
        rules.check_next_version(state, self.version)
        data = rules.check_staged_exists(self.data, self.staging_uri, self.version)
        final = manifest_uri(state.location, self.version, self.scheme)
        entry = TableVersion(self.version, final, len(data), self.timestamp_ms, self.scheme,
                             self.staging_uri, self.sha256, None, self.metadata or None)
        new = state.with_version(entry, trim=self.trim)
        consumed = self.staged and self.staging_uri != final
        # (written from within the table's place: a link planted in `_versions/` leads nowhere)
        published = (final, data, self.staging_uri if consumed else None, state.location)
        after = None
        if consumed and local_path(self.staging_uri) is None:
            after = self.discard_staging()
        return Decision(new, reply=entry, row_state=new.row_state(), log=[LogEntry(self.version, entry.payload())],
                        published=[published], after_durable=after, changes=[feed_change("committed", new, entry)])

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
    # Records only in the commit log (below the table's `log_below`) are counted by the service beforehand:
    # `older_count` of them, in a state whose `log_below` and `deletes` were these.
    older_than: int = 0
    older_count: int = 0
    deletes_seen: int = 0
    checked: bool = False   # Steps checked `counted_in` against the batch's first state already

    def check_counted(self, state: LanceTable) -> None:
        """Recount unless the older records were counted in this state (or one that differs only in memory)."""
        rules.check_counted(state, self.older_than, self.deletes_seen)

    def decide(self, state: LanceTable) -> Decision:
        if not self.checked:
            self.check_counted(state)
        new, count = state.without_ranges(self.ranges)
        count += self.older_count
        if count == 0:
            return Decision(state, reply=0)
        return Decision(new, reply=count, row_state=new.row_state(), log_delete=list(self.ranges))


@dataclass
class RemoveTable:
    """Deregister (the files stay) or drop (`purge`: the table's location, whose files are deleted once the row is
    gone, claimed until then). The reply is the table as it was.

    A drop deletes what is the table's own: in the directory the service gave it (`own_location`, named after its
    id), everything; in a location the client chose (declared there, or registered), only Lance's own files
    (`files.own_files`), as an Iceberg purge deletes what its metadata reaches: such a place may hold other files
    too. Decided here, on the table's owner, where the deletion runs: nothing but `files` and `store` (which every
    member has) crosses the cluster channel."""

    purge: str | None = None
    files: Any = None
    store: Any = None
    own_location: bool = False

    def decide(self, state: LanceTable) -> Decision:
        claim = deletion = None
        if self.purge is not None:
            claim, deletion = (purge_after_drop(self.store, self.files, self.purge) if self.own_location else
                               purge_after_drop(self.store, self.files, self.purge, own_files_claim(self.purge),
                                                own_files))
        return Decision(None, reply=state, delete=True, after_durable=deletion, purge=claim,
                        changes=[feed_change("dropped", state)])


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
        # (log entry, its published files, what removes its staged manifest if the entry is taken back, its
        # events for the commit feed)
        created: list[tuple[LogEntry, list, AfterDurable | None, list[Change]]] = []
        removal: list[Change] = []
        deleted_ranges: list[tuple[int, int]] = []
        afters: list[AfterDurable] = []
        removed_by: int | None = None
        purge: PurgeClaim | None = None
        # A delete's older records were counted against the state the batch starts from; later deletes in the
        # batch were counted without the ranges of earlier ones (LanceService.version_deletion).
        for _, _, p in self.steps:
            if isinstance(p, DeleteVersions):
                p.check_counted(state)
        for index, label, proposal in self.steps:
            if isinstance(proposal, DeleteVersions):
                proposal = replace(proposal, checked=True)
            elif isinstance(proposal, CreateVersion):
                proposal = replace(proposal, trim=False)
            rules.check_not_removed(index, label, removed_by)
            try:
                d = proposal.decide(current)
            except CoordinatorError as exc:
                raise rules.labelled(exc, index, label)
            replies[index] = d.reply
            if d.after_durable is not None:
                afters.append(d.after_durable)
            if d.delete:
                removed_by = index
                purge = d.purge
                removal = d.changes
                current = d.state
                afters.extend(discard for _, _, discard, _ in created if discard is not None)
                continue
            if d.log_delete:
                # The store applies deletions before inserts; a version this batch created and a later operation
                # deletes must therefore not be inserted at all (nor its manifest written).
                afters.extend(discard for e, _, discard, _ in created
                              if discard is not None and in_ranges(e.version, d.log_delete))
                created = [c for c in created if not in_ranges(c[0].version, d.log_delete)]
                deleted_ranges.extend(d.log_delete)
            if d.log:
                # (an object store's staged manifest is removed afterwards in any case: d.after_durable)
                discard = (proposal.discard_staging() if isinstance(proposal, CreateVersion)
                           and d.after_durable is None else None)
                created.extend((e, d.published if i == 0 else [], discard if i == 0 else None,
                                d.changes if i == 0 else []) for i, e in enumerate(d.log))
            current = d.state
        after = _chain(afters)
        if removed_by is not None:
            return Decision(None, reply=replies, delete=True, after_durable=after, purge=purge, changes=removal)
        # One write, so the deletion counter rises once, as the row's version does (it is loaded as that version).
        current = replace(current, deletes=state.deletes + (current.deletes > state.deletes)).trimmed()
        return Decision(current, reply=replies, row_state=current.row_state(), log=[e for e, *_ in created],
                        log_delete=deleted_ranges, published=[f for _, fs, _, _ in created for f in fs],
                        after_durable=after, changes=[c for *_, cs in created for c in cs])


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


def feed_change(what: str, state: LanceTable, version: TableVersion | None = None) -> Change:
    """The commit feed's `lance.table.<what>`: the version (the table's latest when not given; a declared table's
    is 0) and its manifest."""
    version = version or state.latest
    data: dict[str, Any] = {"format": FORMAT, "version": version.version if version else state.high_water}
    if version is not None:
        data["manifest"] = version.manifest_uri
    return Change(f"{FORMAT}.table.{what}", data)


# What a Lance request carries to its table's owner in a cluster, and the owner's answers (coordinator/crossable).
crossing(sys.modules[__name__], _models, _state)
