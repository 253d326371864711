"""Cluster membership: each member's row in PostgreSQL (its internal-channel address and a heartbeat).

The heartbeat is renewed together with the member's leases (leases.py), with the same time-to-live, so a member
counts as live exactly as long as its leases would; only the database's clock (`now()`) is compared.
"""

from __future__ import annotations

import os
import socket
from uuid import UUID

import asyncpg


async def heartbeat(con: asyncpg.Connection, member_id: UUID, address: str) -> None:
    await con.execute(
        "INSERT INTO cluster_members (member_id, address, pid, hostname) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (member_id) DO UPDATE SET heartbeat_at = now(), address = EXCLUDED.address",
        member_id, address, os.getpid(), socket.gethostname())


async def count_live(con: asyncpg.Connection, ttl_s: float) -> int:
    """How many members share the shards (each member's fair share is SHARDS / this)."""
    return await con.fetchval("SELECT count(*) FROM cluster_members"
                              " WHERE heartbeat_at > now() - make_interval(secs => $1)", ttl_s)


async def leave(con: asyncpg.Connection, member_id: UUID) -> None:
    await con.execute("DELETE FROM cluster_members WHERE member_id = $1", member_id)
