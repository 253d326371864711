"""Deleting a dropped table's files: the drop's claim on its location, the deletion that ends it, and its renewal.

A drop writes a claim on its table's location in the same transaction (`Decision.purge`); no table can be created
there while it stands. The deletion runs after the drop is durable (`Decision.after_durable`), renews the claim
while it works, and ends it; one that did not end (a crash, a failure) is taken over and resumed later, here or by
another member (`Resumer.resume_forever`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from uuid import UUID

import trio

from storage.files import DeletionStopped
from storage.interface import Files, PurgeClaims, Store
from storage.records import PurgeClaim

from .crossable import crossable

log = logging.getLogger(__name__)

# What a claim that names its table's metadata (`PurgeClaim.metadata_location`) deletes: the files within the
# location that it reaches, in deletion order (None: it is gone, the deletion had ended). Given by the format that
# writes such claims (`PurgeListing`): Iceberg names its metadata file (its snapshots, manifests and data files),
# Lance its `_versions/` directory (Lance's own files in the location). A claim that names nothing deletes its
# location's whole tree.
Listing = Callable[[Any, str, str], "list[str] | None"]


@dataclass(frozen=True)
class PurgeListing:
    """A format's `Listing`, and how its claims are told from another format's by what they name (`claims(named)`:
    Lance's name a directory, with a trailing `/`; Iceberg's a file): a deletion resumed after a crash lists a
    claim's files by the one format that claims it (coordinator/registry.py)."""

    claims: Callable[[str], bool]
    files: Listing

PURGE_RETRY_S = 600  # a failed deletion of a dropped table's files is retried this often
# How long since a claim was renewed: boot time, which (unlike the monotonic clock) also runs while the host is
# suspended, so a process resumed from that knows its claims may have been taken over.
_clock = functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") \
    else time.monotonic


def purge_after_drop(store: PurgeClaims, files: Files, location: str, metadata_location: str | None = None,
                     listing: Listing | None = None) -> tuple[PurgeClaim, Callable[[], Awaitable[bool]]]:
    """A drop's claim on its location (Decision.purge) and the deletion that ends it (its `after_durable`): a
    partial of a module function, not a closure, so that it can travel to a table's owner in a cluster."""
    claim = PurgeClaim(location, uuid.uuid4(), metadata_location)
    return claim, functools.partial(delete_own_location, store, files, location, claim.owner, listing)


@crossable
async def delete_own_location(store: Store, files: Files, location: str, owner: UUID | None = None,
                              listing: Listing | None = None) -> bool:
    """Delete a dropped table's location, unless another table lives at, above or below it (rows from before
    locations were exclusive, or an Iceberg table moved there by `set-location`): then nothing, and a warning.
    True if deleted. A module function, so that a clean-up partial can travel to a table's owner.

    The drop claimed the location (Decision.purge), so no table can be created there meanwhile; the claim ends
    here, or stays if the deletion failed, to be retried (Resumer.resume_forever). `owner` is the claim's token
    (PurgeClaim.owner, or a member's that took the claim over; None in claims from before drops wrote one). A
    claim that names its table's metadata deletes only what `listing` says that reaches, else the location's tree."""
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
    renewal = Renewal(store, {location: owner}, confirmed_at)
    failure = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(renewal.run)
        try:
            if metadata is None:
                await files.delete_tree(location, renewal.lapsed)
            elif listing is None:   # never the whole tree: the location may hold files the table does not own
                raise DeletionStopped(f"the claim on {location} names {metadata}, and no format lists its files")
            else:
                await trio.to_thread.run_sync(_delete_listed, files, location, metadata, listing, renewal.lapsed)
        except Exception as exc:   # raised as it is, not inside the nursery's ExceptionGroup
            failure = exc
        if failure is None and renewal.lapsed():
            failure = DeletionStopped(f"the deletion of {location} stopped: its claim could not be renewed")
        nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure   # the claim stays: a later pass deletes what is left
    await store.end_purge(location, owner)
    return True


def _delete_listed(files, location: str, named: str, listing: Listing, stop: Callable[[], bool]) -> None:
    """Delete the files `named` reaches within `location`, then the directories that leaves empty (a worker
    thread)."""
    files.delete_listed_sync(location, listing(files, location, named) or [], stop)


class Renewal:
    """Keeps claims renewed while their deletions run or wait their turn (a large table on an object store may take
    long), so that `Resumer.resume_forever` here or on another member never starts a second deletion that would
    outlive the claim.

    `lapsed()` turns true once the claims may no longer be ours, and the deletion (a thread, which cannot be
    cancelled) stops at its next file, its claim left for later: when another member took a claim over, when
    this task ended (a shutdown cancelled it), or when no renewal succeeded for half the time after which
    another member takes claims over. That last is checked against the clock, not by this task, so that a
    process that froze (a paused VM) stops at once when it wakes, before this task has run again."""

    def __init__(self, store, claims: dict[Any, UUID | None], renewed_at: float, renew=None):
        self.store, self.claims = store, claims   # location -> owner token; `claims` may change while this runs
        # (claim, owner) -> still ours: a dropped table's location by default; the claims on files of live tables
        # (coordinator/maintenance) are renewed the same way.
        self.renew = renew
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
                        if not await (self.renew or self.store.renew_purge)(location, owner):
                            log.warning("the claim on %s was taken over by another member: stopping", location)
                            return
                    self._valid_until = sent + PURGE_RETRY_S / 2
                except Exception as exc:
                    log.warning("cannot renew the claims on %s: %s", sorted(self.claims), exc)
        finally:
            self._stop.set()


class Resumer:
    """Resumes deletions that did not end (a crash, or a failed deletion: the claim stays), here or, in a cluster,
    those another member stopped renewing."""

    def __init__(self, store, files, *, cluster: bool, listing: Listing | None = None):
        self.store, self.files, self.cluster, self.listing = store, files, cluster, listing

    async def take_over_at_start(self) -> tuple[dict[str, UUID], float]:
        """In a cluster another member may be deleting at our start-up: only claims nobody renewed are taken."""
        return await self._take_over_purges(PURGE_RETRY_S if self.cluster else 0.0)

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

    async def resume_forever(self, taken: dict[str, UUID], taken_at: float) -> None:
        """Deletions of dropped tables' locations that did not end (a crash, or a failed deletion: the claim
        stays): those taken over at start-up, then every PURGE_RETRY_S the claims nobody renewed for that long (a
        running deletion renews its claim, `Renewal`)."""
        while True:
            if taken:
                await self._resume(taken, taken_at)
            await trio.sleep(PURGE_RETRY_S)
            taken, taken_at = await self._take_over_purges(PURGE_RETRY_S)

    async def _resume(self, taken: dict[str, UUID], taken_at: float) -> None:
        """Delete the locations of claims taken over, one after another."""
        waiting = dict(taken)   # renewed until their turn: taken over, they are ours alone
        renewal = Renewal(self.store, waiting, taken_at)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(renewal.run)
            for location, owner in taken.items():
                if renewal.lapsed():
                    break   # no longer surely ours: left for a later pass, here or on another member
                del waiting[location]   # from now on its deletion renews it
                log.info("resuming the deletion of dropped table files at %s", location)
                try:
                    await delete_own_location(self.store, self.files, location, owner, self.listing)
                except Exception as exc:
                    log.warning("deleting dropped table files at %s failed (retried in %d s): %s", location,
                                PURGE_RETRY_S, exc)
            nursery.cancel_scope.cancel()

