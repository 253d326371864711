"""The coordinator's own maintenance of tables, beside their writers (docs/maintenance.md): Iceberg snapshot
expiry here, the publishing of ratified Delta commits in `publisher.py`.

Iceberg snapshot expiry:

- After each applied write to an Iceberg table its actor tells `written` (the registry's watch hook): a property
  lookup and, on a table that opted in, a cheap test of its limits (`expiry.over_limits`). A table over them is
  queued once, at most once per `maintenance_interval_s`.
- A task takes queued tables one at a time: it reads the table's state from its actor, plans the expiry
  (`expiry.plan`), records the claim on what the expired snapshots' files may leave to delete (`deletions`),
  and hands the actor `ExpireSnapshots`, a commit like any other: it joins the batch of whatever writers' commits
  are waiting, written in their group, and has no requirements, so it never fails as a conflict and never makes a
  writer's commit fail.
- Once it is durable, the files only the expired snapshots referenced are deleted (`Deletions.run`), after
  `maintenance_delete_grace_s`.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from storage import faults

from coordinator.errors import NotFound
from coordinator.iceberg import cleanup, expiry
from coordinator.iceberg.rows import FORMAT as ICEBERG_FORMAT
from coordinator.iceberg.state import IcebergTable, TableIdent

from .deletions import Deletions, retained_lists
from .publisher import Publisher

if TYPE_CHECKING:
    from coordinator.format import Services
    from coordinator.iceberg.service import IcebergService

log = logging.getLogger(__name__)

RETRY_S = 5.0


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Report:
    """What an expiry did, or (dry run) would do."""

    table_id: str
    expired_snapshots: list[int] = field(default_factory=list)
    removed_refs: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)   # what would be deleted (dry run) or was claimed
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"table-id": self.table_id, "expired-snapshots": self.expired_snapshots,
                "removed-refs": self.removed_refs, "files": self.files, "note": self.note}


class Maintainer:
    def __init__(self, services: Services, iceberg: IcebergService):
        self.iceberg = iceberg   # whose names resolve `coordinator table maintain NAME`
        self.config = services.config
        self.registry = services.registry
        self.store = services.store
        self.files = services.files
        self.counts = {"expiry_commits": 0, "snapshots_expired": 0, "refs_removed": 0, "expiry_failures": 0,
                       "expiry_cpu_seconds": 0.0, "files_deleted": 0, "deletion_cpu_seconds": 0.0,
                       "deletion_failures": 0}
        self.deletions = Deletions(services, self.counts)
        self.publisher = Publisher(services)   # Delta: ratified commits published by the service
        self.due: set[uuid.UUID] = set()         # queued, waiting for its interval, or running
        self.again: set[uuid.UUID] = set()       # committed to while due: looked at again once its expiry ran
        self.last_run: dict[uuid.UUID, float] = {}
        self._send, self._receive = trio.open_memory_channel[uuid.UUID](math.inf)
        self._nursery: trio.Nursery | None = None
        self.registry.watch(ICEBERG_FORMAT, self.written)
        services.metrics.add_counters(self.counters)
        services.metrics.add_gauges(lambda: {"coordinator_maintenance_deletions_running": self.deletions.pending,
                                                "coordinator_maintenance_tables_due": len(self.due)})

    # -- what is due -------------------------------------------------------------------------------------------

    def written(self, table_id: uuid.UUID, state: Any) -> None:
        """The registry's watch hook: called in the actor's task after every applied Iceberg write."""
        if not isinstance(state, IcebergTable):
            return
        if table_id in self.due:   # queued, or running: a running expiry planned before this commit, so again after
            self.again.add(table_id)
            return
        metadata = state.metadata
        if not expiry.enabled(metadata, self.config.maintenance_expire_snapshots):
            return
        if not expiry.over_limits(metadata, now_ms()):
            return
        self._schedule(table_id)

    def _schedule(self, table_id: uuid.UUID) -> None:
        self.due.add(table_id)
        wait = self.last_run.get(table_id, -math.inf) + self.config.maintenance_interval_s - time.monotonic()
        if wait <= 0 or self._nursery is None:
            self._send.send_nowait(table_id)
        else:
            self._nursery.start_soon(self._later, table_id, wait)

    async def _later(self, table_id: uuid.UUID, wait_s: float) -> None:
        await trio.sleep(wait_s)
        self._send.send_nowait(table_id)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._work)
            nursery.start_soon(self.deletions.resume_forever)
            nursery.start_soon(self.publisher.run)
            task_status.started()

    async def _work(self) -> None:
        async for table_id in self._receive:
            self.last_run[table_id] = time.monotonic()
            try:
                await self.expire(table_id)
            except Exception as exc:
                self.counts["expiry_failures"] += 1
                log.warning("expiring snapshots of table %s failed (%s: %s); tried again after its next commit",
                            table_id, type(exc).__name__, exc)
            finally:
                self.due.discard(table_id)
                if table_id in self.again:   # committed to while it ran: looked at again (after the interval)
                    self.again.discard(table_id)
                    self._schedule(table_id)

    async def maintain(self, catalog: str, namespace: tuple[str, ...], name: str, *, dry_run: bool) -> Report:
        """`coordinator table maintain NAME`: expire the named Iceberg table's snapshots now (dry run: report)."""
        table_id = await self.iceberg.names.id((TableIdent(catalog, namespace, name), "table"))
        return await self.expire(table_id, dry_run=dry_run)

    # -- one expiry ------------------------------------------------------------------------------------------

    async def expire(self, table_id: uuid.UUID, *, dry_run: bool = False) -> Report:
        """Expire what the table's policy expires now (dry run: say what would be expired and deleted)."""
        report = Report(str(table_id))
        try:
            table = await self.registry.submit(table_id, expiry.Current())
        except NotFound:
            report.note = "no such table"
            return report
        if not isinstance(table, IcebergTable):
            report.note = "not an Iceberg table"
            return report
        if not dry_run and not expiry.enabled(table.metadata, self.config.maintenance_expire_snapshots):
            report.note = f"{expiry.ENABLED} is not true"
            return report
        at = now_ms()
        planned = expiry.plan(table.metadata, at)
        report.expired_snapshots, report.removed_refs = list(planned.snapshot_ids), list(planned.refs)
        if not planned:
            return report
        lists = expiry.manifest_lists(table.metadata, planned.snapshot_ids)
        claim = self.deletions.claim(table, lists)
        if dry_run:
            report.files = await self._would_delete(table, planned, claim)
            return report
        if claim is not None:
            await self.store.deletions.record(claim)   # first: a crash after the commit still deletes
            report.files = list(claim.manifest_lists)
            if faults.ARMED:
                faults.hit("expiry-claimed")
        start = time.thread_time()
        done: expiry.Expired = await self.registry.submit(table_id, expiry.ExpireSnapshots(table.ident, planned, at))
        self.counts["expiry_cpu_seconds"] += done.cpu_s if done.cpu_s else time.thread_time() - start
        if done.snapshot_ids or done.refs:
            self.counts["expiry_commits"] += 1
            self.counts["snapshots_expired"] += len(done.snapshot_ids)
            self.counts["refs_removed"] += len(done.refs)
            log.info("table %s: expired %d snapshots%s", table.ident, len(done.snapshot_ids),
                     f" and refs {', '.join(done.refs)}" if done.refs else "")
        if claim is not None:
            if faults.ARMED:
                faults.hit("expiry-committed")
            self._nursery.start_soon(self.deletions.run, claim, self.config.maintenance_delete_grace_s)
        return report

    async def _would_delete(self, table: IcebergTable, planned: expiry.Expiry, claim) -> list[str]:
        if claim is None:
            return []
        kept = [s for s in table.metadata.get("snapshots") or [] if s["snapshot-id"] not in set(planned.snapshot_ids)]
        after = IcebergTable(table.ident, {**table.metadata, "snapshots": kept}, table.metadata_location, b"")
        try:
            plan = await trio.to_thread.run_sync(cleanup.plan, self.files, claim.location, claim.manifest_lists,
                                                 retained_lists(after))
        except cleanup.Unknowable as exc:
            return [f"(nothing: {exc})"]
        return plan.files

    # -- metrics -----------------------------------------------------------------------------------------------

    def counters(self) -> dict[str, float]:
        c = self.counts
        return {"coordinator_maintenance_expiry_commits_total": c["expiry_commits"],
                "coordinator_maintenance_snapshots_expired_total": c["snapshots_expired"],
                "coordinator_maintenance_refs_removed_total": c["refs_removed"],
                "coordinator_maintenance_expiry_failures_total": c["expiry_failures"],
                "coordinator_maintenance_expiry_cpu_seconds_total": c["expiry_cpu_seconds"],
                "coordinator_maintenance_files_deleted_total": c["files_deleted"],
                "coordinator_maintenance_deletion_cpu_seconds_total": c["deletion_cpu_seconds"],
                "coordinator_maintenance_deletion_failures_total": c["deletion_failures"]}
