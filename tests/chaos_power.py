"""Power loss for the chaos test: PostgreSQL's data directory and the warehouse live on LazyFS, a FUSE file
system that keeps every write in its own cache until it is fsynced and drops all of that on `clear-cache`. A
cut SIGKILLs the service (the caller's part), the postmaster and all its children, drops both caches and
starts PostgreSQL again: whatever the service or PostgreSQL did not fsync is gone, as after a power loss.

Two mounts: PostgreSQL's daemon runs as its own OS user (it refuses root), and files on a LazyFS mount belong to
the daemon's user; the warehouse's daemon runs as this process's user, so that the service may adopt a Lance
writer's staged manifest (it adopts only files of its own user). LazyFS caches only file data: creates, renames
and unlinks are durable at once, so a missing directory fsync is not caught here.

Needs root (or FUSE with `user_allow_other`), apt for LazyFS's build dependencies on a fresh machine, and the
`postgres` OS user; `skip_reason()` says what is missing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from storage.embedded import EmbeddedPostgres

# LazyFS's source and scripts, kept here so that a fresh machine needs only apt (tests/lazyfs/README.md)
LAZYFS = Path(os.environ.get("COORDINATOR_LAZYFS_KIT", Path(__file__).resolve().parent / "lazyfs"))
CACHE_SIZE = os.environ.get("LAZYFS_CACHE_SIZE", "512mb")   # above what a run writes: a full cache writes through
PG_USER = "postgres"


def skip_reason() -> str | None:
    """Why the power-loss mode cannot run here, or None."""
    if not (LAZYFS / "lazyfs.sh").exists():
        return f"no LazyFS kit at {LAZYFS} (set COORDINATOR_LAZYFS_KIT)"
    if os.geteuid() != 0:
        return "power loss needs root (FUSE mounts for the postgres OS user)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse: FUSE is unavailable here"
    try:
        import pwd
        pwd.getpwnam(PG_USER)
    except KeyError:
        return f"no {PG_USER} OS user to run PostgreSQL on LazyFS"
    if shutil.which("apt-get") is None and not (Path.home() / ".cache" / "lazyfs").exists():
        return "LazyFS is not built and apt-get is unavailable for its build dependencies"
    build = subprocess.run([str(LAZYFS / "build.sh")], capture_output=True, text=True)
    if build.returncode != 0:
        return f"LazyFS did not build: {build.stderr.strip()[-500:]}"
    return None


class PowerLoss:
    """PostgreSQL (data dir on LazyFS) and a warehouse on LazyFS, in `root`; `cut()` is one power loss."""

    def __init__(self, *, durable_commits: bool = True):
        # In the system's temp dir, not the caller's: the postgres OS user must reach it (pytest's is 0700).
        self.root = Path(tempfile.mkdtemp(prefix="coordinator-power-"))
        self.root.chmod(0o755)
        self.pg_mount, self.wh_mount = self.root / "pg-mnt", self.root / "wh-mnt"
        self.durable_commits = durable_commits
        self._mount(self.pg_mount, self.root / "pg-backing", PG_USER)
        self._mount(self.wh_mount, self.root / "wh-backing", None)
        # The cluster's own directory (port file, Unix socket: LazyFS has no mknod) stays on the plain disk; only
        # the data directory is on the mount.
        self.pg = EmbeddedPostgres(self.root / "pg")
        self.pg.root.mkdir(parents=True, exist_ok=True)
        (self.pg_mount / "pgdata").mkdir(mode=0o700)
        shutil.chown(self.pg_mount / "pgdata", PG_USER, PG_USER)
        self.pg.pgdata.symlink_to(self.pg_mount / "pgdata")
        self.dsn = self.pg.start()
        if not durable_commits:   # the negative control: commits answered before their WAL is on disk
            self.pg._psql("-c", "ALTER SYSTEM SET synchronous_commit = off")
            self.pg._psql("-c", "SELECT pg_reload_conf()")
        self.warehouse = str(self.wh_mount / "warehouse")
        self.cuts = 0

    def _mount(self, mount: Path, backing: Path, user: str | None) -> None:
        env = {**os.environ, "LAZYFS_CACHE_SIZE": CACHE_SIZE}
        if user:
            env["LAZYFS_USER"] = user
        done = subprocess.run([str(LAZYFS / "mount.sh"), str(mount), str(backing)], env=env, capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise RuntimeError(f"mounting LazyFS on {mount} failed: {done.stderr.strip()[-1000:]}")

    def postmaster_pids(self) -> list[int]:
        """The postmaster and its children."""
        try:
            pid = int((self.pg_mount / "pgdata" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        children = Path(f"/proc/{pid}/task/{pid}/children")
        kids = [int(c) for c in children.read_text().split()] if children.exists() else []
        return [pid, *kids]

    def cut(self) -> float:
        """SIGKILL PostgreSQL (every process), drop every un-fsynced byte, start it again; returns the seconds."""
        t0 = time.monotonic()
        pids = self.postmaster_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _wait_gone(pids)   # a zombie postmaster looks alive to pg_ctl, and holds its files
        lock = self.pg_mount / "pgdata" / "postmaster.pid"
        if lock.exists() and not lock.read_text().strip():
            lock.unlink()   # emptied by the cut; PostgreSQL refuses to start on an empty lock file
        for mount in (self.pg_mount, self.wh_mount):
            subprocess.run([str(LAZYFS / "clear-cache"), str(mount)], check=True, capture_output=True, timeout=120)
        self.pg.start()
        self.cuts += 1
        return time.monotonic() - t0

    def close(self) -> None:
        for pid in self.postmaster_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for mount in (self.pg_mount, self.wh_mount):
            subprocess.run([str(LAZYFS / "umount.sh"), str(mount)], capture_output=True, timeout=120)
        shutil.rmtree(self.root, ignore_errors=True)


def _wait_gone(pids: list[int], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                break
            if state == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)   # ours to reap, if we are its parent
                except ChildProcessError:
                    pass
            time.sleep(0.05)
        else:
            raise RuntimeError(f"PostgreSQL process {pid} did not go away after SIGKILL")


def iceberg_read_back(base: str, namespace: str, tables: list[str], acked: dict[str, set[str]]) -> list[str]:
    """pyiceberg loads each table (its current metadata file, which the service wrote) and must find every
    commit acknowledged on it so far: a metadata file lost to the power loss fails the load."""
    from pyiceberg.catalog.rest import RestCatalog
    catalog = RestCatalog("chaos", uri=base)
    problems = []
    for name in tables:
        try:
            table = catalog.load_table((namespace, name))
        except Exception as exc:   # an empty or missing metadata file, say
            problems.append(f"iceberg {name}: pyiceberg cannot load it: {type(exc).__name__}: {exc}"[:300])
            continue
        present = {s.summary.additional_properties.get("chaos-id") for s in table.metadata.snapshots if s.summary}
        missing = acked.get(name, set()) - present
        if missing:
            problems.append(f"iceberg {name}: pyiceberg's load lacks {len(missing)} acknowledged commits, e.g. "
                            f"{sorted(missing)[:3]}")
    return problems
