"""The service publishes ratified Delta commits itself (docs/maintenance.md; `coordinator/delta/publishing.py`).

- After each applied write to a Delta table its actor tells `written` (the registry's watch hook): a table that
  opted in and has unpublished commits is queued once, however many commits arrive meanwhile.
- A task takes queued tables one at a time: it reads the table from its actor, copies each unpublished ratified
  commit, in version order, from `_delta_log/_staged_commits/` to `_delta_log/<v>.json` (put-if-absent: where
  the writer published already, the same bytes are there), then records the published version with the table
  (`RecordPublished`). A different file already at `<v>.json` is an alert (logged, counted): it is never
  overwritten, and nothing after it is published.
- At start every table that opted in and is behind is queued again after its next commit; one a crash left behind
  is published from where the record stands (copies made before the crash are found in place).
"""

from __future__ import annotations

import logging
import math
import uuid
from typing import TYPE_CHECKING, Any

import trio

from coordinator.delta import DeltaTable
from coordinator.delta import publishing
from coordinator.delta.proposals import Current
from coordinator.delta.rows import FORMAT as DELTA_FORMAT
from coordinator.errors import NotFound
from coordinator.table_queue import TableQueue

if TYPE_CHECKING:
    from coordinator.format import Services

log = logging.getLogger(__name__)

RETRY_S = 1.0


class Publisher:
    def __init__(self, services: Services):
        self.config = services.config
        self.registry = services.registry
        self.files = services.files
        self.counts = {"published": 0, "conflicts": 0, "failures": 0}
        self.queue = TableQueue()
        self.refused: dict[uuid.UUID, int] = {}   # table -> the version whose place holds another file
        self.registry.watch(DELTA_FORMAT, self.written)
        services.metrics.add_counters(lambda: {
            "coordinator_maintenance_published_commits_total": self.counts["published"],
            "coordinator_maintenance_publish_conflicts_total": self.counts["conflicts"],
            "coordinator_maintenance_publish_failures_total": self.counts["failures"]})

    def written(self, table_id: uuid.UUID, state: Any) -> None:
        """The registry's watch hook: called in the actor's task after every applied Delta write."""
        if not isinstance(state, DeltaTable) or state.last <= state.published \
                or not publishing.enabled(state, self.config.maintenance_publish_delta):
            return
        if self.refused.get(table_id, math.inf) <= state.published + 1:
            return   # stopped at a version whose place holds another file: the alert stands until that is solved
        self.queue.want(table_id)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for table_id in self.queue:
            try:
                await self.publish(table_id)
            except Exception as exc:
                self.counts["failures"] += 1
                log.warning("publishing the Delta commits of table %s failed (%s: %s); tried again after its next "
                            "commit", table_id, type(exc).__name__, exc)
                await trio.sleep(RETRY_S)
            finally:
                if self.queue.done(table_id):
                    self.queue.want(table_id)

    async def publish(self, table_id: uuid.UUID) -> None:
        try:
            table: DeltaTable = await self.registry.submit(table_id, Current(str(table_id)))
        except NotFound:
            return
        due = publishing.due(table)
        done, refused = await trio.to_thread.run_sync(_copy, self.files, table.location, publishing.log_dir(table),
                                                      due)
        self.counts["published"] += done
        if refused:
            version, staged, target = due[done]
            self.counts["conflicts"] += 1
            self.refused[table_id] = version
            log.error("ALERT: Delta table %s (%s): _delta_log/%s already holds a file that is not the ratified "
                      "commit %s; it was left intact and nothing from version %d on is published by the service",
                      table_id, ".".join(table.full_name), target, staged, version)
        if done:
            await self.registry.submit(table_id, publishing.RecordPublished(str(table_id), due[done - 1][0]))


def _copy(files, location: str, log_dir: str, due: list[tuple[int, str, str]]) -> tuple[int, bool]:
    """Copy the due commits to their published names, in version order (a worker thread)."""
    copies = [(target, files.read_within_sync(staged, location)) for _, staged, target in due]
    return files.put_if_absent_sync(log_dir, copies, location)
