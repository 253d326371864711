"""The registry: spawns table actors on demand under one nursery, addresses them by table id, retires idle ones.

`owner(table_id)` is the one place that answers "who sequences this table?" in this process. With scale-out
(coordinator/cluster) the answer may be a peer process: `submit`, `create` and `prepare` then go through the
cluster's router, which calls back `owner` here on whichever member holds the table's shard.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable
from uuid import UUID

import trio

from storage.records import IdempotencyRecord, LogEntry, Refusal, TableRow, TableWrite, WriteGroup, shard_of

from .actor import Participant, TableActor
from .config import Config
from .decision import KEEP_STATE, Compaction, Proposal
from .errors import AlreadyExists, NotFound, NotOwner, Unavailable, location_taken
from .metrics import Metrics
from .purges import Resumer
from .transaction import transact

log = logging.getLogger(__name__)

StateLoader = Callable[[TableRow], Awaitable[Any]]


@dataclass(slots=True)
class Dormant:
    """An idle table's state, compacted: what its next actor starts from instead of reading the store."""

    row: TableRow
    compact: Any
    epoch: int | None


class Registry:
    def __init__(self, config: Config, store, files, metrics: Metrics):
        self.config = config
        self.store = store
        self.files = files
        self.metrics = metrics
        self.actors: dict[UUID, TableActor] = {}
        self.loaders: dict[str, StateLoader] = {}
        self.compactions: dict[str, Compaction] = {}
        # Tables whose actor went idle, least recently used first. An idle table costs its row and compact state
        # (~2 KB for a small table) instead of a task and parsed state (~20 KB); the least recently used beyond
        # `dormant_tables_max` are forgotten and reload from the store.
        self.dormant: OrderedDict[UUID, Dormant] = OrderedDict()
        self._nursery: trio.Nursery | None = None
        self.cluster = None  # coordinator.cluster.Cluster when several members share the database
        metrics.add_gauges(self.gauges)

    def register_format(self, fmt: str, loader: StateLoader, compaction: Compaction | None = None) -> None:
        """Each format says how to build its in-memory state from a table row, and may say how to keep it
        compact while the table is idle (by default the state is kept as it is, only the actor's task ends)."""
        self.loaders[fmt] = loader
        self.compactions[fmt] = compaction or KEEP_STATE

    async def load_state(self, row: TableRow) -> Any:
        return await self.loaders[row.format](row)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # Taken before anything is served: a drop served from then on holds a claim of its own, running.
            resumer = Resumer(self.store, self.files, cluster=self.config.cluster)
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
                actor.row = dormant.row
                actor.state = self.compactions[dormant.row.format].expand(dormant.row, dormant.compact)
                actor.loaded = True
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

    async def submit(self, table_id: UUID, proposal: Proposal) -> Any:
        """Hand a proposal to the table's owner and wait for its answer (after durability if it writes)."""
        if self.cluster is not None:
            return await self.cluster.router.submit(table_id, proposal)
        return await self.owner(table_id).offer(proposal).wait()

    async def prepare(self, table_id: UUID, participant: Participant) -> tuple[Any, TableWrite]:
        """A multi-table transaction's part: the owner validates it and holds the table until the verdict."""
        if self.cluster is not None:
            return await self.cluster.router.prepare(table_id, participant)
        return await self.owner(table_id).offer(participant).wait()

    async def transact(self, parts: list[tuple[UUID, Proposal]], *, creates=(),
                       idempotency: IdempotencyRecord | None = None) -> list[Any]:
        """All parts (and creates) applied atomically, or none; see coordinator.transaction."""
        return await transact(self, parts, creates=list(creates), idempotency=idempotency)

    def retire(self, actor: TableActor) -> bool:
        """Called by an actor itself; succeeds only if no request is queued (checked in the same tick)."""
        if actor.send.statistics().current_buffer_used:
            return False
        if self.actors.get(actor.table_id) is actor:
            del self.actors[actor.table_id]
            self._hibernate(actor)
        return True

    def _hibernate(self, actor: TableActor) -> None:
        if not actor.loaded or actor.gone or actor.row is None or self.config.dormant_tables_max <= 0:
            return
        kept = self.compactions[actor.row.format].compact(actor.state)
        if kept is None:   # a state the format would rather read again (e.g. from a file that may be restored)
            return
        self.dormant[actor.table_id] = Dormant(actor.row, kept, actor.epoch)
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

    # -- creation: a table that does not exist yet has no actor; its row is inserted by the writer ------------

    async def create(self, row: TableRow, *, state: Any, row_state: dict[str, Any], log_entries: list[LogEntry] = (),
                     files: list[tuple[str, bytes]] = (), idempotency: IdempotencyRecord | None = None) -> None:
        """Create a table row (unique by name) with its first files and log entries. Raises AlreadyExists or
        NotFound(namespace). On success the table's actor starts with `state` already in memory."""
        if self.cluster is not None:
            return await self.cluster.router.create(row, state, row_state, list(log_entries), list(files),
                                                    idempotency)
        await self.create_local(row, state, row_state, list(log_entries), list(files), idempotency)

    async def create_local(self, row: TableRow, state: Any, row_state: dict[str, Any], log_entries: list[LogEntry],
                           files: list[tuple[str, bytes]], idempotency: IdempotencyRecord | None) -> None:
        """`create` on the member that owns the new table's shard (or alone): the insert is fenced like any write."""
        epoch = self._lease_epoch(row.table_id)
        if epoch is None:
            epoch = 0
        if row.location and await self.store.location_taken(row.location):  # before writing files into it
            # The name first (spec: 409 "already exists"): a create run twice would otherwise be told that its
            # own table's location is taken.
            if await self.store.find_table(row.realm, row.catalog, row.namespace, row.name) is not None:
                raise AlreadyExists(f"{row.kind.capitalize()} already exists: {row.name}", kind=row.kind)
            raise location_taken(row.location)
        try:
            await self.files.write_many(list(files))
        except OSError as exc:  # a full or read-only warehouse: known not applied, as for a commit
            await self._discard(files, row.location)
            raise Unavailable(f"could not write the table's files ({exc}); nothing applied, retry") from exc
        write = TableWrite(table_id=row.table_id, expected_version=0, epoch=epoch, state=row_state, bump=1,
                           log=list(log_entries), insert=row)
        group = WriteGroup([write], [idempotency] if idempotency else [])
        with trio.CancelScope(shield=True):
            result = await self.store.write(group)
        if not result.applied:
            await self._discard(files, row.location)
            if result.refusal is Refusal.FENCED:
                raise NotOwner(f"table {row.table_id}'s shard moved while it was being created; nothing applied")
            if result.refusal is Refusal.NO_NAMESPACE:
                raise NotFound(f"Namespace does not exist: {row.namespace.replace(chr(31), '.')}", kind="namespace")
            if result.refusal is Refusal.LOCATION_TAKEN:
                raise location_taken(row.location)
            if result.refusal is Refusal.STALE:  # an interrupted write, found not applied once its server process ended
                raise Unavailable(f"creating {row.name} was interrupted and did not apply; retry")
            raise AlreadyExists(f"{row.kind.capitalize()} already exists: {row.name}", kind=row.kind)
        self.adopt(replace(row, row_version=write.new_version, state=row_state), state)

    async def _discard(self, files: list[tuple[str, bytes]], location: str | None) -> None:
        """A refused create's files (a lost race for the name, say) would be orphans outside any table: removed."""
        if not files:
            return
        try:
            with trio.CancelScope(shield=True):
                await self.files.discard([uri for uri, _ in files], location)
        except Exception as exc:  # the refusal is the answer; a leftover file is only litter
            log.warning("removing the files of a refused create failed: %s", exc)

    def adopt(self, row: TableRow, state: Any) -> None:
        """A table this member just created: its actor starts with `state` in memory instead of reading the store."""
        try:
            actor = self.owner(row.table_id)
        except NotOwner:
            return  # the lease lapsed just now: the next owner loads the row
        if not actor.loaded:
            actor.row, actor.state, actor.loaded, actor.gone = row, state, True, False

    def forget(self, table_id: UUID) -> None:
        """Drop a loaded actor's state (a peer created the table in a transaction): it reloads on next use."""
        self.dormant.pop(table_id, None)
        actor = self.actors.get(table_id)
        if actor is not None and actor.gone:
            actor.loaded = False

    # -- metrics ---------------------------------------------------------------------------------------------

    def gauges(self) -> dict[str, float]:
        depth = sum(a.send.statistics().current_buffer_used for a in self.actors.values())
        out = {"coordinator_active_actors": len(self.actors), "coordinator_mailbox_depth_total": depth,
               "coordinator_dormant_tables": len(self.dormant)}
        stats = self.store.writer_stats() if hasattr(self.store, "writer_stats") else {}
        if stats:
            out["coordinator_db_flushes_total"] = stats["flushes"]
            out["coordinator_db_groups_total"] = stats["groups"]
            out["coordinator_db_fenced_writes_total"] = stats.get("fenced", 0)
        return out
