"""Shard leases: which member owns which shard, under which epoch (the fencing token).

Every `renew_s` a member, in one pass: heartbeats, renews the leases it holds, reads who owns every shard, takes
over expired shards while it holds fewer than its fair share, and releases shards while it holds more.

- A takeover bumps the shard's epoch in one statement conditioned on `expires_at < now()`: the DATABASE's clock,
  so no two hosts' clocks are ever compared. Every table write checks that epoch (storage/writer.py), so a
  former owner that is paused or partitioned can change nothing once its lease moved, even before it knows.
- Locally, a lease counts as held only until `start + ttl - margin`, measured on this process's monotonic clock
  from the START of the statement that renewed it: the database set `expires_at = now() + ttl` with a `now()` no
  earlier than that start, so this member stops serving a shard before anyone else may take it. A member that
  cannot renew (database unreachable, process paused) thus stops serving on its own.
- The SQL, and the member rows (heartbeat and address) renewed with the leases, are storage's (storage/leases.py).
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from uuid import UUID

import trio

from storage.records import SHARDS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lease:
    epoch: int
    valid_until: float  # time.monotonic(): serve the shard only before this


@dataclass(frozen=True)
class ShardOwner:
    """A shard's lease row as last read: who owns it, under which epoch, and where to reach them."""

    member: UUID | None
    epoch: int
    address: str | None
    live: bool  # not expired by the database's clock when read


class Leases:
    def __init__(self, store, member_id: UUID, *, ttl_s: float, renew_s: float, margin_s: float):
        if not 0 < renew_s < ttl_s - margin_s:
            raise ValueError("leases must be renewed (renew_s) well within their ttl_s minus the safety margin")
        self.store = store
        self.member_id = member_id
        self.address = ""
        self.ttl_s, self.renew_s, self.margin_s = ttl_s, renew_s, margin_s
        self.held: dict[int, Lease] = {}
        self.owners: dict[int, ShardOwner] = {}
        self.live_members = 0
        self._round_done = trio.Event()
        self.takeovers = 0
        self.stopping = False   # handing over on the way out: serve nothing, take nothing, renew nothing
        self.handed_over: list[int] = []
        self.on_round: list = []  # callbacks after each pass (the router abandons calls to former owners)

    # -- what the rest of the process asks -------------------------------------------------------------------

    def epoch(self, shard: int) -> int | None:
        """The epoch under which this member may serve `shard` right now, or None."""
        lease = self.held.get(shard)
        if lease is None or time.monotonic() >= lease.valid_until:
            return None
        return lease.epoch

    def owner(self, shard: int) -> ShardOwner | None:
        return self.owners.get(shard)

    def lost(self, shard: int, epoch: int) -> None:
        """A write under `epoch` was fenced: the shard moved although our clock said otherwise. Stop serving it."""
        lease = self.held.get(shard)
        if lease is not None and lease.epoch == epoch:
            log.warning("lease of shard %d (epoch %d) found moved by a fenced write", shard, epoch)
            del self.held[shard]

    async def next_round(self) -> None:
        """Wait until the next pass has refreshed the owners' map."""
        await self._round_done.wait()

    # -- the loop ----------------------------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            try:
                await self._round()
            except trio.Cancelled:
                raise
            except Exception as exc:  # database down: keep what is still valid locally, try again
                log.warning("lease round failed: %s", exc)
            for callback in self.on_round:
                callback()
            self._round_done.set()
            self._round_done = trio.Event()
            if not started:
                task_status.started()
                started = True
            await trio.sleep(self.renew_s)

    async def _round(self) -> None:
        if self.stopping:
            return
        start = time.monotonic()
        me, ttl = self.member_id, self.ttl_s
        found = await self.store.leases.renew(me, self.address, ttl)
        if self.stopping:   # began handing over while the renewal was under way: keep serving nothing
            return
        valid_until = start + ttl - self.margin_s
        held = {shard: Lease(epoch, valid_until) for shard, epoch in found.renewed.items()}
        for shard in set(self.held) - set(held):
            log.warning("lease of shard %d lost (epoch %d)", shard, self.held[shard].epoch)
        self.held = held
        self.live_members = max(found.live_members, 1)
        self.owners = {r.shard: ShardOwner(r.owner, r.epoch, r.address, r.live) for r in found.shards}
        target = math.ceil(SHARDS / self.live_members)

        # Take over: expired shards while below the fair share; shards orphaned for a whole ttl always (their
        # owner is gone and the others' shares are full).
        free = [r.shard for r in found.shards if not r.live and r.owner != me]
        orphaned = {r.shard for r in found.shards if r.orphaned}
        random.shuffle(free)  # members racing for released shards spread over them
        wanted = sorted(set(free[:max(target - len(held), 0)]) | (orphaned & set(free)))
        if wanted:
            await self._take(wanted)
        elif len(held) > target:
            await self._release(sorted(held)[target:])

    async def _take(self, shards: list[int]) -> None:
        start = time.monotonic()
        taken = await self.store.leases.take(self.member_id, shards, self.ttl_s)
        if self.stopping:   # leave() releases them with the rest
            return
        valid_until = start + self.ttl_s - self.margin_s
        for shard, epoch in taken.items():
            self.held[shard] = Lease(epoch, valid_until)
            self.owners[shard] = ShardOwner(self.member_id, epoch, self.address, True)
        if taken:
            self.takeovers += len(taken)
            log.info("took over shards %s", ", ".join(f"{shard}@{epoch}" for shard, epoch in taken.items()))

    async def _release(self, shards: list[int]) -> None:
        """Hand shards back for a newer member: stop serving them first, then expire their leases now."""
        for shard in shards:
            self.held.pop(shard, None)
        await self.store.leases.release(self.member_id, shards)
        log.info("released shards %s to rebalance", shards)

    async def bump(self, shard: int, epoch: int) -> None:
        """Move our own lease of `shard` to a new epoch: every write still carrying `epoch` now applies nothing
        (used to fence out a transaction whose member fell silent). Actors under `epoch` retire and reload."""
        new_epoch = await self.store.leases.bump(self.member_id, shard, epoch)
        lease = self.held.get(shard)
        if new_epoch is None:
            self.lost(shard, epoch)
            raise RuntimeError(f"lease of shard {shard} at epoch {epoch} is no longer ours")
        if lease is not None and lease.epoch == epoch:
            self.held[shard] = Lease(new_epoch, lease.valid_until)

    def stop_serving(self) -> list[int]:
        """The first step of a graceful stop: from now on this member serves no shard (its actors decide nothing
        new and answer NotOwner, so forwarding members send their requests on to the next owner) and takes none.
        Writes already sent still land: the leases keep their epochs until `leave`."""
        if not self.stopping:
            self.stopping = True
            self.handed_over, self.held = sorted(self.held), {}
        return self.handed_over

    async def leave(self) -> None:
        """On a graceful stop: release every lease at once so the others need not wait for them to expire (they
        take them over on their next pass: a lease left is orphaned at once)."""
        shards = self.stop_serving()
        await self.store.leases.leave(self.member_id)
        log.info("left the cluster, released shards %s", shards)
