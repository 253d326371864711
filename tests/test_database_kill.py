"""PostgreSQL's postmaster SIGKILLed under commit load from all three protocols, then started again: while it is
down every commit is answered 503 + Retry-After (nothing applied) or, once its outcome is read back, 2xx (applied);
never a 500 when the outcome can be known, and the answers match what the tables hold afterwards."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from storage.embedded import EmbeddedPostgres, EmbeddedPostgresError
from tests.db_outage import run_under_load, writer_events
from tests.support import ServerProcess, throwaway_cluster

pytestmark = pytest.mark.crash

DOWN_S = 3.0   # how long the database stays down before it is started again


@pytest.fixture
def own_postgres():
    with throwaway_cluster() as pg:
        yield pg


def kill_postmaster(pg: EmbeddedPostgres) -> None:
    """SIGKILL the postmaster alone, as the OOM killer does: its server processes notice and exit by themselves."""
    pid = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
    os.kill(pid, signal.SIGKILL)


def start_again(pg: EmbeddedPostgres, timeout_s: float = 60) -> None:
    """Start once the killed server's processes are gone (until then PostgreSQL refuses: its shared memory is in
    use)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pg.start()
            return
        except EmbeddedPostgresError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def kill_and_restart(pg: EmbeddedPostgres, down_s: float = DOWN_S) -> None:
    kill_postmaster(pg)
    time.sleep(down_s)
    start_again(pg)


def test_postmaster_killed_under_load_answers_match_the_tables(own_postgres, tmp_path):
    server = ServerProcess(own_postgres.dsn, tmp_path / "srv")
    base = server.start()
    try:
        run = run_under_load(base, lambda: own_postgres.dsn, lambda: kill_and_restart(own_postgres))
    finally:
        server.stop()
    print(f"postmaster SIGKILLed, down {DOWN_S:.0f} s, under 4 writers per format:\n{run.table()}\n"
          f"{writer_events(server.log_path)}")
    assert run.figures.clean, run.figures.problems()
    assert not run.problems(), run.problems()[:10]
    assert all(s is not None for s in run.outage_s.values()), f"a format did not recover: {run.outage_s}"
    # the kill bit: no commit sent after it was acknowledged before the database was back
    assert max(run.outage_s.values()) >= DOWN_S, run.outage_s


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.test_database_kill [--cycles N]`: N postmaster kills, each on a fresh database under fresh
    load; prints each cycle's answers by status and exits 1 if any answer contradicts the tables."""
    import argparse
    from collections import Counter
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args(argv)
    failed, totals = False, Counter()
    for cycle in range(1, args.cycles + 1):
        with throwaway_cluster() as pg, tempfile.TemporaryDirectory(prefix="coordinator-kill-") as work:
            server = ServerProcess(pg.dsn, Path(work) / "srv")
            base = server.start()
            try:
                run = run_under_load(base, lambda: pg.dsn, lambda: kill_and_restart(pg))
            finally:
                server.stop()
            events = writer_events(server.log_path)
        problems = run.problems() + ([run.figures.problems()] if not run.figures.clean else [])
        totals.update(a.code for a in run.answers)
        print(f"cycle {cycle}/{args.cycles}: postmaster SIGKILLed, down {DOWN_S:.0f} s\n{run.table()}\n{events}\n"
              + "\n".join(problems[:10]), flush=True)
        failed |= bool(problems)
    print(f"answers by status over {args.cycles} kills: {dict(totals)}; "
          + ("FAILED" if failed else "no 500, every 503'd commit absent, every 2xx present"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
