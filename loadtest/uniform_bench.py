"""UniForm: how soon the Iceberg side of a Delta table the service converts shows a commit, and what converting costs.

    python -m loadtest.uniform_bench                               # 10 and 100 commits/s to one table, 20 s each
    python -m loadtest.uniform_bench --rates 10,100,250 --duration 30

Starts its own PostgreSQL and the service (this checkout), creates one Delta table the service converts to Iceberg
(the `delta-uniform` flow: real staged commits with an add action each, and their backfilled copies), and commits
to it at each rate (open loop, one writer, Poisson arrivals); and the same against a second service, side by side
on the same PostgreSQL, that does not convert (`uniform_workers` 0), for the commits' own latency and CPU. Meanwhile a reader polls the table through the
Iceberg endpoint (`If-None-Match`: a 304 costs nothing while the metadata is unchanged) for the Delta version its
metadata shows (`delta-version`). A commit's delay is from its acknowledgement to the first poll showing it; the
poller looks every `--poll-ms`, so a delay is known to within that. Prints one table: per rate, the commits, their
p50/p99, the delay p50/p99, the conversions and commits per conversion, the service's CPU (the reader's polls
included: both services are polled alike, the one that does not convert answering 404) and its conversion
workers' CPU per commit.

What conversion costs the commit path itself is the same-run A/B of the `delta-uniform` flow against a checkout
without it (`python -m loadtest.ab OLD NEW --flows delta,delta-uniform --rate 250`; loadtest/README.md).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import orjson
import trio

from storage.embedded import EmbeddedPostgres, free_port

from . import procs
from .flows import FLOWS, DeltaUniformWriter, Stats
from .http import HttpConnection
from .runner import pct, scrape

MOUNT = "/api/2.1/unity-catalog/iceberg/v1/catalogs/bench/namespaces/{schema}/tables/{table}"
CATCH_UP_S = 60


async def measure(base: str, server_pid: int, rate: float, duration_s: float, poll_s: float, tag: str,
                  converting: bool) -> dict:
    flow = FLOWS["delta-uniform"]
    [table] = await flow.prepare(base, 1, tag)
    stats = Stats()
    writer: DeltaUniformWriter = flow.writer(base, table, stats)
    await writer.start()
    seen: dict[int, float] = {}   # Delta version -> when the Iceberg side first showed it
    done = trio.Event()
    if converting:   # a first conversion before the window: the worker process is started, its imports done
        await writer.commit(time.perf_counter() + 30)
        deadline = time.perf_counter() + CATCH_UP_S
        while not await _shown(base, tag, writer.last) and time.perf_counter() < deadline:
            await trio.sleep(0.05)
        writer.acked_at.clear()

    async def poll() -> None:
        conn, etag, shown = HttpConnection(base), None, -1
        path = MOUNT.format(schema=tag, table="t0")
        try:
            while not done.is_set():
                status, body = await conn.request("GET", path, None, {"If-None-Match": etag} if etag else None)
                now = time.perf_counter()
                if status == 200 and converting:
                    etag = conn.headers.get("etag")
                    version = int(orjson.loads(body)["metadata"]["properties"].get("delta-version", -1))
                    for v in range(shown + 1, version + 1):
                        seen[v] = now
                    shown = max(shown, version)
                await trio.sleep(poll_s)
        finally:
            await conn.close()

    before = await scrape(base)
    meter = procs.CpuMeter(server_pid, None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)   # (the service that does not convert answers 404: the same reader's load)
        meter.start()
        rng = random.Random(7)
        t0 = time.perf_counter()
        due = t0 + rng.expovariate(rate)
        latencies: list[float] = []
        while due < t0 + duration_s:
            if due > time.perf_counter():
                await trio.sleep(due - time.perf_counter())
            if await writer.commit(t0 + duration_s + 10):
                latencies.append(time.perf_counter() - due)
            due += rng.expovariate(rate)
        elapsed = time.perf_counter() - t0
        last = max(writer.acked_at, default=0)
        deadline = time.perf_counter() + CATCH_UP_S
        while converting and last not in seen and time.perf_counter() < deadline:
            await trio.sleep(0.05)
        cpu = meter.stop()
        done.set()
    after = await scrape(base)
    await writer.close()
    delays = [seen[v] - at for v, at in writer.acked_at.items() if v in seen]
    conversions = after["coordinator_uniform_conversions_total"] - before["coordinator_uniform_conversions_total"]
    commits = len(writer.acked_at)
    return {"conversion": "on" if converting else "off", "rate": rate, "commits": commits, "commits_per_s": round(commits / elapsed, 1),
            "commit_p50_ms": round(pct(latencies, 50) * 1000, 2), "commit_p99_ms": round(pct(latencies, 99) * 1000, 2),
            "delay_p50_ms": round(pct(delays, 50) * 1000, 1), "delay_p99_ms": round(pct(delays, 99) * 1000, 1),
            "not_shown": commits - len(delays) if converting else None, "conversions": int(conversions),
            "commits_per_conversion": round(commits / conversions, 2) if conversions else None,
            "server_cpu_pct": round(100 * cpu.server_s / elapsed, 1),
            "workers_cpu_ms_per_commit": round(1000 * cpu.workers_s / max(commits, 1), 3),
            "errors": stats.errors}


async def _shown(base: str, schema: str, version: int) -> bool:
    conn = HttpConnection(base)
    try:
        status, body = await conn.request("GET", MOUNT.format(schema=schema, table="t0"))
    finally:
        await conn.close()
    return status == 200 and int(orjson.loads(body)["metadata"]["properties"].get("delta-version", -1)) >= version


COLUMNS = (("conversion", "conversion"), ("rate", "commits/s offered"), ("commits_per_s", "commits/s"), ("commit_p50_ms", "commit p50 ms"),
           ("commit_p99_ms", "commit p99 ms"), ("delay_p50_ms", "delay to Iceberg p50 ms"),
           ("delay_p99_ms", "delay p99 ms"), ("conversions", "conversions"),
           ("commits_per_conversion", "commits/conversion"), ("server_cpu_pct", "service CPU % (with the polls)"),
           ("workers_cpu_ms_per_commit", "workers CPU ms/commit"), ("not_shown", "not shown"), ("errors", "errors"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="10,100", help="commits/s to the one table, comma-separated")
    ap.add_argument("--duration", type=float, default=20, help="seconds per rate")
    ap.add_argument("--poll-ms", type=float, default=10, help="how often the reader looks at the Iceberg side")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="uniform-bench-"))
    tmp.chmod(0o755)
    pg = None
    services: dict[bool, tuple[procs.Child, str]] = {}
    rows = []
    try:
        print("starting PostgreSQL ...", flush=True)
        pg = EmbeddedPostgres(tmp / "pg")
        pg.start()
        for converting in (False, True):
            # Two services side by side on one PostgreSQL (a database each): one converts, one does not.
            name = "on" if converting else "off"
            pg._psql("-c", f"CREATE DATABASE uniform_{name}")
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            print(f"starting the service with conversion {name} ...", flush=True)
            child = procs.service(port, pg.dsn_for(f"uniform_{name}"),
                                  tmp / name, tmp / f"{name}.log",
                                  env={"COORDINATOR_UNIFORM_WORKERS": "1" if converting else "0"})
            services[converting] = (child.start(base + "/readyz"), base)
        for i, rate in enumerate(float(r) for r in args.rates.split(",")):
            for converting, (child, base) in services.items():
                print(f"committing at {rate:g}/s to one table for {args.duration:g} s, conversion "
                      f"{'on' if converting else 'off'} ...", flush=True)
                row = trio.run(measure, base, child.pid, rate, args.duration, args.poll_ms / 1000, f"u{i}",
                               converting)
                print(f"  -> {row}", flush=True)
                rows.append(row)
    finally:
        for child, _ in services.values():
            child.stop()
        if pg is not None:
            pg.destroy()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\none Delta table (UniForm on) per rate and service, one writer, {args.duration:g} s each; the services "
          f"side by side, one converting, one not (the same flow); delay measured by polling every "
          f"{args.poll_ms:g} ms\n")
    print("| " + " | ".join(label for _, label in COLUMNS) + " |")
    print("|" + "|".join("---:" for _ in COLUMNS) + "|")
    for r in rows:
        print("| " + " | ".join("" if r[k] is None else f"{r[k]:g}" if isinstance(r[k], float) else str(r[k])
                                for k, _ in COLUMNS) + " |")
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
