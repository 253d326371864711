"""Claims on files of live tables that only expired snapshots referenced (`records.FileDeletion`; the service's
snapshot expiry, coordinator/maintenance), recorded before the expiry commit and held until the files are deleted,
reached through the store's connection runner (`PostgresStore._call`). Only a claim's owner renews or ends it; a
claim nobody renewed is taken over by exactly one member."""

from __future__ import annotations

from typing import Awaitable, Callable, TypeVar
from uuid import UUID, uuid4

import asyncpg

from .records import FileDeletion

T = TypeVar("T")
Run = Callable[[Callable[[asyncpg.Connection], Awaitable[T]]], Awaitable[T]]


class DeletionClaims:
    def __init__(self, run: Run):
        self._run = run

    async def record(self, claim: FileDeletion) -> None:
        await self._run(lambda con: con.execute(
            "INSERT INTO file_deletions (claim_id, table_id, location, manifest_lists, owner) "
            "VALUES ($1, $2, $3, $4, $5)", claim.claim_id, claim.table_id, claim.location,
            list(claim.manifest_lists), claim.owner))

    async def pending(self, older_than_s: float = 0) -> list[FileDeletion]:
        rows = await self._run(lambda con: con.fetch(
            "SELECT claim_id, table_id, location, manifest_lists AS lists, owner FROM file_deletions"
            " WHERE renewed_at <= now() - make_interval(secs => $1) ORDER BY renewed_at", float(older_than_s)))
        return [FileDeletion(r["claim_id"], r["table_id"], r["location"], list(r["lists"]), r["owner"])
                for r in rows]

    async def take_over(self, claim_id: UUID, older_than_s: float) -> UUID | None:
        return await self._run(lambda con: con.fetchval(
            "UPDATE file_deletions SET renewed_at = now(), owner = $3 WHERE claim_id = $1"
            " AND renewed_at <= now() - make_interval(secs => $2) RETURNING owner",
            claim_id, float(older_than_s), uuid4()))

    async def renew(self, claim_id: UUID, owner: UUID) -> bool:
        return await self._run(lambda con: con.fetchval(
            "UPDATE file_deletions SET renewed_at = now() WHERE claim_id = $1 AND owner = $2 RETURNING true",
            claim_id, owner)) is True

    async def end(self, claim_id: UUID, owner: UUID) -> None:
        await self._run(lambda con: con.execute(
            "DELETE FROM file_deletions WHERE claim_id = $1 AND owner = $2", claim_id, owner))
