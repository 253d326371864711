"""A PostgreSQL failover under commit load from all three protocols: a primary with a synchronous standby
(streaming replication), the service given both in libpq's multi-host form with target_session_attrs=read-write.
The primary is SIGKILLed (the postmaster and every server process, as when its machine dies) and the standby
promoted: the service finds the new primary by itself; meanwhile commits are answered 503 + Retry-After (nothing
applied) and never 500 where the outcome can be read back; no acknowledged commit is lost."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from storage.embedded import SUPERUSER, EmbeddedPostgres, free_port
from storage.owner import OWNER_LOCK
from tests.db_outage import run_under_load, writer_events
from tests.support import ServerProcess, sql

pytestmark = pytest.mark.crash

OWNERS_SQL = ("SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
              " WHERE l.locktype = 'advisory' AND l.granted AND l.objid = $1")
PROMOTE_AFTER_S = 2.0   # how long no server is writable: the primary is dead and the standby not yet promoted


class ReplicatedPostgres:
    """A primary and one synchronous standby on loopback, run from the server's own tools (initdb, pg_ctl,
    pg_basebackup) as the embedded database is."""

    def __init__(self, root: Path):
        self.primary = EmbeddedPostgres(root / "primary")
        self.standby = EmbeddedPostgres(root / "standby", port=free_port())

    @property
    def dsn(self) -> str:
        hosts = ",".join(pg.dsn.split("@", 1)[1].split("/", 1)[0] for pg in (self.primary, self.standby))
        return f"postgresql://{SUPERUSER}@{hosts}/coordinator?target_session_attrs=read-write"

    def start(self) -> None:
        p = self.primary
        p.start()
        p.stop()
        with open(p.pgdata / "postgresql.conf", "a") as conf:   # later settings win over the embedded defaults
            conf.write("\n# a primary with a synchronous standby\nwal_level = replica\nmax_wal_senders = 4\n"
                       "synchronous_standby_names = '*'\nsynchronous_commit = on\n")
        p.start()
        s = self.standby
        s.root.mkdir(parents=True, exist_ok=True)
        if s.user:
            shutil.chown(s.root, s.user)
        s._run(str(s.bin / "pg_basebackup"), "-h", str(p.root), "-p", str(p.port), "-U", SUPERUSER,
               "-D", str(s.pgdata), "-R", "-X", "stream", "-c", "fast")
        with open(s.pgdata / "postgresql.auto.conf", "a") as conf:
            # Promoted, it has no standby of its own to wait for: a commit would wait forever.
            conf.write("synchronous_standby_names = ''\n")
        s.start()
        deadline = time.monotonic() + 60
        while not sql(p.dsn, "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'"):
            assert time.monotonic() < deadline, "the standby did not become synchronous"
            time.sleep(0.2)

    def kill_primary(self) -> None:
        """SIGKILL the primary's postmaster and every process it started: nothing of it runs on."""
        pid = int((self.primary.pgdata / "postmaster.pid").read_text().split()[0])
        victims = [pid] + [int(d) for d in os.listdir("/proc") if d.isdigit() and _parent(int(d)) == pid]
        for v in victims:
            try:
                os.kill(v, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def promote_standby(self) -> None:
        s = self.standby
        s._run(str(s.bin / "pg_ctl"), "promote", "-w", "-D", str(s.pgdata))

    def destroy(self) -> None:
        self.standby.destroy()
        self.primary.destroy()


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@contextmanager
def replicated_postgres() -> Iterator[ReplicatedPostgres]:
    root = Path(tempfile.mkdtemp(prefix="coordinator-failover-"))
    root.chmod(0o755)
    pair = ReplicatedPostgres(root)
    try:
        pair.start()
        yield pair
    finally:
        pair.destroy()
        shutil.rmtree(root, ignore_errors=True)


def fail_over(pair: ReplicatedPostgres) -> None:
    pair.kill_primary()
    time.sleep(PROMOTE_AFTER_S)
    pair.promote_standby()


def failover_run(workdir: Path):
    with replicated_postgres() as pair:
        server = ServerProcess(pair.dsn, workdir / "srv")
        base = server.start()
        run = None
        try:
            run = run_under_load(base, lambda: pair.dsn, lambda: fail_over(pair))
            # The service claims the new primary as its own again (one owner per database, storage/owner.py).
            run.owners = [r["application_name"] for r in sql(pair.dsn, OWNERS_SQL, OWNER_LOCK)]
            run.owner_pid = server.proc.pid
            return run
        finally:
            server.stop()
            if run is not None:
                run.events = writer_events(server.log_path)


def test_failover_to_a_synchronous_standby_under_load(tmp_path):
    started = time.monotonic()
    run = failover_run(tmp_path)
    print(f"primary SIGKILLed, standby promoted {PROMOTE_AFTER_S:.0f} s later, under 4 writers per format "
          f"({time.monotonic() - started:.0f} s in all):\n{run.table()}\n{run.events}")
    assert run.figures.clean, run.figures.problems()   # nothing acknowledged lost, nothing duplicated
    assert not run.problems(), run.problems()[:10]      # no 500; every 503'd commit absent
    assert all(s is not None for s in run.outage_s.values()), f"a format found no new primary: {run.outage_s}"
    assert [o.split("@")[0] for o in run.owners] == [f"coordinator-{run.owner_pid}"], run.owners


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        result = failover_run(Path(d))
    print(f"primary SIGKILLed, standby promoted {PROMOTE_AFTER_S:.0f} s later:\n{result.table()}\n{result.events}")
    problems = result.problems() + ([result.figures.problems()] if not result.figures.clean else [])
    print("\n".join(problems[:10]) or "no 500, every 503'd commit absent, every 2xx present")
    sys.exit(1 if problems else 0)
