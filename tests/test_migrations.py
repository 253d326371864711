"""Migrations bring a database from any earlier state to the current schema, and applying them twice is harmless.
Case in point: 008 (purge claims) was briefly edited after it had been applied (`created_at` -> `renewed_at`);
009 renames the column where needed, so databases that applied either text, and fresh ones, end up alike; 010
and 011 then add the claim's owner and what it deletes."""

from __future__ import annotations

import asyncio
import uuid
from importlib import resources

import asyncpg
import pytest

from storage.postgres import migrate
from tests.conftest import _psql, _with_db

FIRST_008 = resources.files("storage.migrations").joinpath("008_purges.sql").read_text()
EDITED_008 = FIRST_008.replace("created_at", "renewed_at")


@pytest.mark.parametrize("applied_008", [None, FIRST_008, EDITED_008], ids=["fresh", "first-008", "edited-008"])
def test_every_earlier_database_migrates_to_the_same_purges_table(pg_admin_dsn, applied_008):
    async def run(dsn: str) -> list[str]:
        con = await asyncpg.connect(dsn)
        try:
            if applied_008 is not None:
                await con.execute("CREATE TABLE schema_migrations (version int PRIMARY KEY, name text NOT NULL,"
                                  " applied_at timestamptz NOT NULL DEFAULT now())")
                for f in sorted(f for f in resources.files("storage.migrations").iterdir() if f.name.endswith(".sql")):
                    version = int(f.name.split("_")[0])
                    if version < 8:
                        await con.execute(f.read_text())
                        await con.execute("INSERT INTO schema_migrations VALUES ($1, $2)", version, f.name)
                await con.execute(applied_008)
                await con.execute("INSERT INTO schema_migrations VALUES (8, '008_purges.sql')")
                await con.execute("INSERT INTO purges (location_key, location) VALUES ('file:/x', 'file:///x')")
            await migrate(con)
            await migrate(con)
            return [r[0] for r in await con.fetch("SELECT column_name FROM information_schema.columns"
                                                  " WHERE table_name = 'purges' ORDER BY ordinal_position")]
        finally:
            await con.close()

    name = "m_" + uuid.uuid4().hex[:12]
    _psql(pg_admin_dsn, f"CREATE DATABASE {name}")
    try:
        assert asyncio.run(run(_with_db(pg_admin_dsn, name))) == ["location_key", "location", "renewed_at", "owner", "metadata_location"]
    finally:
        _psql(pg_admin_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
