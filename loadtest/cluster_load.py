"""A cluster of real `coordinator serve --cluster` members on one throwaway PostgreSQL, and writers that log every
commit, for the benchmarks that stop, kill, restart or upgrade members under load (takeover_bench, rolling_bench).

Each writer thread owns one Iceberg table and adds one snapshot per commit on top of main
(`assert-ref-snapshot-id`), each carrying an id of its own in its summary; it sends each commit ONCE, through the
members a load balancer would pick (round-robin over those not taken out of rotation; a refused connection, which
reached no member, goes to the next one, as a balancer does), and logs the answer. At the
end every table is read back: an acknowledged commit whose snapshot is not on main is lost. The members log at
LOADTEST_MEMBER_LOG_LEVEL (warning by default).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from storage.embedded import EmbeddedPostgres, free_port
from storage.records import SHARDS, shard_of
from tests.support import sql

from . import procs
from .flows import iceberg_commit_body

NAMESPACE = "rolling"
SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
CLIENT_TIMEOUT_S = 60


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Member:
    """One member process on a fixed HTTP port and channel port, so that a restart keeps its addresses."""

    def __init__(self, index: int, dsn: str, root: Path, warehouse: Path):
        self.index = index
        self.dsn = dsn
        self.port, self.channel_port = free_port(), free_port()
        self.root, self.warehouse = root / f"m{index}", warehouse
        self.base = f"http://127.0.0.1:{self.port}"
        self.child: procs.Child | None = None
        self.in_rotation = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.channel_port}"

    def launch(self, env: dict[str, str] | None = None, code: Path = procs.ROOT) -> None:
        """Start the process (running the checkout `code`); `wait_ready` waits for it (several members' imports
        can overlap)."""
        self.child = procs.service(self.port, self.dsn, self.root, self.root / "server.log", cluster=True,
                                   warehouse=self.warehouse, env=env, code=code,
                                   extra_args=["--cluster-port", str(self.channel_port),
                                               "--log-level", os.environ.get("LOADTEST_MEMBER_LOG_LEVEL", "warning")])
        self.child.launch()

    def wait_ready(self) -> None:
        assert self.child is not None
        procs.wait_ready(self.base + "/readyz", self.child.proc, f"member {self.index}", self.child.log, 120)
        self.in_rotation = True

    def start(self, env: dict[str, str] | None = None, code: Path = procs.ROOT) -> None:
        self.launch(env, code)
        self.wait_ready()

    def gauge(self, name: str) -> float | None:
        """One of the member's /metrics gauges (None if it does not report it)."""
        try:
            text = httpx.get(self.base + "/metrics", timeout=10).text
        except httpx.HTTPError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def stop(self) -> float:
        """Out of rotation, then SIGTERM (a graceful stop); returns how long the process took to exit."""
        self.in_rotation = False
        started = time.monotonic()
        assert self.child is not None
        self.child.stop(grace_s=60)
        return time.monotonic() - started

    def kill(self) -> float:
        """SIGKILL; returns the moment it was sent."""
        self.in_rotation = False
        assert self.child is not None and self.child.proc is not None
        at = time.monotonic()
        self.child.proc.kill()
        self.child.proc.wait()
        return at


class Cluster:
    """A throwaway PostgreSQL and `n` members sharing it."""

    def __init__(self, n: int, root: Path):
        self.root = root
        self.pg = EmbeddedPostgres(root / "pg")
        self.n = n
        self.members: list[Member] = []

    def start(self, env: dict[str, str] | None = None, code: Path = procs.ROOT) -> None:
        dsn = self.pg.start()
        self.members = [Member(i, dsn, self.root, self.root / "warehouse") for i in range(self.n)]
        for m in self.members:
            m.launch(env, code)
        for m in self.members:
            m.wait_ready()
        self.wait_balanced()

    @property
    def dsn(self) -> str:
        return self.pg.dsn

    def stop(self) -> None:
        for m in self.members:
            if m.child is not None:
                m.child.stop(grace_s=30)
        self.pg.destroy()

    def owners(self) -> dict[int, str | None]:
        """shard -> the channel address of the member whose lease on it is live (None: no live owner)."""
        rows = sql(self.dsn, "SELECT l.shard, m.address, l.expires_at > now() AS live FROM shard_leases l"
                               " LEFT JOIN cluster_members m ON m.member_id = l.owner")
        return {r["shard"]: r["address"] if r["live"] else None for r in rows}

    def wait_balanced(self, timeout_s: float = 60) -> None:
        """Until every shard has a live owner and every running member holds some."""
        deadline = time.monotonic() + timeout_s
        running = {m.address for m in self.members if m.child and m.child.proc and m.child.proc.poll() is None}
        while time.monotonic() < deadline:
            owners = self.owners()
            held = set(owners.values())
            if len(owners) == SHARDS and None not in held and running <= held:
                return
            time.sleep(0.2)
        raise SystemExit(f"the cluster did not balance within {timeout_s:.0f} s: {self.owners()}")

    def up(self) -> list[Member]:
        return [m for m in self.members if m.in_rotation]


@dataclass
class Commit:
    table: str
    cid: str
    sent: float
    at: float
    code: int | str           # the HTTP status, or the client error's class when no answer came
    member: int               # the member it was sent through
    text: str = ""


@dataclass
class Log:
    lock: threading.Lock = field(default_factory=threading.Lock)
    commits: list[Commit] = field(default_factory=list)
    refused: int = 0   # connections refused by a member that had just stopped, sent on to the next member

    def add(self, c: Commit) -> None:
        with self.lock:
            self.commits.append(c)

    def snapshot(self) -> list[Commit]:
        with self.lock:
            return list(self.commits)


class Writer(threading.Thread):
    """Commits to one table, once per commit, until stopped; `pause_s` between commits."""

    def __init__(self, cluster: Cluster, table: str, log: Log, stop: threading.Event, *, pause_s: float = 0.0,
                 via: Member | None = None):
        super().__init__(daemon=True, name=f"writer-{table}")
        self.cluster, self.table, self.log, self.stop, self.pause_s, self.via = cluster, table, log, stop, pause_s, via
        self.path = f"/v1/namespaces/{NAMESPACE}/tables/{table}"
        self.clients: dict[int, httpx.Client] = {}
        self.turn = hash(table)
        self.view: tuple[int | None, int, str] | None = None

    def _member(self) -> Member:
        if self.via is not None:
            return self.via
        while True:
            up = self.cluster.up()
            if up:
                self.turn += 1
                return up[self.turn % len(up)]
            time.sleep(0.05)

    def _http(self, m: Member) -> httpx.Client:
        client = self.clients.get(m.index)
        if client is None:
            client = self.clients[m.index] = httpx.Client(base_url=m.base, timeout=CLIENT_TIMEOUT_S)
        return client

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.commit_once()
                if self.pause_s:
                    self.stop.wait(self.pause_s)
        finally:
            for c in self.clients.values():
                c.close()

    def _load(self) -> bool:
        while not self.stop.is_set():
            m = self._member()
            try:
                r = self._http(m).get(self.path, params={"snapshots": "refs"})
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            if r.status_code == 200:
                md = r.json()["metadata"]
                self.view = (md["refs"].get("main", {}).get("snapshot-id"), md["last-sequence-number"],
                             md["location"])
                return True
            time.sleep(0.05)
        return False

    def commit_once(self) -> None:
        if self.view is None and not self._load():
            return
        parent, last_seq, location = self.view
        cid = uuid.uuid4().hex
        snapshot_id = uuid.uuid4().int >> 66
        body = iceberg_commit_body(parent, snapshot_id, last_seq + 1,
                                   manifest_list=f"{location}/metadata/snap-{snapshot_id}-{cid}.avro",
                                   summary={"operation": "append", "bench-id": cid})
        key, sent = _uuid7(), time.monotonic()
        while True:
            m = self._member()
            try:
                r = self._http(m).post(self.path, json=body, headers={"Idempotency-Key": key})
                code, text = r.status_code, ("" if r.status_code < 300 else r.text[:300])
            except httpx.ConnectError:
                # Refused: nothing reached that member (it stopped after this writer picked it). A balancer sends
                # such a request to the next member, as this one does.
                self.log.refused += 1
                continue
            except httpx.HTTPError as exc:
                code, text = type(exc).__name__, str(exc)[:300]
            break
        self.log.add(Commit(self.table, cid, sent, time.monotonic(), code, m.index, text))
        self.view = (snapshot_id, last_seq + 1, location) if code == 200 else None


def _uuid7() -> str:
    from coordinator.keys import new_key
    return new_key()


def create_tables(base: str, names: list[str]) -> dict[str, int]:
    """Create the Iceberg tables; returns each one's shard."""
    out = {}
    with httpx.Client(base_url=base, timeout=60) as http:
        r = http.post("/v1/namespaces", json={"namespace": [NAMESPACE]})
        assert r.status_code in (200, 409), r.text
        for name in names:
            for _ in range(100):
                r = http.post(f"/v1/namespaces/{NAMESPACE}/tables", json={
                    "name": name, "schema": SCHEMA, "properties": {"write.metadata.previous-versions-max": "10"}})
                if r.status_code != 503:
                    break
                time.sleep(0.1)
            assert r.status_code == 200, r.text
            out[name] = shard_of(uuid.UUID(r.json()["metadata"]["table-uuid"]))
    return out


def lost(base: str, log: Log) -> list[str]:
    """Acknowledged commits whose snapshot is not on the table's main branch."""
    acked: dict[str, set[str]] = {}
    for c in log.snapshot():
        if c.code == 200:
            acked.setdefault(c.table, set()).add(c.cid)
    out = []
    with httpx.Client(base_url=base, timeout=60) as http:
        for table, ids in sorted(acked.items()):
            r = http.get(f"/v1/namespaces/{NAMESPACE}/tables/{table}")
            assert r.status_code == 200, r.text
            md = r.json()["metadata"]
            snapshots = {s["snapshot-id"]: s for s in md["snapshots"]}
            on_main, sid = set(), md["refs"].get("main", {}).get("snapshot-id")
            while sid is not None and sid in snapshots:
                on_main.add(snapshots[sid]["summary"].get("bench-id"))
                sid = snapshots[sid].get("parent-snapshot-id")
            out += [f"{table}: acknowledged commit {cid} is not on main" for cid in sorted(ids - on_main)]
    return out


class Workdir:
    """A temp dir kept only when asked (`--keep`), for the members' logs."""

    def __init__(self, keep: bool, prefix: str):
        self.path = Path(tempfile.mkdtemp(prefix=prefix))
        self.path.chmod(0o755)   # as root, PostgreSQL runs as another OS user that must reach its directory
        self.keep = keep

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc) -> None:
        if self.keep:
            print(f"logs kept in {self.path}")
        else:
            shutil.rmtree(self.path, ignore_errors=True)
