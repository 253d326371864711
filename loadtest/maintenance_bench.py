"""Snapshot expiry keeps an Iceberg table's commit cost flat: the service's CPU per commit at 200 appends and at
20,000, with the service's expiry keeping 100 snapshots (docs/maintenance.md).

    python -m loadtest.maintenance_bench                       # 20,000 appends, windows of 200 commits
    python -m loadtest.maintenance_bench --appends 2000        # shorter

Starts its own PostgreSQL and the service (this checkout; expiry at most once a second per table, no deletion
grace), creates one table with `maintenance.expire-snapshots.enabled=true`, `history.expire.max-snapshot-age-ms=1`
and `history.expire.min-snapshots-to-keep=100`, and appends to it with one writer over raw HTTP at a fixed rate (`--rate`, 25/s): each
commit's snapshot has a real manifest list and a real manifest (Avro) in the table's location, the list naming the
newest 50 manifests (as a writer that merges older ones away would), so that every expiry's deletion reads
manifest lists and manifests, finds the manifests and data files only expired snapshots held, and deletes them.
The data files themselves are not written (nothing reads them; their deletion finds nothing to delete).

Measured over a window of commits starting at 200 appends and one ending at the last: the service process's CPU
(all threads: the writers' commits, the expiries, their deletion) per writer commit, and of it the expiry
commits' CPU (`coordinator_maintenance_expiry_cpu_seconds_total`) and the deletion's
(`coordinator_maintenance_deletion_cpu_seconds_total`) per writer commit. Prints one table.
"""

from __future__ import annotations

import argparse
import io
import random
import shutil
import tempfile
import time
from pathlib import Path

import fastavro
import orjson
import trio

from storage.embedded import EmbeddedPostgres, free_port
from storage.files import to_local_path

from . import procs
from .flows import iceberg_commit_body
from .http import HttpConnection

MANIFEST_LIST = fastavro.parse_schema({"type": "record", "name": "manifest_file", "fields": [
    {"name": "manifest_path", "type": "string"}, {"name": "manifest_length", "type": "long"},
    {"name": "partition_spec_id", "type": "int"}, {"name": "added_snapshot_id", "type": "long"}]})
MANIFEST = fastavro.parse_schema({"type": "record", "name": "manifest_entry", "fields": [
    {"name": "status", "type": "int"}, {"name": "snapshot_id", "type": ["null", "long"]},
    {"name": "data_file", "type": {"type": "record", "name": "r2", "fields": [
        {"name": "content", "type": "int"}, {"name": "file_path", "type": "string"},
        {"name": "record_count", "type": "long"}]}}]})
LIST_MANIFESTS = 50
KEEP = 100
COUNTERS = ("coordinator_maintenance_expiry_cpu_seconds_total", "coordinator_maintenance_deletion_cpu_seconds_total",
            "coordinator_maintenance_expiry_commits_total", "coordinator_maintenance_snapshots_expired_total",
            "coordinator_maintenance_files_deleted_total")


async def scrape(base: str) -> dict[str, float]:
    """The maintenance counters from the service's /metrics."""
    conn = HttpConnection(base)
    try:
        _, body = await conn.request("GET", "/metrics")
    finally:
        await conn.close()
    values = {}
    for line in body.decode().splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTERS:
            values[name] = float(value)
    return values


def _avro(schema, records) -> bytes:
    out = io.BytesIO()
    fastavro.writer(out, schema, records)
    return out.getvalue()


class Appender:
    def __init__(self, base: str, location: str, path: str):
        self.base, self.path = base, path
        self.dir = to_local_path(location) / "metadata"
        self.location = location
        self.manifests: list[str] = []
        self.parent: int | None = None
        self.seq = 0
        self.rng = random.Random(7)

    async def append(self, conn: HttpConnection) -> None:
        snapshot_id = self.rng.getrandbits(62)
        manifest = f"{self.location}/metadata/m-{snapshot_id}.avro"
        (self.dir / f"m-{snapshot_id}.avro").write_bytes(_avro(MANIFEST, [{"status": 1, "snapshot_id": snapshot_id,
            "data_file": {"content": 0, "file_path": f"{self.location}/data/{snapshot_id}.parquet",
                          "record_count": 100}}]))
        self.manifests = [*self.manifests[-(LIST_MANIFESTS - 1):], manifest]
        (self.dir / f"snap-{snapshot_id}.avro").write_bytes(_avro(MANIFEST_LIST, [
            {"manifest_path": m, "manifest_length": 100, "partition_spec_id": 0, "added_snapshot_id": snapshot_id}
            for m in self.manifests]))
        body = iceberg_commit_body(self.parent, snapshot_id, self.seq + 1)
        body["updates"][0]["snapshot"]["manifest-list"] = f"{self.location}/metadata/snap-{snapshot_id}.avro"
        status, answer = await conn.request("POST", self.path, body)
        if status != 200:
            raise SystemExit(f"an append failed: HTTP {status} {answer[:300]!r}")
        self.parent, self.seq = snapshot_id, self.seq + 1


async def run(base: str, server_pid: int, appends: int, window: int, rate: float) -> list[dict]:
    conn = HttpConnection(base)
    status, _ = await conn.request("POST", "/v1/namespaces", {"namespace": ["bench"]})
    schema = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
    status, answer = await conn.request("POST", "/v1/namespaces/bench/tables", {
        "name": "stream", "schema": schema, "properties": {
            "maintenance.expire-snapshots.enabled": "true", "history.expire.max-snapshot-age-ms": "1",
            "history.expire.min-snapshots-to-keep": str(KEEP)}})
    if status != 200:
        raise SystemExit(f"creating the table failed: HTTP {status} {answer[:300]!r}")
    location = orjson.loads(answer)["metadata"]["location"]
    writer = Appender(base, location, "/v1/namespaces/bench/tables/stream")
    starts = {200: "at 200 appends", max(appends - window, 200 + window): f"at {appends} appends"}
    rows, current = [], None
    meter = procs.CpuMeter(server_pid, None)
    for k in range(appends):
        if k in starts:
            meter.start()
            current = {"when": starts[k], "counters": await scrape(base), "started": time.perf_counter()}
        started = time.perf_counter()
        await writer.append(conn)
        await trio.sleep(max(0.0, 1 / rate - (time.perf_counter() - started)))
        if current is not None and k + 1 - next(s for s in starts if starts[s] == current["when"]) == window:
            cpu = meter.stop()
            after = await scrape(base)
            status, body = await conn.request("GET", writer.path)
            snapshots = len(orjson.loads(body)["metadata"].get("snapshots") or [])
            delta = {c: after.get(c, 0.0) - current["counters"].get(c, 0.0) for c in COUNTERS}
            rows.append({"window": current["when"], "commits": window,
                         "commits_per_s": window / (time.perf_counter() - current["started"]),
                         "server_cpu_ms_per_commit": cpu.server_s * 1000 / window,
                         "expiry_cpu_ms_per_commit": delta[COUNTERS[0]] * 1000 / window,
                         "deletion_cpu_ms_per_commit": delta[COUNTERS[1]] * 1000 / window,
                         "expiries": delta[COUNTERS[2]], "snapshots_expired": delta[COUNTERS[3]],
                         "files_deleted": delta[COUNTERS[4]], "snapshots_at_end": snapshots})
            print(f"  -> {rows[-1]}", flush=True)
            current = None
        if (k + 1) % 1000 == 0:
            print(f"{k + 1} appends", flush=True)
    await conn.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--appends", type=int, default=20_000)
    ap.add_argument("--window", type=int, default=200, help="commits per measured window")
    ap.add_argument("--rate", type=float, default=25.0,
                    help="appends per second at most (the same in both windows, so that both see as many "
                         "expiries per commit: one a second at most)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="maintenance-bench-"))
    tmp.chmod(0o755)
    pg = child = None
    try:
        print("starting PostgreSQL ...", flush=True)
        pg = EmbeddedPostgres(tmp / "pg")
        pg.start()
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        print("starting the service (expiry at most once a second per table) ...", flush=True)
        child = procs.service(port, pg.dsn, tmp / "srv", tmp / "srv.log",
                              env={"COORDINATOR_MAINTENANCE_INTERVAL_S": "1",
                                   "COORDINATOR_MAINTENANCE_DELETE_GRACE_S": "0"})
        child.start(base + "/readyz")
        print(f"appending {args.appends} times to one table, one writer, at most {args.rate:g}/s ...", flush=True)
        rows = trio.run(run, base, child.pid, args.appends, args.window, args.rate)
    finally:
        if child is not None:
            child.stop()
        if pg is not None:
            pg.destroy()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\none Iceberg table, expiry keeping {KEEP} snapshots (max age 1 ms), one writer at most {args.rate:g}/s; "
          f"windows of {args.window} commits\n")
    cols = ["window", "commits_per_s", "server_cpu_ms_per_commit", "expiry_cpu_ms_per_commit",
            "deletion_cpu_ms_per_commit", "expiries", "snapshots_expired", "files_deleted", "snapshots_at_end"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---:" for _ in cols) + "|")
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    if len(rows) == 2:
        x = rows[1]["server_cpu_ms_per_commit"] / rows[0]["server_cpu_ms_per_commit"]
        print(f"\ncommit cost {rows[1]['window']} vs {rows[0]['window']}: {x:.2f}x "
              f"({'OK' if x <= 1.2 else 'MISS'}: target <= 1.2x)")


if __name__ == "__main__":
    main()
