"""How soon a waiting feed reader hears of a commit: `python -m loadtest.feed_bench [--commits 300] [--rate 20]`.

Starts one throwaway PostgreSQL and the service as real processes (alone, then two cluster members sharing the
database), creates an Iceberg table, and has readers long-poll `GET /api/coordinator/v1/events` (`wait=30`, each
resuming from its last `next`) while one client commits to the table at `--rate` commits/s. For each commit it
takes the moment its acknowledgement reached the committing client and the moment each reader's answer holding
that commit's event reached the reader (all clocks are this process's). Prints one table: the delay from the
acknowledgement to the readers' answers (p50/p99; below zero when a reader heard before the committer did), the
commit's own latency for comparison, and the service's CPU per commit (all members), with 0, 1 and 20 readers.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx

from storage.embedded import EmbeddedPostgres, free_port

from . import procs

EVENTS = "/api/coordinator/v1/events"
SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Reader(threading.Thread):
    """Follows the feed from `after`, noting when each Iceberg version of the table arrived."""

    def __init__(self, base: str, after: str, stop: threading.Event):
        super().__init__(daemon=True)
        self.base, self.after, self.stop = base, after, stop
        self.heard: dict[int, float] = {}

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=60) as http:
            while not self.stop.is_set():
                page = http.get(EVENTS, params={"after": self.after, "wait": 2, "table": "bench.t"}).json()
                now = time.monotonic()
                for e in page["events"]:
                    self.heard.setdefault(e["data"]["version"], now)
                self.after = page["next"]


def scenario(name: str, pg: EmbeddedPostgres, tmp: Path, *, members: int, readers: int, commits: int,
             rate: float) -> dict:
    db = f"feed_{name.replace(' ', '_').replace(',', '')}"
    pg._psql("-c", f"CREATE DATABASE {db}")
    dsn = pg.dsn_for(db)
    children, bases = [], []
    try:
        for i in range(members):
            port = free_port()
            child = procs.service(port, dsn, tmp / db / f"m{i}", tmp / f"{db}-{i}.log", cluster=members > 1,
                                  warehouse=tmp / db / "warehouse")
            children.append(child.launch())
            bases.append(f"http://127.0.0.1:{port}")
        for child, base in zip(children, bases):
            child.start(base + "/readyz")
        commit_base, read_base = bases[0], bases[-1]   # with two members, readers wait on the other one
        http = httpx.Client(base_url=commit_base, timeout=30)
        assert http.post("/v1/namespaces", json={"namespace": ["bench"]}).status_code == 200
        r = http.post("/v1/namespaces/bench/tables", json={"name": "t", "schema": SCHEMA})
        assert r.status_code == 200, r.text
        after = httpx.get(read_base + EVENTS, timeout=30).json()["next"]
        stop = threading.Event()
        pool = [Reader(read_base, after, stop) for _ in range(readers)]
        for reader in pool:
            reader.start()
        time.sleep(1.0)   # every reader waiting
        acked: dict[int, tuple[float, float]] = {}
        cpu_before = sum(procs.tree_cpu_s(c.pid) for c in children)
        started = time.monotonic()
        for n in range(commits):
            due = started + n / rate
            time.sleep(max(0.0, due - time.monotonic()))
            sent = time.monotonic()
            r = http.post("/v1/namespaces/bench/tables/t", json={"requirements": [], "updates": [
                {"action": "set-properties", "updates": {"n": str(n)}}]})
            assert r.status_code == 200, r.text
            version = int(r.json()["metadata-location"].rsplit("/", 1)[1].split("-")[0])
            acked[version] = (sent, time.monotonic())
        cpu = sum(procs.tree_cpu_s(c.pid) for c in children) - cpu_before
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(len(rd.heard) < commits for rd in pool):
            time.sleep(0.1)
        stop.set()
        delays = [rd.heard[v] - ack for rd in pool for v, (_, ack) in acked.items() if v in rd.heard]
        missing = sum(1 for rd in pool for v in acked if v not in rd.heard)
        latency = [ack - sent for sent, ack in acked.values()]
        return {"scenario": name, "readers": readers, "commits": commits,
                "commit p50": percentile(latency, 0.5) * 1000, "commit p99": percentile(latency, 0.99) * 1000,
                "heard p50": percentile(delays, 0.5) * 1000, "heard p99": percentile(delays, 0.99) * 1000,
                "cpu ms/commit": cpu * 1000 / commits, "not heard": missing}
    finally:
        for child in children:
            child.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.feed_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=300, help="commits per scenario")
    parser.add_argument("--rate", type=float, default=20.0, help="commits per second")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="feed-bench-"))
    pg = EmbeddedPostgres(tmp / "pg")
    rows = []
    try:
        print("starting PostgreSQL ...", flush=True)
        pg.start()
        for name, members, readers in (("one process", 1, 0), ("one process", 1, 1), ("one process", 1, 20),
                                       ("two members, reader on the other", 2, 0),
                                       ("two members, reader on the other", 2, 1),
                                       ("two members, reader on the other", 2, 20)):
            print(f"{name}, {readers} readers: {args.commits} commits at {args.rate:g}/s ...", flush=True)
            rows.append(scenario(f"{name}, {readers}", pg, tmp, members=members, readers=readers,
                                 commits=args.commits, rate=args.rate))
    finally:
        pg.destroy()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{args.commits} Iceberg commits at {args.rate:g}/s per scenario; readers long-poll with wait=2 s and "
          f"the table filter; delays from the commit's acknowledgement at its client to each reader's answer\n")
    head = ["scenario", "readers", "ack -> heard p50 ms", "ack -> heard p99 ms", "commit p50 ms", "commit p99 ms",
            "server CPU ms/commit", "not heard"]
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for r in rows:
        name = r["scenario"].rsplit(",", 1)[0]
        print(f"| {name} | {r['readers']} | {r['heard p50']:.1f} | {r['heard p99']:.1f} | {r['commit p50']:.1f} | "
              f"{r['commit p99']:.1f} | {r['cpu ms/commit']:.2f} | {r['not heard']} |")


if __name__ == "__main__":
    main()
