"""Driving writers: closed loop (each writer commits again as soon as it is answered: the peak) and open loop
(commits arrive on a Poisson schedule at a fixed offered rate, latency measured from the scheduled time so a
slow server cannot hide its queueing: no coordinated omission)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from .flows import Flow, Stats, Writer
from .http import HttpConnection
from .procs import CpuMeter

START_CONCURRENCY = 64


def pct(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


async def scrape(base: str | list[str] | None) -> dict[str, float]:
    """The service's group-commit counters (and its count of conversions to Iceberg) from /metrics (empty for
    servers that have none); summed over the members when given several (a cluster)."""
    if base is None:
        return {}
    if isinstance(base, list):
        out: dict[str, float] = {}
        for b in base:
            for name, value in (await scrape(b)).items():
                out[name] = out.get(name, 0.0) + value
        return out
    conn = HttpConnection(base)
    try:
        status, body = await conn.request("GET", "/metrics")
    finally:
        await conn.close()
    out: dict[str, float] = {}
    if status != 200:
        return out
    for line in body.decode().splitlines():
        if line.startswith(("coordinator_db_flushes_total ", "coordinator_db_groups_total ",
                            "coordinator_file_write_cpu_seconds_total ", "coordinator_uniform_conversions_total ")):
            name, value = line.split()
            out[name] = float(value)
    return out


@dataclass
class RunResult:
    protocol: str
    scenario: str
    tables: int
    writers_per_table: int
    duration_s: float
    commits: int
    writes: int
    requests: int
    conflicts: int
    errors: int
    gave_up: int                      # logical commits abandoned after the client's last retry
    commits_per_s: float
    p50_ms: float
    p99_ms: float
    commit_request_p50_ms: float      # one commit request (a 409 included), not the logical commit's retries
    commit_request_p99_ms: float
    server_cpu_ms_per_request: float | None
    server_cpu_ms_per_commit: float | None
    server_cpu_pct: float | None
    pg_cpu_ms_per_commit: float | None
    loadgen_cpu_pct: float
    file_write_cpu_ms_per_commit: float | None = None   # of the server CPU: making table files durable
    db_transactions: float | None = None
    writes_per_db_txn: float | None = None
    actor_batches_per_db_txn: float | None = None
    offered_per_s: float | None = None
    late: int = 0                 # open loop: commits due in the window that could not even start in it
    error_samples: list[str] = field(default_factory=list)
    # The service's child processes (its UniForm conversion workers), not in server_cpu_*: work off the commit path.
    workers_cpu_ms_per_commit: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _start_all(writers: list[Writer]) -> None:
    limiter = trio.CapacityLimiter(START_CONCURRENCY)

    async def start(w: Writer) -> None:
        async with limiter:
            await w.start()

    async with trio.open_nursery() as n:
        for w in writers:
            n.start_soon(start, w)


async def run(flow: Flow, base: str | list[str], tables: list[Any], writers_per_table: int, duration_s: float, *,
              meter: CpuMeter, metrics_base: str | list[str] | None, scenario: str, rate_per_s: float | None = None,
              on_start: Callable[[], None] | None = None, retry: str = "client") -> RunResult:
    """All writers connect and read their table first; then the measured window of `duration_s` starts. With
    several base URLs (cluster members), writers are spread over them round-robin, as a load balancer would.
    `retry`: how writers wait after a 409 (loadtest/retry.py)."""
    stats = Stats()
    bases = base if isinstance(base, list) else [base]
    writers = [flow.writer(bases[i % len(bases)], t, stats)
               for i, t in enumerate(t for t in tables for _ in range(writers_per_table))]
    for w in writers:
        w.retry_mode = retry
    try:
        await _start_all(writers)
        # Only the window counts: forget the start-up reads.
        stats.requests = stats.conflicts = stats.errors = stats.writes = stats.gave_up = 0
        stats.commit_request_latencies_s.clear()
        before = await scrape(metrics_base)
        meter.start()
        if on_start is not None:
            on_start()
        t0 = time.perf_counter()
        deadline = t0 + duration_s

        async def closed(w: Writer) -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                if await w.commit(deadline):
                    stats.commits += 1
                    stats.latencies_s.append(time.perf_counter() - started)

        async def opened(w: Writer, rate_w: float) -> None:
            rng = random.Random()
            due = t0 + rng.expovariate(rate_w)
            while due < deadline:
                now = time.perf_counter()
                if now >= deadline:
                    # Overloaded: commits due but never started are counted, not silently dropped.
                    while due < deadline:
                        stats.late += 1
                        due += rng.expovariate(rate_w)
                    break
                if due > now:
                    await trio.sleep(due - now)
                # A commit already late still counts from when it was due: that is what its user waits.
                if await w.commit(deadline + 10):
                    stats.commits += 1
                    stats.latencies_s.append(time.perf_counter() - due)
                due += rng.expovariate(rate_w)

        async with trio.open_nursery() as n:
            for w in writers:
                if rate_per_s is None:
                    n.start_soon(closed, w)
                else:
                    n.start_soon(opened, w, rate_per_s / len(writers))
        cpu = meter.stop()
        after = await scrape(metrics_base)
    finally:
        with trio.CancelScope(shield=True):
            for w in writers:
                await w.close()
    elapsed = cpu.wall_s
    flushes = groups = file_write_s = None
    if before and after:
        flushes = after["coordinator_db_flushes_total"] - before["coordinator_db_flushes_total"]
        groups = after["coordinator_db_groups_total"] - before["coordinator_db_groups_total"]
        name = "coordinator_file_write_cpu_seconds_total"
        file_write_s = after[name] - before[name] if name in after and name in before else None
    server = meter.server_pid is not None
    return RunResult(
        protocol=flow.name, scenario=scenario, tables=len(tables), writers_per_table=writers_per_table,
        duration_s=round(elapsed, 2), commits=stats.commits, writes=stats.writes, requests=stats.requests,
        conflicts=stats.conflicts, errors=stats.errors, gave_up=stats.gave_up,
        commits_per_s=round(stats.commits / elapsed, 1),
        p50_ms=round(pct(stats.latencies_s, 50) * 1000, 2), p99_ms=round(pct(stats.latencies_s, 99) * 1000, 2),
        commit_request_p50_ms=round(pct(stats.commit_request_latencies_s, 50) * 1000, 2),
        commit_request_p99_ms=round(pct(stats.commit_request_latencies_s, 99) * 1000, 2),
        server_cpu_ms_per_request=round(1000 * cpu.server_s / max(stats.requests, 1), 3) if server else None,
        server_cpu_ms_per_commit=round(1000 * cpu.server_s / max(stats.commits, 1), 3) if server else None,
        server_cpu_pct=round(100 * cpu.server_s / elapsed, 1) if server else None,
        pg_cpu_ms_per_commit=round(1000 * cpu.pg_s / max(stats.commits, 1), 3) if meter.pg_pid else None,
        loadgen_cpu_pct=round(100 * cpu.loadgen_s / elapsed, 1),
        file_write_cpu_ms_per_commit=(round(1000 * file_write_s / max(stats.commits, 1), 3)
                                      if file_write_s is not None else None),
        db_transactions=flushes,
        writes_per_db_txn=round(stats.writes / flushes, 2) if flushes else None,
        actor_batches_per_db_txn=round(groups / flushes, 2) if flushes else None,
        offered_per_s=rate_per_s, late=stats.late, error_samples=stats.error_samples,
        workers_cpu_ms_per_commit=round(1000 * cpu.workers_s / max(stats.commits, 1), 3) if server else None)


async def hammer(base: str | list[str], requests: list[tuple[str, Any]], connections: int, duration_s: float,
                 meter: CpuMeter, rate_per_s: float | None = None,
                 on_start: Callable[[], None] | None = None) -> dict[str, float]:
    """The same request over and over on `connections` keep-alive connections (for the bare app), spread
    round-robin over the bases when there are several and over `requests` (path, body), one per table, as the
    flows' writers are over their tables: as fast as answered, or with `rate_per_s`, on the open loop's Poisson
    schedule (as `run` offers commits)."""
    import orjson
    encoded = [(path, orjson.dumps(body)) for path, body in requests]
    count = 0
    bad = 0
    latencies: list[float] = []
    bases = base if isinstance(base, list) else [base]
    conns = [HttpConnection(bases[i % len(bases)]) for i in range(connections)]
    try:
        for conn in conns:   # connected before the window, as the commit flows' writers are
            await conn.connect()
        meter.start()
        if on_start is not None:
            on_start()
        t0 = time.perf_counter()
        deadline = t0 + duration_s

        async def send(conn: HttpConnection, path: str, data: bytes) -> None:
            nonlocal count, bad
            t = time.perf_counter()
            status, _ = await conn.request("POST", path, data)
            latencies.append(time.perf_counter() - t)
            count += 1
            bad += status != 200

        async def loop(conn: HttpConnection, path: str, data: bytes) -> None:
            if rate_per_s is None:
                while time.perf_counter() < deadline:
                    await send(conn, path, data)
                return
            rng = random.Random()
            due = t0 + rng.expovariate(rate_per_s / connections)
            while due < deadline:
                await trio.sleep(max(0.0, due - time.perf_counter()))
                await send(conn, path, data)
                due += rng.expovariate(rate_per_s / connections)

        async with trio.open_nursery() as n:
            for i, conn in enumerate(conns):
                n.start_soon(loop, conn, *encoded[i % len(encoded)])
        cpu = meter.stop()
    finally:
        with trio.CancelScope(shield=True):
            for conn in conns:
                await conn.close()
    if bad:
        raise SystemExit(f"the bare app answered {bad} of {count} requests to {encoded[0][0]} with an error; "
                         f"see its log")
    return {"requests": count, "requests_per_s": round(count / cpu.wall_s, 1),
            "server_cpu_ms_per_request": round(1000 * cpu.server_s / max(count, 1), 4),
            "server_cpu_pct": round(100 * cpu.server_s / cpu.wall_s, 1),
            "loadgen_cpu_pct": round(100 * cpu.loadgen_s / cpu.wall_s, 1),
            "p50_ms": round(pct(latencies, 50) * 1000, 2), "p99_ms": round(pct(latencies, 99) * 1000, 2)}
