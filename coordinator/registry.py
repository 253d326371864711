"""The registry: spawns table actors on demand under one nursery, addresses them by table id, retires idle ones.

`owner(table_id)` is the one place that answers "who sequences this table?" in this process. With scale-out
(coordinator/cluster) the answer may be a peer process: `submit`, `create` and `prepare` then go through the
cluster's router, which calls back `owner` here on whichever member holds the table's shard.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from uuid import UUID

import trio

from storage.files import DeletionStopped
from storage.interface import Files, Store
from storage.records import UNFENCED, IdempotencyRecord, LogEntry, TableRow, shard_of

from .actor import TableActor
from .mailbox import Participant
from .config import Config
from .commit import Part
from .decision import KEEP_STATE, Change, Compaction, NewTable, Proposal
from .errors import NotOwner, Unavailable
from .events import Securable, named_securable
from .metrics import Metrics
from .purges import PurgeListing, Resumer
from .transaction import Receipt, transact

log = logging.getLogger(__name__)

StateLoader = Callable[[TableRow], Awaitable[Any]]


@dataclass(slots=True)
class Dormant:
    """An idle table's state, compacted: what its next actor starts from instead of reading the store."""

    row: TableRow
    compact: Any
    epoch: int | None


class Registry:
    def __init__(self, config: Config, store: Store, files: Files, metrics: Metrics):
        self.config = config
        self.store = store
        self.files = files
        self.metrics = metrics
        self.actors: dict[UUID, TableActor] = {}
        # By the kind of table row (TableRow.format): how its state loads, is kept while idle, and which format's
        # name it counts under (coordinator/format.py TableKind).
        self.loaders: dict[str, StateLoader] = {}
        self.compactions: dict[str, Compaction] = {}
        self.format_of: dict[str, str] = {}
        self.securables: dict[str, Securable] = {}   # a table's securable, for its events' readers
        # What a purge claim that names its table's metadata deletes, by the format whose claims they are.
        self.purge_listings: dict[str, PurgeListing] = {}
        self.watchers: dict[str, list[Callable[[UUID, Any], None]]] = {}   # by format: told of each applied write
        # Tables whose actor went idle, least recently used first. An idle table costs its row and compact state
        # (~2 KB for a small table) instead of a task and parsed state (~20 KB); the least recently used beyond
        # `dormant_tables_max` are forgotten and reload from the store.
        self.dormant: OrderedDict[UUID, Dormant] = OrderedDict()
        self._nursery: trio.Nursery | None = None
        self.cluster = None  # coordinator.cluster.Cluster when several members share the database
        metrics.add_gauges(self.gauges)
        metrics.add_counters(self.counters)

    def register_format(self, kind: str, loader: StateLoader, compaction: Compaction | None = None,
                        fmt: str | None = None, securable: Securable | None = None) -> None:
        """Each kind of table row (TableRow.format) says how to build its in-memory state from a row, and may say
        how to keep it compact while the table is idle (by default the state is kept as it is, only the actor's
        task ends); its commits count under its format's name `fmt` (by default the kind's own), and its events
        are seen by the readers of its tables' `securable` (by default, named after the kind)."""
        self.loaders[kind] = loader
        self.compactions[kind] = compaction or KEEP_STATE
        self.format_of[kind] = fmt or kind
        self.securables[kind] = securable or named_securable(kind)

    def securable(self, kind: str) -> Securable:
        return self.securables.get(kind) or named_securable(kind)

    def watch(self, fmt: str, watcher: Callable[[UUID, Any], None]) -> None:
        """`watcher(table_id, state)` after each applied write to a table of `fmt`, with its new state (None once
        dropped), on the member whose actor wrote it. It runs in the actor's task before the write's requesters
        are answered, so it must be cheap and never wait: it may note work to do, and do it elsewhere."""
        self.watchers.setdefault(fmt, []).append(watcher)

    def written(self, table_id: UUID, kind: str, state: Any) -> None:
        fmt = self.format_of.get(kind, kind)
        for watcher in self.watchers.get(fmt, ()):
            try:
                watcher(table_id, state)
            except Exception:
                log.exception("watcher of %s tables failed on table %s", fmt, table_id)

    def owns(self, table_id: UUID) -> bool:
        """Whether this member sequences the table now (always, without a cluster)."""
        return self.cluster is None or self.cluster.leases.epoch(shard_of(table_id)) is not None

    def register_purge_listing(self, fmt: str, listing: PurgeListing) -> None:
        """A format whose drops claim their files by naming their metadata (Iceberg: its metadata file; Lance: its
        `_versions/` directory) says what that reaches, so that a deletion resumed after a crash deletes only
        that."""
        self.purge_listings[fmt] = listing

    def purge_listing(self, files: Files, location: str, named: str) -> list[str] | None:
        """The files a claim naming `named` deletes in `location` (purges.Listing), by the one format that claims
        it."""
        claiming = [listing for listing in self.purge_listings.values() if listing.claims(named)]
        if len(claiming) != 1:   # never the whole tree: the location may hold files the table does not own
            raise DeletionStopped(f"the claim on {location} names {named}, and "
                                  f"{'no format lists' if not claiming else 'several formats would list'} its files")
        return claiming[0].files(files, location, named)

    async def load_state(self, row: TableRow) -> Any:
        return await self.loaders[row.format](row)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # Taken before anything is served: a drop served from then on holds a claim of its own, running.
            resumer = Resumer(self.store, self.files, cluster=self.config.cluster, listing=self.purge_listing)
            taken = await resumer.take_over_at_start()
            task_status.started(self)
            nursery.start_soon(resumer.resume_forever, *taken)
            await trio.sleep_forever()

    # -- addressing ----------------------------------------------------------------------------------------

    def owner(self, table_id: UUID) -> TableActor:
        """This process's actor for the table. In a cluster, only for a shard this member holds a lease on
        (NotOwner otherwise); an actor of an earlier lease of the shard is replaced, never reused."""
        epoch = self._lease_epoch(table_id)
        actor = self.actors.get(table_id)
        if actor is None or actor.epoch != epoch:
            if self._nursery is None:
                raise Unavailable("coordinator is not running")
            actor = TableActor(self, table_id, self.config.mailbox_size, epoch=epoch)
            dormant = self.dormant.pop(table_id, None)
            if dormant is not None and dormant.epoch == epoch:  # same lease: nobody else can have written since
                row = dormant.row
                actor.start_from(row, self.compactions[row.format].expand(row, dormant.compact))
            self.actors[table_id] = actor
            self._nursery.start_soon(actor.run, name=f"table-actor:{table_id}")
        return actor

    def _lease_epoch(self, table_id: UUID) -> int | None:
        """The epoch of this member's lease on the table's shard (None without a cluster); NotOwner if none."""
        if self.cluster is None:
            return None
        epoch = self.cluster.leases.epoch(shard_of(table_id))
        if epoch is None:
            raise NotOwner(f"this member does not own table {table_id}'s shard; retry")
        return epoch

    def serving(self, actor: TableActor) -> bool:
        """May this actor still decide and write? In a cluster: only while its lease's epoch is held."""
        return self.cluster is None or self.cluster.leases.epoch(shard_of(actor.table_id)) == actor.epoch

    def ahead(self, table_id: UUID) -> Any | None:
        """What the table's actor in this process expects its state to be (`TableActor.ahead`), read without
        entering its mailbox; None if there is no such actor serving here: what a requester may prepare its
        proposal against. A guess: the actor decides against its own state."""
        actor = self.actors.get(table_id)
        return None if actor is None or not self.serving(actor) else actor.ahead()

    async def submit(self, table_id: UUID, proposal: Proposal) -> Any:
        """Hand a proposal to the table's owner and wait for its answer (after durability if it writes)."""
        if self.cluster is not None:
            return await self.cluster.router.submit(table_id, proposal)
        return await self.owner(table_id).offer(proposal).wait()

    async def prepare(self, table_id: UUID, participant: Participant) -> tuple[Any, Part]:
        """A part of a commit that spans several tables: the owner decides it and holds the table until the
        verdict. Returns the proposal's reply and the table's commit part."""
        if self.cluster is not None:
            return await self.cluster.router.prepare(table_id, participant)
        return await self.owner(table_id).offer(participant).wait()

    async def transact(self, parts: list[tuple[UUID, Proposal]], *, creates=(),
                       idempotency: Receipt = None) -> list[Any]:
        """All parts (and creates) applied atomically, or none; see coordinator.transaction."""
        return await transact(self, parts, creates=list(creates), idempotency=idempotency)

    def insert_epoch(self, table_id: UUID) -> int:
        """The epoch a new table's insert is fenced with: this member's lease on its shard if it holds one; else
        none (the unique name is its compare-and-set, and its owner is told to forget what it knew)."""
        if self.cluster is None:
            return 0
        epoch = self.cluster.leases.epoch(shard_of(table_id))
        return UNFENCED if epoch is None else epoch

    def created(self, new: NewTable, row: TableRow, *, complete: bool) -> None:
        """A commit created `new`. Its actor here starts with the state in memory, unless its published files are
        not all written (its first load restores them) or another member owns it (told to forget instead)."""
        if self.cluster is not None and self.cluster.leases.epoch(shard_of(new.row.table_id)) is None:
            self.cluster.router.created(new.row.table_id)
            return
        if complete:
            self.adopt(row, new.state)
        else:
            self.forget(new.row.table_id)
        self.written(row.table_id, row.format, new.state)

    def retire(self, actor: TableActor) -> bool:
        """Called by an actor itself; succeeds only if no request is queued (checked in the same tick)."""
        if actor.send.statistics().current_buffer_used:
            return False
        if self.actors.get(actor.table_id) is actor:
            del self.actors[actor.table_id]
            self._hibernate(actor)
        return True

    def _hibernate(self, actor: TableActor) -> None:
        resting = actor.at_rest()
        if resting is None or self.config.dormant_tables_max <= 0:
            return
        row, state = resting
        kept = self.compactions[row.format].compact(state)
        if kept is None:   # a state the format would rather read again (e.g. from a file that may be restored)
            return
        self.dormant[actor.table_id] = Dormant(row, kept, actor.epoch)
        while len(self.dormant) > self.config.dormant_tables_max:
            self.dormant.popitem(last=False)

    def spawn_background(self, fn: Callable[[], Awaitable[None]]) -> None:
        async def guarded() -> None:
            try:
                await fn()
            except Exception as exc:
                log.warning("background clean-up failed: %s", exc)
        if self._nursery is not None:
            self._nursery.start_soon(guarded)

    def lease_lost(self, actor: TableActor) -> None:
        if self.cluster is not None and actor.epoch is not None:
            self.cluster.leases.lost(shard_of(actor.table_id), actor.epoch)

    def observe_batch(self, size: int) -> None:
        self.metrics.observe_batch(size)

    def observe_commit(self, kind: str, outcome: str, seconds: float | None) -> None:
        self.metrics.observe_commit(self.format_of.get(kind, kind), outcome, seconds)

    # -- creation: a table that does not exist yet has no actor; its row is inserted by the writer ------------

    async def create(self, row: TableRow, *, state: Any, row_state: dict[str, Any], log_entries: list[LogEntry] = (),
                     files: list[tuple[str, bytes]] = (), idempotency: IdempotencyRecord | None = None,
                     changes: list[Change] = ()) -> None:
        """Create a table row (unique by name) with its first files and log entries: a commit of one new table.
        Raises TableExists/ViewExists, NoSuchNamespace or LocationTaken. On success the table's actor starts
        with `state` already in memory."""
        new = NewTable(row, state, row_state, list(log_entries), list(files), changes=list(changes))
        if self.cluster is not None:
            return await self.cluster.router.create(new, idempotency)
        await self.create_local(new, idempotency)

    async def create_local(self, new: NewTable, idempotency: IdempotencyRecord | None) -> None:
        """`create` on the member that owns the new table's shard (or alone): the insert is fenced like any write."""
        self._lease_epoch(new.row.table_id)   # NotOwner here: the router retries at the owner
        await transact(self, [], creates=[new], idempotency=idempotency)

    def adopt(self, row: TableRow, state: Any) -> None:
        """A table this member just created: its actor starts with `state` in memory instead of reading the store."""
        try:
            actor = self.owner(row.table_id)
        except NotOwner:
            return  # the lease lapsed just now: the next owner loads the row
        actor.start_from(row, state)

    def forget(self, table_id: UUID) -> None:
        """Drop a loaded actor's state (a peer created the table in a transaction): it reloads on next use."""
        self.dormant.pop(table_id, None)
        actor = self.actors.get(table_id)
        if actor is not None:
            actor.forget_if_gone()

    # -- metrics ---------------------------------------------------------------------------------------------

    def gauges(self) -> dict[str, float]:
        depth = sum(a.send.statistics().current_buffer_used for a in self.actors.values())
        return {"coordinator_active_actors": len(self.actors), "coordinator_mailbox_depth": depth,
                "coordinator_dormant_tables": len(self.dormant)}

    def counters(self) -> dict[str, float]:
        stats = self.store.writer_stats() if hasattr(self.store, "writer_stats") else {}
        if not stats:
            return {}
        return {"coordinator_db_flushes_total": stats["flushes"], "coordinator_db_groups_total": stats["groups"],
                "coordinator_db_fenced_writes_total": stats.get("fenced", 0)}
