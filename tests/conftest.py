"""Test session plumbing: one throwaway PostgreSQL for the session, a fresh database per test.

Set COORDINATOR_TEST_DATABASE_URL to use an existing server instead (its user must be allowed to CREATE
DATABASE). As root, the embedded cluster runs as an unprivileged OS user (PostgreSQL refuses root).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlparse, urlunparse

import pytest

from coordinator.config import Config
from tests.support import throwaway_postgres

# Each session migrates its own template, so that sessions sharing one existing server (and a template left by
# a session that was killed) never meet.
TEMPLATE = "coordinator_template_" + uuid.uuid4().hex[:8]


def _psql(admin_dsn: str, sql: str) -> None:
    subprocess.run(["psql", admin_dsn, "-v", "ON_ERROR_STOP=1", "-qAtc", sql], check=True, capture_output=True)


def _with_db(dsn: str, db: str) -> str:
    p = urlparse(dsn)
    return urlunparse(p._replace(path="/" + db))


@pytest.fixture(scope="session")
def pg_admin_dsn():
    external = os.environ.get("COORDINATOR_TEST_DATABASE_URL")
    if external:
        admin = _template(external)
        try:
            yield admin
        finally:
            _psql(admin, f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        return
    with throwaway_postgres() as dsn:
        yield _template(dsn)


def _template(dsn: str) -> str:
    """The cluster's admin DSN, after creating the migrated template database each test's database copies."""
    admin = _with_db(dsn, "postgres")
    # A migrated template makes each test's fresh database a cheap file copy.
    _psql(admin, f"CREATE DATABASE {TEMPLATE}")
    import asyncio

    import asyncpg

    from storage.postgres import migrate

    async def run_migrations() -> None:
        con = await asyncpg.connect(_with_db(dsn, TEMPLATE))
        try:
            await migrate(con)
        finally:
            await con.close()

    asyncio.run(run_migrations())
    return admin


@contextmanager
def fresh_database(pg_admin_dsn: str, prefix: str = "t_") -> Iterator[str]:
    """The URL of a new database cloned from the migrated template, dropped afterwards."""
    name = prefix + uuid.uuid4().hex[:16]
    _psql(pg_admin_dsn, f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    try:
        yield _with_db(pg_admin_dsn, name)
    finally:
        _psql(pg_admin_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def database_url(pg_admin_dsn):
    with fresh_database(pg_admin_dsn) as url:
        yield url


@pytest.fixture
def config(database_url, tmp_path) -> Config:
    # COORDINATOR_TEST_REBASE_APPENDS=1: every table the tests create has rebasing on (`serve --rebase-appends`),
    # so that a suite written for the spec's 409s (tests/test_iceberg_pyiceberg.py) runs unchanged against it too.
    return Config(database_url=database_url, data_dir=tmp_path, port=0, warehouse=str(tmp_path / "warehouse"),
                  actor_idle_s=30, shutdown_grace_s=0.5,
                  rebase_appends=os.environ.get("COORDINATOR_TEST_REBASE_APPENDS") == "1")


@pytest.fixture
def service(config):
    """The whole service over real HTTP on loopback, in a background thread. Yields its base URL."""
    from api.server import EmbeddedService
    with EmbeddedService(config) as base_url:
        yield base_url
