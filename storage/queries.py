"""SQL that both the store (storage/postgres.py) and the group-commit writer (storage/writer.py) run."""

from __future__ import annotations

from uuid import UUID

import asyncpg

from .records import IdempotencyRecord

LOCATIONS_LOCK = 7263542  # pg_advisory_xact_lock key serializing creations of located tables (7263541: migrations)
# Equal to the key or one of its ancestors, or below it: byte order puts exactly key/... in [key/, key0).
_LOCATION_TAKEN_SQL = """SELECT EXISTS (SELECT 1 FROM tables WHERE (location_key COLLATE "C" = ANY($1::text[])
    OR (location_key COLLATE "C" >= $2 AND location_key COLLATE "C" < $3)) AND table_id IS DISTINCT FROM $4)
    OR ($5 AND EXISTS (SELECT 1 FROM purges WHERE location_key COLLATE "C" = ANY($1::text[])
    OR (location_key COLLATE "C" >= $2 AND location_key COLLATE "C" < $3)))"""


async def put_idempotency(con: asyncpg.Connection, record: IdempotencyRecord | None) -> None:
    if record is not None:
        await con.execute("INSERT INTO idempotency_keys (key, route, status, body, body_ref) VALUES ($1,$2,$3,$4,$5)"
                          " ON CONFLICT (key) DO NOTHING", record.key, record.route, record.status, record.body,
                          record.body_ref)


async def location_in_use(con: asyncpg.Connection, key: str, exclude: UUID | None, purges: bool = True,
                           below: bool = True) -> bool:
    """Whether a table or view (other than `exclude`) lives at, above or (`below`) below the location `key`
    (files.location_key), or (`purges`) a dropped one whose files there are still being deleted."""
    ancestors = [key]
    while "/" in ancestors[-1].split(":", 1)[1].strip("/"):
        ancestors.append(ancestors[-1].rsplit("/", 1)[0])
    lo, hi = (key + "/", key + "0") if below else ("", "")   # "" to "": an empty range
    return await con.fetchval(_LOCATION_TAKEN_SQL, ancestors, lo, hi, exclude, purges)
