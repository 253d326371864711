"""The service's own conversion of Delta tables to Iceberg, for tables that ask for UniForm Iceberg and whose
writers send no Iceberg metadata (`tables.service_converts`): kept up with the Delta commits, off the commit path.

- After each applied write to a Delta table its actor tells `written` (the registry's watch hook): a dictionary
  lookup or two, no waiting. A table behind its Delta version is queued once, however many commits arrive.
- `TASKS_PER_WORKER` tasks per worker take queued tables one at a time each, a table never in two at once (their
  waits overlap; the workers run the CPU parts one at a time each). A conversion reads the table's state from its
  actor (`Current`), runs `conversion.convert` in a worker process (`worker.py`: niced, so that the event loop
  and PostgreSQL keep the CPU they need), writes the new metadata files durably, and records the result with the
  table (`RecordConversion`, a compare-and-set on the metadata it started from). Commits that arrive meanwhile
  make the table due once more: the next conversion takes them all, to the latest version.
- A refusal (`conversion.Refused`) is recorded too: the Iceberg endpoint answers it to readers, with its reason,
  until a later version converts (rebuilt from the snapshot). So is a version whose conversion ended the worker
  process `WORKER_ENDS_REFUSED` times in a row (a crash no exception handler sees: the same input would end the
  next worker too). A failure of the storage is retried, later and later.
- At start every table that is behind is queued (a restart, or a conversion cut short by a crash, resumes from
  the last recorded conversion: the files a cut-short one wrote are orphans nobody references).
- Files a conversion made obsolete are deleted after `uniform_grace_s`, when no reader can still be planning
  with them; never a data file (they are the Delta table's).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

import trio

from storage.files import join

from coordinator.delta import DeltaTable
from coordinator.delta.proposals import Current, RecordConversion
from coordinator.delta.rows import FORMAT as DELTA_FORMAT
from coordinator.delta.state import catalog_view
from coordinator.errors import CommitConflict, NotFound
from coordinator.table_queue import TableQueue

from .catalog import UC_REALM, UniformCatalog
from .conversion import Converted, Job, Refused
from .tables import service_converts, why_not_convertible
from .worker import WorkerEnded, Workers

if TYPE_CHECKING:
    from coordinator.format import Services

log = logging.getLogger(__name__)

RETRY_FIRST_S, RETRY_MAX_S = 1.0, 60.0
# Conversions under way at once per worker process. Most of a conversion's time is waiting (its table's state, its
# files made durable, its record written), which several overlap: their files share fsync rounds, their records
# database transactions; the workers take the CPU parts one at a time each.
TASKS_PER_WORKER = 4
SWEEP_PAGE = 500
DELETE_EVERY_S = 5.0
WORKER_ENDS_REFUSED = 3


def behind(table: DeltaTable) -> int:
    """Versions the service's conversion lags the table by (0 when there is nothing it could convert)."""
    if not service_converts(table) or why_not_convertible(table.info.get("properties") or {}) is not None:
        return 0
    converted = table.converted or {}
    refused = converted.get("refused")
    if refused is not None and refused["version"] >= table.last:
        return 0   # nothing new since the refusal: a new version is what may convert
    return table.last - converted.get("delta_version", -1)


class Converter:
    def __init__(self, services: Services, catalog: UniformCatalog):
        self.services = services
        self.catalog = catalog
        self.config = services.config
        self.registry = services.registry
        self.files = services.files
        self.behind: dict[uuid.UUID, int] = {}      # the tables behind, and by how many versions
        self.queue = TableQueue()                   # the tables behind, each converted by one task at a time
        self.failures: dict[uuid.UUID, int] = {}    # consecutive failures, for the retry's back-off
        self.worker_ends: dict[uuid.UUID, int] = {}   # consecutive conversions that ended the worker process
        self.retrying: set[uuid.UUID] = set()       # failed, to be retried after its back-off (not before)
        self.obsolete: deque[tuple[float, str, list[str]]] = deque()   # (when, table location, files)
        self.counts = {"conversions": 0, "refusals": 0, "failures": 0}
        self.workers = Workers(self.config.uniform_workers)
        self._nursery: trio.Nursery | None = None
        if self.config.uniform_workers > 0:
            self.registry.watch(DELTA_FORMAT, self.written)
        services.metrics.add_gauges(self.gauges)
        services.metrics.add_counters(self.counters)

    # -- what is due -------------------------------------------------------------------------------------------

    def written(self, table_id: uuid.UUID, state: Any) -> None:
        """The registry's watch hook (coordinator/registry.py): called after every applied Delta write."""
        lag = behind(state) if isinstance(state, DeltaTable) else 0
        if lag <= 0:
            self.behind.pop(table_id, None)
            return
        self.behind[table_id] = lag
        self.want(table_id)

    def want(self, table_id: uuid.UUID) -> None:
        if table_id in self.retrying:
            return
        self.queue.want(table_id)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.config.uniform_workers > 0:
                    for _ in range(self.config.uniform_workers * TASKS_PER_WORKER):
                        nursery.start_soon(self._work)
                    nursery.start_soon(self._sweep)
                nursery.start_soon(self._delete_obsolete)
                task_status.started()
        finally:
            self.workers.close()

    async def _sweep(self) -> None:
        """Queue every table this member owns that is behind (at start: what a restart left to do)."""
        store = self.services.store
        try:
            for catalog in await store.list_catalogs(UC_REALM):
                after = None
                while True:
                    rows = await store.list_tables(UC_REALM, catalog, None, kind="table", after=after,
                                                   limit=SWEEP_PAGE)
                    for row in rows:
                        table = catalog_view(row)
                        if table is not None and self.registry.owns(row.table_id):
                            self.written(row.table_id, table)
                    if len(rows) < SWEEP_PAGE:
                        break
                    after = rows[-1].cursor
        except Exception as exc:   # the next write to each table queues it anyway
            log.warning("UniForm: looking for tables behind their Iceberg conversion failed: %s", exc)

    async def _work(self) -> None:
        async for table_id in self.queue:
            try:
                await self._convert(table_id)
                self.failures.pop(table_id, None)
            except Exception as exc:
                self.counts["failures"] += 1
                n = self.failures[table_id] = self.failures.get(table_id, 0) + 1
                delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (n - 1))
                log.warning("UniForm: converting table %s to Iceberg failed (%s: %s); retrying in %g s", table_id,
                            type(exc).__name__, exc, delay)
                self.retrying.add(table_id)
                self._nursery.start_soon(self._retry, table_id, delay)
            finally:
                if self.queue.done(table_id):
                    self.want(table_id)

    async def _retry(self, table_id: uuid.UUID, delay_s: float) -> None:
        await trio.sleep(delay_s)
        self.retrying.discard(table_id)
        self.want(table_id)

    # -- one conversion ----------------------------------------------------------------------------------------

    async def _convert(self, table_id: uuid.UUID) -> None:
        try:
            table: DeltaTable = await self.registry.submit(table_id, Current(str(table_id)))
        except NotFound:
            self.behind.pop(table_id, None)
            return
        if behind(table) <= 0:
            self.behind.pop(table_id, None)
            return
        converted = table.converted or {}
        base = converted.get("metadata_location")
        base_metadata = await self.catalog.metadata_file(table_id, base, table.location) if base else None
        # After a refusal, rebuild from the snapshot: the refused commit may have been undone since.
        base_version = None if "refused" in converted else converted.get("delta_version")
        staged = {c["version"]: c["file_name"] for c in table.unpublished}
        if base_version is not None and base_version < table.published:
            # The versions to convert as the catalog ratified them: the log files a writer publishes are copies of
            # these staged commits, and it may have reported them published before (or without) copying them.
            ratified = await self.services.store.read_log(table_id, start=base_version + 1, end=table.published)
            staged.update((e.version, e.payload["file_name"]) for e in ratified)
        job = Job(table_id=str(table_id), location=table.location,
                  s3_options=dict(self.files.s3_options_for(table.location)), target=table.last, staged=staged,
                  base_version=base_version, base_location=base, base_metadata=base_metadata,
                  max_metadata_bytes=self.config.uniform_max_metadata_bytes)
        try:
            outcome = await self.workers.run(job)
        except WorkerEnded as exc:
            ends = self.worker_ends[table_id] = self.worker_ends.get(table_id, 0) + 1
            if ends < WORKER_ENDS_REFUSED:
                raise
            outcome = Refused(job.target, f"converting it ended the conversion worker {ends} times in a row ({exc})")
        self.worker_ends.pop(table_id, None)
        if isinstance(outcome, Refused):
            record = {k: v for k, v in converted.items() if k != "refused"}
            record["refused"] = {"version": outcome.version, "reason": outcome.reason}
            log.warning("UniForm: table %s (%s) version %d cannot be converted to Iceberg: %s", table_id,
                        ".".join(table.full_name), outcome.version, outcome.reason)
            self.counts["refusals"] += 1
            await self._record(table_id, base, record)
            return
        await self._install(table, base, outcome)

    async def _install(self, table: DeltaTable, base: str | None, outcome: Converted) -> None:
        """Make the new files durable, then record them with the table: only then may a reader be served them."""
        location = table.location
        await self.files.write_many([(uri, data, None, location) for uri, data in outcome.files])
        record = {"metadata_location": outcome.metadata_location, "delta_version": outcome.delta_version,
                  "delta_timestamp": outcome.delta_timestamp}
        try:
            await self._record(table.table_id, base, record)
        except (CommitConflict, NotFound):
            # Another conversion came first, or the table was dropped: these files are orphans nobody references.
            await self.files.discard([uri for uri, _ in outcome.files], join(location, "metadata"))
            raise
        self.catalog.remember(table.table_id, outcome.metadata_location, outcome.metadata_json, outcome.refs_json)
        self.counts["conversions"] += 1
        if outcome.obsolete:
            self.obsolete.append((time.monotonic() + self.config.uniform_grace_s, location, outcome.obsolete))

    async def _record(self, table_id: uuid.UUID, base: str | None, record: dict) -> None:
        await self.registry.submit(table_id, RecordConversion(str(table_id), base, record))

    async def _delete_obsolete(self) -> None:
        while True:
            await trio.sleep(min(DELETE_EVERY_S, self.config.uniform_grace_s))
            now = time.monotonic()
            while self.obsolete and self.obsolete[0][0] <= now:
                _, location, uris = self.obsolete.popleft()
                try:
                    await trio.to_thread.run_sync(self.files.delete_listed_sync, location, uris)
                except Exception as exc:   # a leftover metadata file is only litter
                    log.warning("UniForm: deleting obsolete Iceberg metadata of %s failed: %s", location, exc)

    # -- metrics -----------------------------------------------------------------------------------------------

    def gauges(self) -> dict[str, float]:
        return {"coordinator_uniform_versions_behind": sum(self.behind.values()),
                "coordinator_uniform_tables_behind": len(self.behind)}

    def counters(self) -> dict[str, float]:
        return {"coordinator_uniform_conversions_total": self.counts["conversions"],
                "coordinator_uniform_refusals_total": self.counts["refusals"],
                "coordinator_uniform_failures_total": self.counts["failures"]}
