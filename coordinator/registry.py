"""The registry: spawns table actors on demand under one nursery, addresses them by table id, retires idle ones.

`owner(table_id)` is the one place that answers "who sequences this table?". Today the answer is always an
actor in this process; with scale-out it may be a peer process, and only this function changes.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable
from uuid import UUID

import trio

from storage.records import IdempotencyRecord, LogEntry, TableRow, TableWrite, WriteGroup

from .actor import Proposal, TableActor, write_files
from .config import Config
from .errors import AlreadyExists, NotFound, Unavailable
from .metrics import Metrics

log = logging.getLogger(__name__)

StateLoader = Callable[[TableRow], Awaitable[Any]]


class Registry:
    def __init__(self, config: Config, store, files, metrics: Metrics):
        self.config = config
        self.store = store
        self.files = files
        self.metrics = metrics
        self.actors: dict[UUID, TableActor] = {}
        self.loaders: dict[str, StateLoader] = {}
        self._nursery: trio.Nursery | None = None
        metrics.add_gauges(self.gauges)

    def register_format(self, fmt: str, loader: StateLoader) -> None:
        """Each format says how to build its in-memory state from a table row."""
        self.loaders[fmt] = loader

    async def load_state(self, row: TableRow) -> Any:
        return await self.loaders[row.format](row)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(self)
            await trio.sleep_forever()

    # -- addressing ----------------------------------------------------------------------------------------

    def owner(self, table_id: UUID) -> TableActor:
        actor = self.actors.get(table_id)
        if actor is None:
            if self._nursery is None:
                raise Unavailable("coordinator is not running")
            actor = TableActor(self, table_id, self.config.mailbox_size)
            self.actors[table_id] = actor
            self._nursery.start_soon(actor.run, name=f"table-actor:{table_id}")
        return actor

    async def submit(self, table_id: UUID, proposal: Proposal) -> Any:
        """Hand a proposal to the table's owner and wait for its answer (after durability if it writes)."""
        return await self.owner(table_id).offer(proposal).wait()

    async def transact(self, parts: list[tuple[UUID, Proposal]], *, creates=(),
                       idempotency: IdempotencyRecord | None = None) -> list[Any]:
        """All parts (and creates) applied atomically, or none; see coordinator.transaction."""
        from .transaction import transact
        return await transact(self, parts, creates=list(creates), idempotency=idempotency)

    def retire(self, actor: TableActor) -> bool:
        """Called by an actor itself; succeeds only if no request is queued (checked in the same tick)."""
        if actor.send.statistics().current_buffer_used:
            return False
        if self.actors.get(actor.table_id) is actor:
            del self.actors[actor.table_id]
        return True

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
        await write_files(list(files), self.files)
        write = TableWrite(table_id=row.table_id, expected_version=0, epoch=0, state=row_state, bump=1,
                           log=list(log_entries), insert=row)
        group = WriteGroup([write], [idempotency] if idempotency else [])
        with trio.CancelScope(shield=True):
            result = await self.store.write(group)
        if not result.applied:
            if result.reason == "missing-namespace":
                raise NotFound(f"Namespace does not exist: {row.namespace.replace(chr(31), '.')}", kind="namespace")
            raise AlreadyExists(f"{row.kind.capitalize()} already exists: {row.name}", kind=row.kind)
        actor = self.owner(row.table_id)
        if not actor.loaded:
            from dataclasses import replace
            actor.row = replace(row, row_version=write.new_version, state=row_state)
            actor.state, actor.loaded, actor.gone = state, True, False

    # -- metrics ---------------------------------------------------------------------------------------------

    def gauges(self) -> dict[str, float]:
        depth = sum(a.send.statistics().current_buffer_used for a in self.actors.values())
        out = {"coordinator_active_actors": len(self.actors), "coordinator_mailbox_depth_total": depth}
        stats = self.store.writer_stats() if hasattr(self.store, "writer_stats") else {}
        if stats:
            out["coordinator_db_flushes_total"] = stats["flushes"]
            out["coordinator_db_groups_total"] = stats["groups"]
        return out
