"""Migrations bring a database from any earlier state to the current schema, and applying them twice is harmless.
Case in point: 008 (purge claims) was briefly edited after it had been applied (`created_at` -> `renewed_at`);
009 renames the column where needed, so databases that applied either text, and fresh ones, end up alike; 010
and 011 then add the claim's owner and what it deletes."""

from __future__ import annotations

import asyncio
import re
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


# -- rolling upgrades: a migration the previous release can run beside (docs/cluster.md) --------------------------

# What the previous release may be reading or writing: removing, renaming or retyping it, or requiring a value it
# does not send, breaks it while a cluster rolls.
NOT_BESIDE = [
    # (an index too: the previous release's ON CONFLICT may need it)
    (re.compile(r"\bDROP\s+(TABLE|COLUMN|VIEW|TYPE|FUNCTION|SCHEMA|INDEX|CONSTRAINT)\b", re.I), "drops"),
    (re.compile(r"\bRENAME\b", re.I), "renames"),
    # (COLUMN is optional in ALTER TABLE ... ALTER [COLUMN] c)
    (re.compile(r"\bALTER\s+(COLUMN\s+)?\w+\s+(SET\s+DATA\s+)?TYPE\b", re.I), "retypes a column"),
    (re.compile(r"\bALTER\s+(COLUMN\s+)?\w+\s+SET\s+NOT\s+NULL\b", re.I), "makes a column NOT NULL"),
    # (what the previous release writes may not meet it)
    (re.compile(r"\bADD\s+(CONSTRAINT|CHECK|UNIQUE|FOREIGN|EXCLUDE|PRIMARY)\b", re.I), "adds a constraint"),
]
# An added column (COLUMN is optional too), up to the next comma or the statement's end.
ADD_COLUMN = re.compile(r"\bADD\s+(?!CONSTRAINT|CHECK|UNIQUE|FOREIGN|EXCLUDE|PRIMARY)[^,;]*", re.I)
# Written before this rule, each with why the previous release could run beside it or why its upgrade stops anyway.
BEFORE_THE_RULE = {
    9: "renames purges.created_at, only where an early text of 008 was applied",
    15: "makes events.securable NOT NULL; it came with channel version 4, whose upgrade stops every member anyway "
        "(the channel's key changed)",
}


def not_beside_the_previous_release(sql: str) -> list[str]:
    """What in a migration the previous release cannot run beside, unless its first line is `-- contract: ...`
    (naming the earlier release that stopped using what it removes)."""
    if sql.lstrip().lower().startswith("-- contract:"):
        return []
    code = "\n".join(line.split("--", 1)[0] for line in sql.splitlines())
    found = [what for pattern, what in NOT_BESIDE if pattern.search(code)]
    for added in ADD_COLUMN.findall(code):
        if re.search(r"\bNOT\s+NULL\b", added, re.I) and not re.search(r"\b(DEFAULT|GENERATED)\b", added, re.I):
            found.append("adds a NOT NULL column without a default")
    return found


def test_every_migration_can_run_beside_the_previous_release():
    files = sorted(f for f in resources.files("storage.migrations").iterdir() if f.name.endswith(".sql"))
    refused = {f.name: found for f in files if (found := not_beside_the_previous_release(f.read_text()))
               and int(f.name.split("_", 1)[0]) not in BEFORE_THE_RULE}
    assert not refused, (f"{refused}: the previous release cannot run beside these migrations during a rolling "
                         f"upgrade; split the change across two releases (docs/cluster.md) and start the one that "
                         f"removes with '-- contract: <the release that stopped using it>'")


@pytest.mark.parametrize("sql, found", [
    ("CREATE TABLE x (a int NOT NULL);", []),
    ("ALTER TABLE t ADD COLUMN IF NOT EXISTS c text;", []),
    ("ALTER TABLE t ADD COLUMN c int NOT NULL DEFAULT 0;", []),
    ("ALTER TABLE t ADD COLUMN s bigint GENERATED ALWAYS AS IDENTITY;", []),
    ("ALTER TABLE t ADD COLUMN c int NOT NULL;", ["adds a NOT NULL column without a default"]),
    ("ALTER TABLE t DROP COLUMN c;", ["drops"]),
    ("DROP TABLE old;", ["drops"]),
    ("ALTER TABLE t RENAME COLUMN a TO b;", ["renames"]),
    ("ALTER TABLE t ALTER COLUMN a TYPE bigint;", ["retypes a column"]),
    ("ALTER TABLE t ALTER COLUMN a SET NOT NULL;", ["makes a column NOT NULL"]),
    ("ALTER TABLE t ALTER a TYPE bigint;", ["retypes a column"]),
    ("ALTER TABLE t ALTER a SET NOT NULL;", ["makes a column NOT NULL"]),
    ("ALTER TABLE t ADD c int NOT NULL;", ["adds a NOT NULL column without a default"]),
    ("ALTER TABLE t ADD CONSTRAINT positive CHECK (a > 0);", ["adds a constraint"]),
    ("CREATE INDEX IF NOT EXISTS i ON t (a);", []),
    ("DROP INDEX IF EXISTS i;", ["drops"]),
    ("-- a comment that says DROP TABLE\nCREATE INDEX i ON t (a);", []),
    ("-- contract: release N stopped reading c\nALTER TABLE t DROP COLUMN c;", []),
])
def test_what_the_previous_release_cannot_run_beside_is_found(sql, found):
    assert not_beside_the_previous_release(sql) == found
