"""Deleting the files only expired snapshots referenced, through the guards of every purge: the claim is recorded
before the expiry commit (`record`), renewed while the deletion runs (`purges.Renewal`), taken over and resumed
when nobody renewed it (a crash: `resume_forever`), and only files within the table's location are deleted, by
`Files.delete_listed_sync` (directory descriptors, no link followed).

A deletion plans from the table's state as its actor holds it at that moment (`cleanup.plan`), and before each
chunk of files asks the actor again: the manifest lists of snapshots committed since are read first and what they
reference leaves the plan, so a file that a snapshot committed meanwhile references again is never deleted.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any
from uuid import UUID

import trio

from storage import faults
from storage.files import is_below
from storage.records import FileDeletion

from coordinator.errors import CoordinatorError, NotFound
from coordinator.iceberg import cleanup
from coordinator.iceberg.expiry import Current
from coordinator.iceberg.files import gc_enabled
from coordinator.iceberg.state import IcebergTable
from coordinator.purges import PURGE_RETRY_S, Renewal, _clock

if TYPE_CHECKING:
    from coordinator.format import Services

log = logging.getLogger(__name__)

CHUNK = 256   # files deleted between two looks at the table's newest snapshots


def retained_lists(table: IcebergTable) -> list[str]:
    """The manifest lists of the snapshots the table keeps, newest first (the newest names the most manifests)."""
    return [s["manifest-list"] for s in reversed(table.metadata.get("snapshots") or [])
            if isinstance(s.get("manifest-list"), str)]


class Deletions:
    def __init__(self, services: Services, counts: dict[str, float]):
        self.store, self.files, self.registry = services.store, services.files, services.registry
        self.config = services.config
        self.counts = counts
        self.pending = 0
        self.lists = cleanup.ManifestLists()   # what the expired and retained manifest lists name

    def claim(self, table: IcebergTable, manifest_lists: list[str]) -> FileDeletion | None:
        """The claim an expiry of these snapshots records first; None when it may delete nothing: `gc.enabled`
        is false, the table lies outside the warehouse, or no expired manifest list is within its location."""
        location = table.metadata.get("location")
        if not (isinstance(location, str) and gc_enabled(table.metadata)
                and is_below(self.config.warehouse_uri, location)):
            return None
        lists = [ml for ml in manifest_lists if is_below(location, ml)]
        if not lists:
            return None
        return FileDeletion(uuid.uuid4(), uuid.UUID(str(table.metadata["table-uuid"])), location, lists,
                            uuid.uuid4())

    async def run(self, claim: FileDeletion, grace_s: float) -> bool:
        """Delete what the claim's files reach and no retained snapshot does, after `grace_s` (readers that loaded
        the table before the expiry may still be planning with them); end the claim. True if it ended."""
        self.pending += 1
        renewal = Renewal(self.store, {claim.claim_id: claim.owner}, _clock(), renew=self.store.deletions.renew)
        failure: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(renewal.run)
                try:
                    await trio.sleep(grace_s)
                    await self._delete(claim, renewal.lapsed)
                except Exception as exc:   # raised as it is, not inside the nursery's ExceptionGroup
                    failure = exc
                lapsed = renewal.lapsed()   # (before the renewal's task ends, which stops it)
                nursery.cancel_scope.cancel()
        finally:
            self.pending -= 1
        if failure is not None or lapsed:
            self.counts["deletion_failures"] += 1
            log.warning("deleting the files expired snapshots of table %s referenced stopped (%s); resumed "
                        "within %d s", claim.table_id, failure or "its claim could not be renewed", PURGE_RETRY_S)
            return False
        await self.store.deletions.end(claim.claim_id, claim.owner)
        return True

    async def current(self, table_id: UUID) -> Any:
        try:
            return await self.registry.submit(table_id, Current())
        except NotFound:
            return None

    async def _delete(self, claim: FileDeletion, stop) -> None:
        table = await self.current(claim.table_id)
        if not isinstance(table, IcebergTable) or not gc_enabled(table.metadata) \
                or table.metadata.get("location") != claim.location:
            # Dropped (its drop decides about its files), `gc.enabled` turned off, or moved: nothing is deleted.
            log.info("table %s: not deleting what its expired snapshots referenced (dropped, gc.enabled=false or "
                     "moved)", claim.table_id)
            return
        try:
            plan = await trio.to_thread.run_sync(cleanup.plan, self.files, claim.location, claim.manifest_lists,
                                                 retained_lists(table), self.lists)
        except cleanup.Unknowable as exc:
            log.warning("table %s: what a retained snapshot references is unknown (%s); nothing that expired "
                        "snapshots referenced is deleted", claim.table_id, exc)
            return
        done: set[str] = set()
        cpu = plan.cpu_s
        try:
            while True:
                table = await self.current(claim.table_id)
                if not isinstance(table, IcebergTable) or not gc_enabled(table.metadata):
                    return
                newer = [ml for ml in retained_lists(table) if ml not in plan.seen_lists]
                if newer:   # snapshots committed since: what they reference stays
                    before = plan.cpu_s
                    await trio.to_thread.run_sync(plan.protect, self.files, newer)
                    cpu += plan.cpu_s - before
                chunk = plan.next_chunk(done, CHUNK)
                if not chunk:
                    return
                if faults.ARMED and done and chunk[0] in plan.manifests:
                    faults.hit("mid-deletion")
                cpu += await trio.to_thread.run_sync(_timed_delete, self.files, claim.location, chunk, stop)
                done.update(chunk)
                for uri in chunk:
                    self.lists.forget(uri)   # (a deleted file is named by no snapshot again)
                self.counts["files_deleted"] += len(chunk)
        except cleanup.Unknowable as exc:
            log.warning("table %s: what a new snapshot references is unknown (%s); the rest of what expired "
                        "snapshots referenced stays", claim.table_id, exc)
        finally:
            self.counts["deletion_cpu_seconds"] += cpu

    async def resume_forever(self) -> None:
        """Claims nobody renewed (a crash, a failed deletion): at start those of a single member at once (in a
        cluster after PURGE_RETRY_S), then every PURGE_RETRY_S."""
        older_than = PURGE_RETRY_S if self.config.cluster else 0.0
        while True:
            try:
                for claim in await self.store.deletions.pending(older_than):
                    owner = await self.store.deletions.take_over(claim.claim_id, older_than)
                    if owner is None:
                        continue
                    log.info("resuming the deletion of files expired snapshots of table %s referenced",
                             claim.table_id)
                    await self.run(FileDeletion(claim.claim_id, claim.table_id, claim.location,
                                                claim.manifest_lists, owner), 0.0)
            except (CoordinatorError, Exception) as exc:   # noqa: BLE001 - retried on the next pass
                log.warning("cannot resume pending file deletions (retried in %d s): %s", PURGE_RETRY_S, exc)
            await trio.sleep(PURGE_RETRY_S)
            older_than = PURGE_RETRY_S


def _timed_delete(files, location: str, uris: list[str], stop) -> float:
    start = time.thread_time()
    files.delete_listed_sync(location, uris, stop)
    return time.thread_time() - start
