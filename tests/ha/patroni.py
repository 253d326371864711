"""A PostgreSQL 15 pair under Patroni 3.0 with etcd 3.4 on loopback, run from Debian's packages (`apt-get install
patroni etcd-server`, as .ci/run does), and the three faults the service must ride out:

- `kill_postmaster()`: SIGKILL of the primary's postmaster and every server process (Patroni lives on and fails over
  to the synchronous standby at once, `primary_start_timeout: 0`, and the node rejoins as a standby);
- `switchover()`: `patronictl switchover` to the synchronous standby (a planned move of the primary);
- `stop_primary_patroni()`: SIGTERM to the primary's Patroni, which stops its PostgreSQL and hands the leader key
  over; the synchronous standby is promoted. `recover()` starts the node again, as a standby.

Every process runs as the unprivileged OS user the embedded database uses (PostgreSQL refuses root), on free ports
and in a temp dir of its own, so that several runs on one machine never meet. DCS timing is `TTL_S`, `LOOP_WAIT_S`
and `RETRY_TIMEOUT_S`, with `synchronous_mode: true` (docs/high-availability.md shows the same configuration).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from storage.embedded import DATABASE, SUPERUSER, EmbeddedPostgres, free_port

TTL_S, LOOP_WAIT_S, RETRY_TIMEOUT_S = 10, 1, 3
NODES = 2
START_TIMEOUT_S = 120


def missing_tools() -> str | None:
    """Why the Patroni tests cannot run here, or None when they can."""
    missing = [tool for tool in ("patroni", "patronictl", "etcd") if shutil.which(tool) is None]
    if missing:
        return (f"{', '.join(missing)} not installed: apt-get install -y patroni etcd-server "
                f"(Debian's Patroni 3.0 and etcd 3.4; .ci/run installs them)")
    return None


def patroni_config(scope: str, name: str, *, etcd: str, rest_port: int, pg_port: int, data_dir: Path,
                   socket_dir: Path, bin_dir: Path) -> dict:
    """One node's Patroni configuration (YAML is a superset of JSON, so it is written as JSON)."""
    return {
        "scope": scope,
        "name": name,
        "restapi": {"listen": f"127.0.0.1:{rest_port}", "connect_address": f"127.0.0.1:{rest_port}"},
        "etcd3": {"hosts": [etcd]},
        "bootstrap": {
            "dcs": {
                "ttl": TTL_S, "loop_wait": LOOP_WAIT_S, "retry_timeout": RETRY_TIMEOUT_S,
                # Only a synchronous standby may be promoted, so a failover never loses an acknowledged commit.
                "synchronous_mode": True,
                # A primary whose PostgreSQL crashed is not restarted in place (crash recovery, then a restart as
                # a standby and a promotion: ~6 s here) but failed over to the synchronous standby at once; it
                # rejoins as a standby (pg_rewind).
                "primary_start_timeout": 0,
                "maximum_lag_on_failover": 1048576,
                "postgresql": {
                    "use_pg_rewind": True,
                    "parameters": {"wal_level": "replica", "hot_standby": "on", "max_wal_senders": 5,
                                   "max_replication_slots": 5, "wal_log_hints": "on", "synchronous_commit": "on",
                                   "fsync": "on"},
                },
            },
            "initdb": [{"encoding": "UTF8"}, "no-locale"],
            "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                       "host replication all 127.0.0.1/32 trust"],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{pg_port}",
            "connect_address": f"127.0.0.1:{pg_port}",
            "data_dir": str(data_dir),
            "bin_dir": str(bin_dir),
            "pgpass": str(data_dir.parent / "pgpass"),
            "authentication": {"superuser": {"username": SUPERUSER}, "replication": {"username": "replicator"},
                               "rewind": {"username": SUPERUSER}},
            "parameters": {"unix_socket_directories": str(socket_dir)},
            # A new standby's base backup starts with an immediate checkpoint, not a spread one (minutes).
            "basebackup": [{"checkpoint": "fast"}],
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
    }


class Node:
    """One Patroni process and the PostgreSQL it runs."""

    def __init__(self, root: Path, name: str):
        self.name = name
        self.root = root
        self.rest_port = free_port()
        self.pg_port = free_port()
        self.config_path = root / "patroni.yml"
        self.data_dir = root / "pgdata"
        self.log_path = root / "patroni.log"
        self.proc: subprocess.Popen | None = None

    @property
    def rest(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None


class PatroniCluster:
    """etcd and NODES Patroni nodes, each running one PostgreSQL 15; `dsn` is libpq's multi-host form."""

    def __init__(self, root: Path):
        probe = EmbeddedPostgres(root / "probe")   # the OS user and server binaries the embedded database uses
        self.user, self.bin = probe.user, probe.bin
        self.root = root
        self.scope = "coordinator-ha-" + uuid.uuid4().hex[:8]
        self.etcd_client_port, self.etcd_peer_port = free_port(), free_port()
        self.etcd_proc: subprocess.Popen | None = None
        self.nodes = [Node(root / f"node{i}", f"node{i}") for i in range(NODES)]

    @property
    def etcd(self) -> str:
        return f"127.0.0.1:{self.etcd_client_port}"

    @property
    def dsn(self) -> str:
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)
        return f"postgresql://{SUPERUSER}@{hosts}/{DATABASE}?target_session_attrs=read-write"

    # -- processes --------------------------------------------------------------------------------------------

    def _as_user(self) -> dict:
        """Popen's arguments that run a process as the unprivileged user itself (no wrapper such as runuser,
        which would stand between a signal and the process it is meant for)."""
        if not self.user:
            return {}
        entry = pwd.getpwnam(self.user)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def _env(self) -> dict[str, str]:
        # Debian's Patroni runs on the system Python: keep this process's virtualenv out of its way.
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
        env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if ".venv" not in p) or "/usr/bin:/bin"
        env["HOME"] = str(self.root)
        return env

    def _spawn(self, args: list[str], log_path: Path) -> subprocess.Popen:
        with open(log_path, "ab") as log:
            return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self._env(), cwd=self.root,
                                    start_new_session=True, **self._as_user())

    def _run(self, args: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(args, capture_output=True, text=True, env=self._env(), cwd=self.root,
                              **self._as_user(), **kwargs)

    def _own(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.user:
            shutil.chown(path, self.user)

    def start(self) -> None:
        self._own(self.root)
        etcd_dir = self.root / "etcd"
        self._own(etcd_dir)
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://{self.etcd}"
        self.etcd_proc = self._spawn(
            ["etcd", "--name", "etcd0", "--data-dir", str(etcd_dir / "data"), "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"etcd0={peer}", "--initial-cluster-state", "new", "--enable-v2=false"],
            etcd_dir / "etcd.log")
        self._wait(lambda: httpx.get(f"{client}/health", timeout=1).json().get("health") == "true",
                   "etcd did not become healthy", self.root / "etcd" / "etcd.log")
        for node in self.nodes:
            self._own(node.root)
            socket_dir = node.root / "run"
            self._own(socket_dir)
            config = patroni_config(self.scope, node.name, etcd=self.etcd, rest_port=node.rest_port,
                                    pg_port=node.pg_port, data_dir=node.data_dir, socket_dir=socket_dir,
                                    bin_dir=self.bin)
            node.config_path.write_text(json.dumps(config, indent=2))
            if self.user:
                shutil.chown(node.config_path, self.user)
            self.start_node(node)
            if node is self.nodes[0]:   # the first bootstraps the cluster; the others clone it
                self._wait(lambda: self.leader() is node, "the first Patroni node did not bootstrap a primary",
                           node.log_path)
                self._create_database(node)
        self.wait_healthy()

    def start_node(self, node: Node) -> None:
        node.proc = self._spawn(["patroni", str(node.config_path)], node.log_path)

    def _create_database(self, node: Node) -> None:
        psql = str(self.bin / "psql")
        args = [psql, "-h", "127.0.0.1", "-p", str(node.pg_port), "-U", SUPERUSER, "-d", "postgres", "-qAtc",
                f"CREATE DATABASE {DATABASE}"]
        proc = self._run(args)
        assert proc.returncode == 0, f"creating the database failed: {proc.stderr}"

    def stop(self) -> None:
        for node in self.nodes:
            self._end(node.proc, signal.SIGTERM, 30)
        self._end(self.etcd_proc, signal.SIGTERM, 10)
        for node in self.nodes:   # a PostgreSQL whose Patroni was killed outright: stop it too
            pid = node.postmaster_pid()
            if pid is not None and _alive(pid):
                self._run([str(self.bin / "pg_ctl"), "stop", "-m", "immediate", "-D", str(node.data_dir)])

    @staticmethod
    def _end(proc: subprocess.Popen | None, sig: int, timeout_s: float) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    # -- state ------------------------------------------------------------------------------------------------

    def members(self) -> list[dict]:
        """Patroni's view of the cluster (`GET /cluster` of any node that answers)."""
        for node in self.nodes:
            try:
                return httpx.get(node.rest + "/cluster", timeout=2).json().get("members", [])
            except (httpx.HTTPError, ValueError):
                continue
        return []

    def leader(self) -> Node | None:
        for m in self.members():
            if m.get("role") in ("leader", "master", "primary") and m.get("state") == "running":
                return self._node(m["name"])
        return None

    def sync_standby(self) -> Node | None:
        for m in self.members():
            if m.get("role") == "sync_standby" and m.get("state") in ("streaming", "running"):
                return self._node(m["name"])
        return None

    def _node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until there is a primary and a synchronous standby that is streaming from it: ready for a fault."""
        self._wait(lambda: all(n.proc and n.proc.poll() is None for n in self.nodes) and self._streaming_in_sync(),
                   "the Patroni cluster has no primary with a synchronous standby", *[n.log_path for n in self.nodes],
                   timeout_s=timeout_s)

    def recover(self) -> None:
        """Ready for the next fault: every stopped node started again, and a synchronous standby streaming."""
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                self.start_node(node)
        self.wait_healthy()

    def _streaming_in_sync(self) -> bool:
        """Patroni names a primary and a synchronous standby, and the primary itself says so: it accepts writes
        and that standby streams from it synchronously (Patroni's view lags a crash by up to a loop)."""
        leader, standby = self.leader(), self.sync_standby()
        if leader is None or standby is None:
            return False
        proc = self._run([str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(leader.pg_port), "-U", SUPERUSER,
                          "-d", "postgres", "-qAtc",
                          "SELECT NOT pg_is_in_recovery() AND EXISTS (SELECT 1 FROM pg_stat_replication WHERE "
                          f"application_name = '{standby.name}' AND state = 'streaming' AND sync_state = 'sync')"])
        return proc.returncode == 0 and proc.stdout.strip() == "t"

    def _wait(self, ready, what: str, *logs: Path, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.2)
        tails = "\n".join(f"--- {p}:\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
        raise RuntimeError(f"{what} within {timeout_s:.0f} s; members: {self.members()}\n{tails}")

    # -- the faults -------------------------------------------------------------------------------------------

    # Each fault returns the time.monotonic() at which it struck, after finding its target.

    def kill_postmaster(self) -> float:
        """SIGKILL the primary's postmaster and every process it started, as the OOM killer might."""
        primary = self._require_leader()
        pid = primary.postmaster_pid()
        assert pid is not None, f"{primary.name} has no postmaster.pid"
        victims = [pid] + [int(d) for d in os.listdir("/proc") if d.isdigit() and _parent(int(d)) == pid]
        struck = time.monotonic()
        for victim in victims:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return struck

    def switchover(self) -> float:
        """A planned switchover to the synchronous standby; returns once patronictl says it is done."""
        primary, candidate = self._require_leader(), self.sync_standby()
        assert candidate is not None, "no synchronous standby to switch over to"
        config = primary.config_path
        struck = time.monotonic()
        proc = self._run(["patronictl", "-c", str(config), "switchover", self.scope, "--leader", primary.name,
                          "--candidate", candidate.name, "--force"], timeout=120)
        assert proc.returncode == 0, f"patronictl switchover failed ({proc.returncode}): {proc.stdout}{proc.stderr}"
        return struck

    def stop_primary_patroni(self) -> float:
        """SIGTERM the primary's Patroni: it stops PostgreSQL (fast) and gives up the leader key. `recover()`
        starts it again."""
        primary = self._require_leader()
        assert primary.proc is not None
        struck = time.monotonic()
        primary.proc.send_signal(signal.SIGTERM)
        primary.proc.wait(timeout=60)
        return struck

    def _require_leader(self) -> Node:
        leader = self.leader()
        assert leader is not None, f"no primary: {self.members()}"
        return leader


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@contextmanager
def patroni_cluster() -> Iterator[PatroniCluster]:
    root = Path(tempfile.mkdtemp(prefix="coordinator-patroni-"))
    root.chmod(0o755)   # as root, the services run as another OS user that must reach their directories
    cluster = PatroniCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
