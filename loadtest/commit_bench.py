"""Iceberg commit throughput and latency: N tables x W writers against a real service, raw HTTP keep-alive.

    python -m loadtest.commit_bench                       # starts its own service (embedded PostgreSQL)
    python -m loadtest.commit_bench --url http://127.0.0.1:8181 --tables 64 --writers 8 --duration 20

Flows: `append` is what Iceberg clients do (add-snapshot + set-snapshot-ref main guarded by
assert-ref-snapshot-id; on 409 reload the table and retry); `props` commits set-properties with no
requirement (never conflicts: the coordinator's raw commit rate). Prints one row per configuration.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import trio

from .http import HttpConnection

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


@dataclass
class Result:
    latencies_s: list[float] = field(default_factory=list)
    conflicts: int = 0
    errors: int = 0


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def writer(base: str, ns: str, table: str, flow: str, until: float, result: Result) -> None:
    conn = HttpConnection(base)
    path = f"/v1/namespaces/{ns}/tables/{table}"
    snapshot_id = seq = None
    rng = random.Random()

    async def reload() -> None:
        nonlocal snapshot_id, seq
        status, body = await conn.request("GET", path)
        meta = orjson.loads(body)["metadata"]
        snapshot_id = meta.get("current-snapshot-id")
        if snapshot_id == -1:
            snapshot_id = None
        seq = meta.get("last-sequence-number", 0)

    try:
        if flow == "append":
            await reload()
        while time.perf_counter() < until:
            if flow == "append":
                new_id = rng.getrandbits(62)
                snap = {"snapshot-id": new_id, "sequence-number": seq + 1, "timestamp-ms": int(time.time() * 1000),
                        "manifest-list": f"file:///tmp/bench/{uuid.uuid4()}.avro", "summary": {"operation": "append"},
                        "schema-id": 0}
                if snapshot_id is not None:
                    snap["parent-snapshot-id"] = snapshot_id
                body = {"requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": snapshot_id}],
                        "updates": [{"action": "add-snapshot", "snapshot": snap},
                                    {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch",
                                     "snapshot-id": new_id}]}
            else:
                body = {"requirements": [], "updates": [{"action": "set-properties",
                                                         "updates": {"k": str(rng.getrandbits(32))}}]}
            t0 = time.perf_counter()
            status, resp = await conn.request("POST", path, body)
            dt = time.perf_counter() - t0
            if status == 200:
                result.latencies_s.append(dt)
                if flow == "append":
                    snapshot_id, seq = new_id, seq + 1
            elif status == 409:
                result.conflicts += 1
                await reload()
            else:
                result.errors += 1
                await trio.sleep(0.01)
    finally:
        await conn.close()


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


async def run_config(base: str, tables: int, writers: int, duration_s: float, flow: str,
                     server_pid: int | None) -> dict:
    ns = f"bench_{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        (await http.post("/v1/namespaces", json={"namespace": [ns]})).raise_for_status()
        for t in range(tables):
            (await http.post(f"/v1/namespaces/{ns}/tables", json={"name": f"t{t}", "schema": SCHEMA})).raise_for_status()
    result = Result()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    srv0 = _proc_cpu_s(server_pid) if server_pid else None
    start = time.perf_counter()
    until = start + duration_s
    async with trio.open_nursery() as n:
        for t in range(tables):
            for _ in range(writers):
                n.start_soon(writer, base, ns, f"t{t}", flow, until, result)
    elapsed = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    gen_cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    srv_cpu = (_proc_cpu_s(server_pid) - srv0) if server_pid else None
    ok = len(result.latencies_s)
    attempts = ok + result.conflicts + result.errors
    return {
        "flow": flow, "tables": tables, "writers_per_table": writers, "duration_s": round(elapsed, 1),
        "commits": ok, "commits_per_s": round(ok / elapsed, 1), "conflicts": result.conflicts,
        "errors": result.errors,
        "p50_ms": round(pct(result.latencies_s, 50) * 1000, 2), "p99_ms": round(pct(result.latencies_s, 99) * 1000, 2),
        "loadgen_cpu_pct": round(100 * gen_cpu / elapsed, 1),
        "server_cpu_ms_per_request": round(1000 * srv_cpu / max(attempts, 1), 3) if srv_cpu is not None else None,
    }


def start_service(port: int) -> tuple[subprocess.Popen, str, str]:
    data = tempfile.mkdtemp(prefix="commit-bench-")
    Path(data).chmod(0o755)
    proc = subprocess.Popen([sys.executable, "-m", "api.cli", "serve", "--port", str(port), "--data-dir", data,
                             "--log-level", "warning"], cwd=Path(__file__).resolve().parents[1])
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/readyz", timeout=1).status_code == 200:
                return proc, base, data
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise SystemExit("service failed to start; run `coordinator serve` by hand to see why")
        time.sleep(0.2)
    raise SystemExit("service did not become ready within 60 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running service; default: start one with an embedded PostgreSQL")
    ap.add_argument("--matrix", default="1x8,64x8", help="comma-separated TABLESxWRITERS configurations")
    ap.add_argument("--flows", default="append,props")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per configuration")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()

    proc = data = None
    if args.url:
        base, pid = args.url, None
    else:
        from storage.embedded import EmbeddedPostgres, free_port
        print("starting the service with an embedded PostgreSQL ...", flush=True)
        proc, base, data = start_service(free_port())
        pid = proc.pid
    rows = []
    try:
        for flow in args.flows.split(","):
            for cfg in args.matrix.split(","):
                tables, writers = (int(x) for x in cfg.split("x"))
                print(f"running {flow} {tables} tables x {writers} writers for {args.duration:.0f} s ...", flush=True)
                rows.append(trio.run(run_config, base, tables, writers, args.duration, flow, pid))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
            from storage.embedded import EmbeddedPostgres
            EmbeddedPostgres(Path(data) / "postgres").destroy()
            shutil.rmtree(data, ignore_errors=True)
    cols = list(rows[0])
    print()
    print(" | ".join(cols))
    print(" | ".join("---" for _ in cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    if args.json:
        Path(args.json).write_text(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
