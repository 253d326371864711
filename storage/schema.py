"""The database schema: versioned migrations (storage/migrations/*.sql), applied once each at startup."""

from __future__ import annotations

import logging
from importlib import resources

import asyncpg

from .paths import location_key

log = logging.getLogger(__name__)


async def key_locations(con: asyncpg.Connection) -> None:
    """Rows without a location key (from before migration 007) get one, spelled by `location_key`. A location it
    cannot read is left unkeyed, and said so: such a row guards no place against overlap."""
    rows = await con.fetch("SELECT table_id, location FROM tables WHERE location IS NOT NULL AND location_key IS NULL")
    keyed = []
    for r in rows:
        try:
            keyed.append((r["table_id"], location_key(r["location"])))
        except ValueError as exc:
            log.warning("table %s: location %r has no key (%s)", r["table_id"], r["location"], exc)
    if keyed:
        log.info("keying the locations of %d tables", len(keyed))
        await con.executemany("UPDATE tables SET location_key = $2 WHERE table_id = $1", keyed)


async def migrate(con: asyncpg.Connection) -> None:
    """Apply versioned migrations in order, once each; safe when several processes start at once."""
    async with con.transaction():
        await con.execute("SELECT pg_advisory_xact_lock(7263541)")
        await con.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version int PRIMARY KEY,"
                          " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        done = {r["version"] for r in await con.fetch("SELECT version FROM schema_migrations")}
        files = sorted(f for f in resources.files("storage.migrations").iterdir() if f.name.endswith(".sql"))
        for f in files:
            version = int(f.name.split("_", 1)[0])
            if version in done:
                continue
            log.info("applying migration %s", f.name)
            await con.execute(f.read_text())
            await con.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, f.name)
