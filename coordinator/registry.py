"""The registry: spawns table actors on demand under one nursery, addresses them by table id, retires idle ones.

`owner(table_id)` is the one place that answers "who sequences this table?" in this process. With scale-out
(coordinator/cluster) the answer may be a peer process: `submit`, `create` and `prepare` then go through the
cluster's router, which calls back `owner` here on whichever member holds the table's shard.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable
from uuid import UUID

import trio

from storage.files import DeletionStopped
from storage.iceberg_files import delete_reachable_sync
from storage.records import IdempotencyRecord, LogEntry, PurgeClaim, TableRow, TableWrite, WriteGroup, shard_of

from .actor import Participant, Proposal, TableActor
from .config import Config
from .errors import AlreadyExists, NotFound, NotOwner, Unavailable, location_taken
from .metrics import Metrics
from .transaction import transact

log = logging.getLogger(__name__)

StateLoader = Callable[[TableRow], Awaitable[Any]]


@dataclass(slots=True)
class Dormant:
    """An idle table's state, compacted: what its next actor starts from instead of reading the store."""

    row: TableRow
    compact: Any
    epoch: int | None


@dataclass(frozen=True)
class Compaction:
    """How a format keeps an idle table small (e.g. Iceberg: the metadata file's bytes, not the parsed dict)."""

    compact: Callable[[Any], Any]
    expand: Callable[[TableRow, Any], Any]


PURGE_RETRY_S = 600  # a failed deletion of a dropped table's files is retried this often
# How long since a claim was renewed: boot time, which (unlike the monotonic clock) also runs while the host is
# suspended, so a process resumed from that knows its claims may have been taken over.
_clock = functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") \
    else time.monotonic
KEEP_STATE = Compaction(compact=lambda state: state, expand=lambda row, state: state)


def purge_after_drop(store, files, location: str, metadata_location: str | None = None
                     ) -> tuple[PurgeClaim, Callable[[], Awaitable[bool]]]:
    """A drop's claim on its location (Decision.purge) and the deletion that ends it (its `after_durable`): a
    partial of a module function, not a closure, so that it can travel to a table's owner in a cluster."""
    claim = PurgeClaim(location, uuid.uuid4(), metadata_location)
    return claim, functools.partial(delete_own_location, store, files, location, claim.owner)


async def delete_own_location(store, files, location: str, owner: UUID | None = None) -> bool:
    """Delete a dropped table's location, unless another table lives at, above or below it (rows from before
    locations were exclusive, or an Iceberg table moved there by `set-location`): then nothing, and a warning.
    True if deleted. A module function, so that a clean-up partial can travel to a table's owner.

    The drop claimed the location (Decision.purge), so no table can be created there meanwhile; the claim ends
    here, or stays if the deletion failed, to be retried (Registry.resume_purges). `owner` is the claim's token
    (PurgeClaim.owner, or a member's that took the claim over; None in claims from before drops wrote one). A
    claim that names an Iceberg metadata file deletes only the files it reaches, else the location's tree."""
    confirmed_at = _clock()   # the database stamps the claim no earlier than this
    ours, metadata = await store.confirm_purge(location, owner)
    if not ours:
        # Taken over by another member while this one was frozen (perhaps even ended), or never inserted: another
        # drop's claim held the place (tables sharing it, from before locations were exclusive). Not ours to
        # touch: this table's files there, if any, are left.
        log.warning("not deleting %s: the claim on it is not this deletion's (taken over, or another drop's); "
                    "files this drop left there stay", location)
        return False
    if await store.location_taken(location, purges=False):
        # Ended, not left for later: a later pass could delete what that table keeps once it is deregistered.
        log.warning("not deleting %s: another table lives at, above or below it; its files stay", location)
        await store.end_purge(location, owner)
        return False
    renewal = _Renewal(store, {location: owner}, confirmed_at)
    failure = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(renewal.run)
        try:
            if metadata is None:
                await files.delete_tree(location, renewal.lapsed)
            else:
                await trio.to_thread.run_sync(delete_reachable_sync, files, location, metadata, renewal.lapsed)
        except Exception as exc:   # raised as it is, not inside the nursery's ExceptionGroup
            failure = exc
        if failure is None and renewal.lapsed():
            failure = DeletionStopped(f"the deletion of {location} stopped: its claim could not be renewed")
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure   # the claim stays: a later pass deletes what is left
    await store.end_purge(location, owner)
    return True


class _Renewal:
    """Keeps claims renewed while their deletions run or wait their turn (a large table on an object store may take
    long), so that `Registry.resume_purges` here or on another member never starts a second deletion that would
    outlive the claim.

    `lapsed()` turns true once the claims may no longer be ours, and the deletion (a thread, which cannot be
    cancelled) stops at its next file, its claim left for later: when another member took a claim over, when
    this task ended (a shutdown cancelled it), or when no renewal succeeded for half the time after which
    another member takes claims over. That last is checked against the clock, not by this task, so that a
    process that froze (a paused VM) stops at once when it wakes, before this task has run again."""

    def __init__(self, store, claims: dict[str, UUID | None], renewed_at: float):
        self.store, self.claims = store, claims   # location -> owner token; `claims` may change while this runs
        self._stop = threading.Event()
        self._valid_until = renewed_at + PURGE_RETRY_S / 2   # `renewed_at`: `_clock()` when sent, before the renewal

    def lapsed(self) -> bool:
        return self._stop.is_set() or _clock() > self._valid_until

    async def run(self) -> None:
        try:
            while not self.lapsed():
                await trio.sleep(PURGE_RETRY_S / 10)
                sent = _clock()   # the database stamps the renewal no earlier than this
                try:
                    for location, owner in list(self.claims.items()):
                        if not await self.store.renew_purge(location, owner):
                            log.warning("the claim on %s was taken over by another member: stopping", location)
                            return
                    self._valid_until = sent + PURGE_RETRY_S / 2
                except Exception as exc:
                    log.warning("cannot renew the claims on %s: %s", sorted(self.claims), exc)
        finally:
            self._stop.set()


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
            resumable = hasattr(self.store, "pending_purges")
            # Taken before anything is served: a drop served from then on holds a claim of its own, running.
            # In a cluster another member may be deleting at our start-up: only claims nobody renewed.
            taken = await self._take_over_purges(PURGE_RETRY_S if self.config.cluster else 0.0) if resumable \
                else ({}, 0.0)
            task_status.started(self)
            if resumable:
                nursery.start_soon(self.resume_purges, *taken)
            await trio.sleep_forever()

    async def _take_over_purges(self, older_than_s: float) -> tuple[dict[str, UUID], float]:
        """The claims on dropped tables' locations nobody renewed for `older_than_s`, now ours to delete (of all
        members at once, one takes each): location -> our owner token; and the `_clock()` time before the first
        was taken (its renewal)."""
        started = _clock()
        taken = {}
        try:
            for location in await self.store.pending_purges(older_than_s):
                owner = await self.store.take_over_purge(location, older_than_s)
                if owner is not None:
                    taken[location] = owner
        except Exception as exc:
            log.warning("cannot read the pending deletions (retried in %d s): %s", PURGE_RETRY_S, exc)
        return taken, started

    async def resume_purges(self, taken: dict[str, UUID], taken_at: float) -> None:
        """Deletions of dropped tables' locations that did not end (a crash, or a failed deletion: the claim
        stays): those taken over at start-up, then every PURGE_RETRY_S the claims nobody renewed for that long (a
        running deletion renews its claim, `_Renewal`)."""
        while True:
            if taken:
                await self._resume(taken, taken_at)
            await trio.sleep(PURGE_RETRY_S)
            taken, taken_at = await self._take_over_purges(PURGE_RETRY_S)

    async def _resume(self, taken: dict[str, UUID], taken_at: float) -> None:
        """Delete the locations of claims taken over, one after another."""
        waiting = dict(taken)   # renewed until their turn: taken over, they are ours alone
        renewal = _Renewal(self.store, waiting, taken_at)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(renewal.run)
            for location, owner in taken.items():
                if renewal.lapsed():
                    break   # no longer surely ours: left for a later pass, here or on another member
                del waiting[location]   # from now on its deletion renews it
                log.info("resuming the deletion of dropped table files at %s", location)
                try:
                    await delete_own_location(self.store, self.files, location, owner)
                except Exception as exc:
                    log.warning("deleting dropped table files at %s failed (retried in %d s): %s", location,
                                PURGE_RETRY_S, exc)
            nursery.cancel_scope.cancel()

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
            if result.reason == "fenced":
                raise NotOwner(f"table {row.table_id}'s shard moved while it was being created; nothing applied")
            if result.reason == "missing-namespace":
                raise NotFound(f"Namespace does not exist: {row.namespace.replace(chr(31), '.')}", kind="namespace")
            if result.reason == "location":
                raise location_taken(row.location)
            if result.reason == "stale":  # an interrupted write, found not applied once its server process ended
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
