"""COORDINATOR_TEST_DATABASE_URL runs the database tests against an existing server: here, a second pytest run
pointed at a server of its own that holds nothing of ours, where the run must create, use and drop its template."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import _with_db
from tests.support import throwaway_postgres

ROOT = Path(__file__).resolve().parent.parent


def _databases(admin_dsn: str) -> set[str]:
    out = subprocess.run(["psql", admin_dsn, "-qAtc", "SELECT datname FROM pg_database"],
                         check=True, capture_output=True, text=True).stdout
    return set(out.split())


def test_the_suite_runs_against_an_existing_server():
    with throwaway_postgres() as dsn:
        _run_against(_with_db(dsn, "postgres"))


def _run_against(existing: str) -> None:
    before = _databases(existing)
    env = dict(os.environ, COORDINATOR_TEST_DATABASE_URL=existing)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_iceberg_views.py", "-k", "create or list"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "error" not in run.stdout.splitlines()[-1], run.stdout[-1000:]
    # What the run made (its template and each test's database) is gone again.
    assert _databases(existing) == before
