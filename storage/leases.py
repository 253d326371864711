"""The cluster's tables: shard leases (who owns which shard, under which epoch: the fencing token the writer
checks, see storage/writer.py) and member rows (each member's internal-channel address and heartbeat).

Only SQL and its contract live here; when to renew, take over or release is the coordinator's
(coordinator/cluster/leases.py). Every time compared is the DATABASE's (`now()`), so no two hosts' clocks are
ever compared. A member's heartbeat is renewed together with its leases, with the same time-to-live, so a
member counts as live exactly as long as its leases would. Statements that lock several lease rows lock them in
shard order, so they cannot deadlock each other or the writer's FOR SHARE checks.
"""

from __future__ import annotations

import os
import socket
from typing import Awaitable, Callable, TypeVar
from uuid import UUID

import asyncpg

from .records import LeaseRound, ShardLeaseRow

T = TypeVar("T")
Run = Callable[[Callable[[asyncpg.Connection], Awaitable[T]]], Awaitable[T]]


class LeaseStore:
    """The lease and member rows, reached through the store's connection runner (`PostgresStore._call`): raises
    StoreUnavailable when the database cannot be reached."""

    def __init__(self, run: Run):
        self._run = run

    async def renew(self, member_id: UUID, address: str, ttl_s: float) -> LeaseRound:
        """One round's reads and renewals: heartbeat the member (its row made if missing), extend every lease it
        holds to now() + ttl, and read how many members are live and who owns every shard."""
        async def pass_(con: asyncpg.Connection) -> LeaseRound:
            await _heartbeat(con, member_id, address)
            renewed = await con.fetch(
                "UPDATE shard_leases l SET expires_at = now() + make_interval(secs => $2)"
                " FROM (SELECT shard FROM shard_leases WHERE owner = $1 ORDER BY shard FOR UPDATE) s"
                " WHERE l.shard = s.shard AND l.owner = $1 RETURNING l.shard, l.epoch", member_id, ttl_s)
            live = await _count_live(con, ttl_s)
            rows = await con.fetch(
                "SELECT l.shard, l.owner, l.epoch, l.expires_at > now() AS live,"
                " l.expires_at < now() - make_interval(secs => $1) AS orphaned, m.address"
                " FROM shard_leases l LEFT JOIN cluster_members m ON m.member_id = l.owner ORDER BY l.shard", ttl_s)
            return LeaseRound({r["shard"]: r["epoch"] for r in renewed}, live,
                              [ShardLeaseRow(r["shard"], r["owner"], r["epoch"], r["address"], r["live"],
                                             r["orphaned"]) for r in rows])
        return await self._run(pass_)

    async def take(self, member_id: UUID, shards: list[int], ttl_s: float) -> dict[int, int]:
        """Take over those of `shards` whose lease has expired, each under a new epoch (one statement conditioned
        on `expires_at < now()`: of members racing for a shard, one wins). Returns shard -> new epoch of those
        taken; a lease row locked by another member's statement is skipped, not waited for."""
        rows = await self._run(lambda con: con.fetch(
            "UPDATE shard_leases l SET owner = $1, epoch = l.epoch + 1, expires_at = now() + make_interval(secs => $3)"
            " FROM (SELECT shard FROM shard_leases WHERE shard = ANY($2::int[]) AND expires_at < now()"
            "       ORDER BY shard FOR UPDATE SKIP LOCKED) c"
            " WHERE l.shard = c.shard AND l.expires_at < now() RETURNING l.shard, l.epoch",
            member_id, shards, ttl_s))
        return {r["shard"]: r["epoch"] for r in rows}

    async def release(self, member_id: UUID, shards: list[int]) -> None:
        """Expire now those of `shards` that `member_id` holds (ownerless), for another member to take."""
        await self._run(lambda con: con.execute(
            "UPDATE shard_leases l SET owner = NULL, expires_at = now()"
            " FROM (SELECT shard FROM shard_leases WHERE shard = ANY($2::int[]) AND owner = $1"
            "       ORDER BY shard FOR UPDATE) c WHERE l.shard = c.shard", member_id, shards))

    async def bump(self, member_id: UUID, shard: int, epoch: int) -> int | None:
        """Move `member_id`'s lease of `shard` from `epoch` to the next: every write still carrying `epoch` then
        applies nothing. The new epoch, or None if the lease is not (or no longer) that member's at `epoch`."""
        return await self._run(lambda con: con.fetchval(
            "UPDATE shard_leases SET epoch = epoch + 1 WHERE shard = $1 AND owner = $2 AND epoch = $3"
            " RETURNING epoch", shard, member_id, epoch))

    async def leave(self, member_id: UUID) -> None:
        """Release every lease of `member_id` at once (expired since forever) and remove its member row."""
        async def q(con: asyncpg.Connection) -> None:
            await con.execute(
                "UPDATE shard_leases l SET owner = NULL, expires_at = '-infinity'"
                " FROM (SELECT shard FROM shard_leases WHERE owner = $1 ORDER BY shard FOR UPDATE) c"
                " WHERE l.shard = c.shard", member_id)
            await con.execute("DELETE FROM cluster_members WHERE member_id = $1", member_id)
        await self._run(q)


async def _heartbeat(con: asyncpg.Connection, member_id: UUID, address: str) -> None:
    await con.execute(
        "INSERT INTO cluster_members (member_id, address, pid, hostname) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (member_id) DO UPDATE SET heartbeat_at = now(), address = EXCLUDED.address",
        member_id, address, os.getpid(), socket.gethostname())


async def _count_live(con: asyncpg.Connection, ttl_s: float) -> int:
    """How many members share the shards (each member's fair share is SHARDS / this)."""
    return await con.fetchval("SELECT count(*) FROM cluster_members"
                              " WHERE heartbeat_at > now() - make_interval(secs => $1)", ttl_s)
