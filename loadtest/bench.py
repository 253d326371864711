"""The benchmark: one command, its own PostgreSQL and service, a fixed matrix, ONE table of figures.

    python -m loadtest.bench                     # the full matrix (about 10 minutes on 2 cores)
    python -m loadtest.bench --profile           # ... and each format's CPU per commit by stage (py-spy)
    python -m loadtest.bench --smoke             # ~30 s, tiny matrix: checks that everything runs (CI)
    python -m loadtest.bench --only matrix,rss   # some sections only (see --help)

Everything runs in the same session on the same machine, so the figures compare as ratios even on a noisy
shared one: the stack's own limit (a bare quart-trio app parsing the same bodies; PostgreSQL's durable commit
rate), our commits/s and latency per protocol for 1 table x 8 writers, 64 x 2 and 1,000 x 1, latency against
offered load, Iceberg commit cost against the table's snapshot count, the baselines a user would pick instead
(pyiceberg SqlCatalog on the same PostgreSQL, lance's RestAdapter), and RSS with 100,000 tables known and 1,000
active. The last rows compare the ratios with the targets of issue 6.

The load generator is this process: trio with raw HTTP/1.1 keep-alive connections, ~20x cheaper per request
than httpx. Its own CPU is in every row ("loadgen CPU %", of one core); near 100% it would be the bottleneck.
Outputs: the table on stdout, and in --out: results.json (rows and every raw figure), latency_vs_load.png,
the service logs and, with --profile, the stage tables (stages.md) and the raw py-spy files.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import os
import platform
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import trio

from storage.embedded import EmbeddedPostgres, free_port

from . import baselines, procs, pyspy, stages
from .flows import FLOWS, ICEBERG_SCHEMA, IcebergFlow, TakingTurns, iceberg_commit_body, iceberg_state, parallel
from .http import HttpConnection
from .report import Report, Row, plot_latency_vs_load
from .retry import MODES
from .runner import RunResult, hammer, run

SECTIONS = ("limits", "matrix", "openloop", "profile", "snapshots", "baselines", "rss")
PROTOCOLS = ("iceberg", "delta", "lance")
LOADGEN_BUSY_PCT = 85   # above this the load generator may be what limits a run
STAGE_RATE = 250        # commits/s offered in the stage breakdown's moderate load (issue 34)


@dataclass
class Plan:
    matrix: list[tuple[int, int]]
    duration_s: float
    open_config: tuple[int, int]
    open_fractions: list[float]
    open_duration_s: float
    bare_connections: int
    bare_duration_s: float
    pg_duration_s: float
    pg_connections: int
    snapshots: list[int]
    snapshot_batch: int
    snapshot_duration_s: float
    sql_writers: int
    sql_duration_s: float
    adapter_matrix: list[tuple[int, int]]
    adapter_duration_s: float
    rss_known: int
    rss_warm: int
    rss_active: int
    ratio_config: tuple[int, int] = (64, 1)   # conflict-free, as many connections as the bare app: the CPU ratio
    profile_s: int = 12


FULL = Plan(matrix=[(1, 8), (64, 2), (1000, 1)], duration_s=10, open_config=(64, 2),
            open_fractions=[0.1, 0.25, 0.5, 0.75, 0.9], open_duration_s=8, bare_connections=64, bare_duration_s=5,
            pg_duration_s=3, pg_connections=16, snapshots=[10, 1000, 10000], snapshot_batch=500,
            snapshot_duration_s=8, sql_writers=8, sql_duration_s=10, adapter_matrix=[(1, 8), (64, 2)],
            adapter_duration_s=10, rss_known=100_000, rss_warm=100, rss_active=1000)

SMOKE = Plan(matrix=[(1, 2), (4, 1)], duration_s=0.8, open_config=(4, 1), open_fractions=[0.5], open_duration_s=0.8,
             bare_connections=4, bare_duration_s=0.5, pg_duration_s=0.3, pg_connections=4, snapshots=[10, 100],
             snapshot_batch=50, snapshot_duration_s=0.6, sql_writers=2, sql_duration_s=1.0, adapter_matrix=[(1, 2)],
             adapter_duration_s=0.8, rss_known=1000, rss_warm=10, rss_active=50, ratio_config=(4, 1), profile_s=3)


# One writer's commits per second on a small table here, rounded up: how fast a table committed to would grow.
SNAPSHOT_NOMINAL_RATE = 400


def snapshot_turns(n: int, duration_s: float) -> int:
    """How many n-snapshot tables one writer takes turns on, so that each grows by at most ~10% (at least 50)."""
    return max(1, min(64, -(-int(SNAPSHOT_NOMINAL_RATE * duration_s) // max(n // 10, 50))))


def label(cfg: tuple[int, int]) -> str:
    return f"{cfg[0]}x{cfg[1]}"


class Bench:
    def __init__(self, plan: Plan, out: Path, sections: set[str], profile: bool, smoke: bool, retry: str = "client"):
        self.plan, self.out, self.sections, self.profile, self.smoke = plan, out, sections, profile, smoke
        self.retry = retry  # how every client, ours and the baselines', waits after a 409 (retry.py)
        self.t0 = time.monotonic()
        self.tmp = Path(tempfile.mkdtemp(prefix="coordinator-bench-"))
        self.tmp.chmod(0o755)  # as root, PostgreSQL runs as another OS user that must reach its directory
        self.logs = out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.report = Report(f"coordinator benchmark{' (smoke)' if smoke else ''}")
        self.raw = self.report.raw
        self.pg: EmbeddedPostgres | None = None
        self.dsn = ""
        self.pg_pid: int | None = None
        self.service: procs.Child | None = None
        self.base = ""
        self.children: list[procs.Child] = []
        self.profile_text: str | None = None
        self.adapter: tuple[procs.Child, int] | None = None

    # -- plumbing ----------------------------------------------------------------------------------------------

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)

    def dsn_for(self, database: str) -> str:
        return self.dsn.rsplit("/", 1)[0] + "/" + database

    def create_database(self, name: str) -> str:
        import asyncpg

        async def go() -> None:
            con = await asyncpg.connect(self.dsn_for("postgres"))
            try:
                await con.execute(f"DROP DATABASE IF EXISTS {name}")
                await con.execute(f"CREATE DATABASE {name}")
            finally:
                await con.close()
        asyncio.run(go())
        return self.dsn_for(name)

    def start_child(self, child: procs.Child, ready_url: str) -> procs.Child:
        if child not in self.children:
            self.children.append(child)
        return child.start(ready_url)

    def stop_child(self, child: procs.Child | None) -> None:
        if child is not None:
            t = time.monotonic()
            child.stop()
            if time.monotonic() - t > 3:
                self.say(f"stopping {child.name} took {time.monotonic() - t:.1f} s")
            if child in self.children:
                self.children.remove(child)

    def start_service(self, database_url: str, name: str,
                      env: dict[str, str] | None = None) -> tuple[procs.Child, str]:
        port = free_port()
        child = procs.service(port, database_url, self.tmp / name, self.logs / f"{name}.log", env=env)
        base = f"http://127.0.0.1:{port}"
        self.start_child(child, base + "/readyz")
        return child, base

    def meter(self, server_pid: int | None = None, pg: bool = True) -> procs.CpuMeter:
        return procs.CpuMeter(server_pid if server_pid is not None else self.service.pid,
                              self.pg_pid if pg else None)

    def tag(self, what: str) -> str:
        return f"{what}_{uuid.uuid4().hex[:6]}"

    def run_flow(self, proto: str, cfg: tuple[int, int], duration_s: float, scenario: str, *,
                 base: str | None = None, server_pid: int | None = None, metrics: bool = True,
                 rate: float | None = None, on_start: Callable[[], None] | None = None) -> RunResult:
        flow = FLOWS[proto]
        base = base or self.base

        async def go() -> RunResult:
            tables = await flow.prepare(base, cfg[0], self.tag(f"{proto}_{scenario.replace(' ', '_')}"))
            return await run(flow, base, tables, cfg[1], duration_s, meter=self.meter(server_pid, pg=metrics),
                             metrics_base=base if metrics else None, scenario=scenario, rate_per_s=rate,
                             on_start=on_start, retry=self.retry)
        return trio.run(go)

    def matrix_row(self, section: str, scenario: str, r: RunResult) -> Row:
        notes = [f"{r.commits} commits", f"{r.conflicts} conflicts"]
        if r.gave_up:
            notes.append(f"{r.gave_up} given up after the client's last retry")
        if r.errors:
            notes.append(f"{r.errors} errors (e.g. {r.error_samples[0][:80]})")
        if r.writes_per_db_txn is not None:
            notes.append(f"{r.writes_per_db_txn} writes/DB txn ({r.actor_batches_per_db_txn} actor batches/txn)")
        if r.pg_cpu_ms_per_commit is not None:
            notes.append(f"PG {r.pg_cpu_ms_per_commit} ms CPU/commit")
        if r.server_cpu_pct is not None:
            notes.append(f"server {r.server_cpu_pct}% CPU, {r.server_cpu_ms_per_request} ms/request")
        if r.loadgen_cpu_pct > LOADGEN_BUSY_PCT:
            notes.append("LOADGEN BUSY: figures may be limited by the load generator")
        return self.report.add(Row(section, scenario, f"{r.commits_per_s:.0f} commits/s", r.p50_ms, r.p99_ms,
                                   r.server_cpu_ms_per_commit, r.loadgen_cpu_pct, "; ".join(notes)))

    # -- sections ----------------------------------------------------------------------------------------------

    def limits(self) -> None:
        p = self.plan
        self.say(f"PostgreSQL durable commit rate (asyncpg, {p.pg_duration_s:g} s per case) ...")
        rows = baselines.pg_group_commit(self.create_database("loadtest_pg"), p.pg_duration_s, p.pg_connections)
        self.raw["postgres_commit_rate"] = rows
        for r in rows:
            self.report.add(Row("stack limit: PostgreSQL", r["scenario"], f"{r['txn_per_s']:.0f} txn/s", notes=(
                f"{r['rows_per_s']:.0f} rows/s; {r['ms_per_txn']} ms per txn per connection; "
                f"fsync={r['fsync']}, synchronous_commit={r['synchronous_commit']}")))
        port = free_port()
        bare = self.start_child(procs.bare_app(port, self.logs / "bare.log"), f"http://127.0.0.1:{port}/healthz")
        self.raw["bare"] = {}
        try:
            for proto in PROTOCOLS:
                path, body = FLOWS[proto].sample_request()
                self.say(f"bare quart-trio app: {proto} commit body, {p.bare_connections} connections, "
                         f"{p.bare_duration_s:g} s ...")
                r = trio.run(hammer, f"http://127.0.0.1:{port}", [(path, body)], p.bare_connections, p.bare_duration_s,
                             procs.CpuMeter(bare.pid, None))
                r["body_bytes"] = len(orjson.dumps(body))
                self.raw["bare"][proto] = r
                self.report.add(Row("stack limit: bare quart-trio", f"{proto} commit body ({r['body_bytes']} B), "
                                    f"{p.bare_connections} conns", f"{r['requests_per_s']:.0f} req/s", r["p50_ms"],
                                    r["p99_ms"], r["server_cpu_ms_per_request"], r["loadgen_cpu_pct"],
                                    f"server {r['server_cpu_pct']}% CPU; parse JSON, answer {{}}"))
        finally:
            self.stop_child(bare)

    def matrix(self) -> None:
        self.raw["matrix"] = {}
        for proto in PROTOCOLS:
            self.raw["matrix"][proto] = {}
            for cfg in self.plan.matrix:
                self.say(f"{proto}: {cfg[0]} tables x {cfg[1]} writers, {self.plan.duration_s:g} s ...")
                r = self.run_flow(proto, cfg, self.plan.duration_s, label(cfg))
                self.raw["matrix"][proto][label(cfg)] = r.as_dict()
                self.matrix_row(f"ours: {proto}", f"{label(cfg)} closed loop", r)
            cfg = self.plan.ratio_config
            if cfg not in self.plan.matrix:
                self.say(f"{proto}: {cfg[0]} tables x {cfg[1]} writer (no conflicts, for the CPU ratio), "
                         f"{self.plan.duration_s:g} s ...")
                r = self.run_flow(proto, cfg, self.plan.duration_s, label(cfg))
                self.raw["matrix"][proto][label(cfg)] = r.as_dict()
                self.matrix_row(f"ours: {proto}", f"{label(cfg)} closed loop (no conflicts)", r)

    def peak(self, proto: str, cfg: tuple[int, int]) -> float:
        """Closed-loop commits/s at `cfg`: from the matrix run, else measured now."""
        peak = self.raw.get("matrix", {}).get(proto, {}).get(label(cfg), {}).get("commits_per_s")
        if not peak:
            self.say(f"{proto}: measuring the {label(cfg)} peak for the open-loop run ...")
            peak = self.run_flow(proto, cfg, self.plan.duration_s, label(cfg)).commits_per_s
        return peak

    def openloop(self) -> None:
        cfg = self.plan.open_config
        self.raw["openloop"] = {}
        for proto in PROTOCOLS:
            peak = self.peak(proto, cfg)
            points = [self.open_point(proto, cfg, frac, peak) for frac in self.plan.open_fractions]
            self.raw["openloop"][proto] = {"peak_commits_per_s": peak, "points": points}
        self.openloop_free()

    def openloop_free(self) -> None:
        """Half of peak once more without conflicts (one writer per table): the 64x2 runs above also carry the
        409s, reloads and retries of two writers racing on each table, which add load whatever the server does;
        this is the latency of group commit alone."""
        cfg = self.plan.ratio_config
        if cfg == self.plan.open_config:
            return  # --smoke: the runs above had one writer per table already
        self.raw["openloop_free"] = {}
        for proto in PROTOCOLS:
            peak = self.peak(proto, cfg)
            self.raw["openloop_free"][proto] = {"peak_commits_per_s": peak, **self.open_point(proto, cfg, 0.5, peak)}

    def open_point(self, proto: str, cfg: tuple[int, int], frac: float, peak: float) -> dict[str, Any]:
        """One open-loop run at `frac` of the closed-loop `peak`: its report row, and its figures."""
        rate = max(1.0, frac * peak)
        self.say(f"{proto}: open loop {label(cfg)} at {rate:.0f} commits/s ({frac:.0%} of peak {peak:.0f}) ...")
        r = self.run_flow(proto, cfg, self.plan.open_duration_s, f"{label(cfg)} open {frac:.0%}", rate=rate)
        conflicts = f"{r.conflicts} conflicts" if cfg[1] > 1 else "no conflicts"
        self.report.add(Row(f"ours: {proto} vs offered load", f"{label(cfg)} @ {frac:.0%} of peak ({rate:.0f}/s offered)",
                            f"{r.commits_per_s:.0f} commits/s", r.p50_ms, r.p99_ms, r.server_cpu_ms_per_commit,
                            r.loadgen_cpu_pct, f"{conflicts}; latency from the scheduled time; one commit request "
                                               f"p50/p99 {r.commit_request_p50_ms}/{r.commit_request_p99_ms} ms; "
                                               f"{r.writes_per_db_txn} writes/DB txn"
                                               + (f"; {r.late} due but not started (overload)" if r.late else "")))
        return {**r.as_dict(), "fraction_of_peak": frac}

    def run_profile(self) -> None:
        """Where a commit's CPU goes, by stage (loadtest/stages.py), for each format at 64 x 1: at STAGE_RATE
        commits/s offered and closed loop (the peak), each run after the bare app's at the same load (the same
        request on as many connections, at the same rate or closed loop), all recorded by py-spy."""
        cfg = self.plan.ratio_config
        seconds = self.plan.profile_s
        port = free_port()
        bare = self.start_child(procs.bare_app(port, self.logs / "bare-stages.log"), f"http://127.0.0.1:{port}/healthz")
        tables: list[str] = []
        self.raw["stages"] = {}
        try:
            for proto in PROTOCOLS:
                columns: dict[str, stages.Breakdown] = {}
                for rate in (STAGE_RATE, None):
                    load = f"{rate}/s" if rate else "peak"
                    path, body = FLOWS[proto].sample_request()
                    self.say(f"{proto}: bare app then service, {label(cfg)} {load}, under py-spy for {seconds} s ...")
                    recording: list[stages.Recording] = []
                    raw = self.out / f"pyspy-bare-{proto}-{load.replace('/', '')}.txt"

                    def start(pid: int, raw: Path, recording=recording) -> None:
                        recording.append(stages.Recording(pid, seconds, raw))
                    b = trio.run(hammer, f"http://127.0.0.1:{port}", [(path, body)], cfg[0] * cfg[1], seconds,
                                 procs.CpuMeter(bare.pid, None), rate, lambda: start(bare.pid, raw))
                    columns[f"bare {load}"] = recording.pop().finish(b["requests"])
                    raw = self.out / f"pyspy-{proto}-{load.replace('/', '')}.txt"
                    r = self.run_flow(proto, cfg, seconds, f"{label(cfg)} {rate or 'peak'} profiled", rate=rate,
                                      on_start=lambda: start(self.service.pid, raw))
                    columns[f"{load} ({r.commits_per_s:.0f} commits/s)"] = recording.pop().finish(r.commits)
                    self.raw["stages"][f"{proto} {load}"] = {"run": r.as_dict(), "bare": b, "raw_file": str(raw)}
                    if proto == "iceberg" and rate is None:
                        summary = pyspy.summarize(raw)
                        (self.out / "pyspy-iceberg-commit.md").write_text(pyspy.format_summary(
                            summary, seconds, title=f"service during Iceberg {label(cfg)} commit load "
                                                    f"({r.commits_per_s:.0f} commits/s)") + "\n")
                tables.append(f"### {proto}: server CPU ms per commit (bare app: per request) by stage, "
                              f"{label(cfg)}\n\n{stages.table(columns)}\n\nWhat each stage's samples were doing "
                              f"(peak):\n\n{stages.top_functions(list(columns.values())[-1])}")
        except FileNotFoundError as exc:   # no py-spy
            self.report.add(Row("profile", "py-spy", notes=f"skipped: {exc}"))
        finally:
            self.stop_child(bare)
        self.profile_text = "\n\n".join(tables) or None
        if self.profile_text:
            (self.out / "stages.md").write_text(self.profile_text + "\n")

    def snapshots(self) -> None:
        """Commit cost against the table's size. One writer commits to `turns` tables of n snapshots in turn, so
        that each stays near n: one table committed to for seconds would grow by thousands (a 10-snapshot
        table by ~3,000 in 8 s, which made the smallest table's commits look dearer than they are)."""
        p = self.plan
        self.raw["snapshots"] = {}
        for n in p.snapshots:
            turns = snapshot_turns(n, p.snapshot_duration_s)
            self.say(f"iceberg: building {turns} table(s) with {n} snapshots ({p.snapshot_batch} per request) ...")

            async def build(conn: HttpConnection, table, n: int = n) -> int:
                status, body = await conn.request("GET", table.path)
                parent, seq = iceberg_state(body)
                rng = random.Random()
                done = 0
                while done < n:
                    k = min(p.snapshot_batch, n - done)
                    updates = []
                    for _ in range(k):
                        new_id = rng.getrandbits(62)
                        pair = iceberg_commit_body(parent, new_id, seq + 1)["updates"]
                        updates += pair
                        parent, seq = new_id, seq + 1
                    first_parent = updates[0]["snapshot"].get("parent-snapshot-id")
                    req = {"requirements": [{"type": "assert-ref-snapshot-id", "ref": "main",
                                             "snapshot-id": first_parent}], "updates": updates}
                    status, body = await conn.request("POST", table.path, req)
                    if status != 200:
                        raise SystemExit(f"building a {n}-snapshot table failed: HTTP {status} {body[:300]!r}")
                    done += k
                status, body = await conn.request("GET", table.path)
                return len(body)

            async def build_all(n: int = n, turns: int = turns):
                flow = TakingTurns(IcebergFlow())
                groups = await flow.prepare(self.base, turns, self.tag(f"snap{n}"))
                sizes = await parallel(self.base, list(groups[0]), build, concurrency=2)
                return groups, sizes[0]

            groups, meta_bytes = trio.run(build_all)
            # At the largest size also with an Idempotency-Key on every commit: its replay record must not copy the
            # answer (the whole metadata) into the database.
            for keyed in (False, True) if n == max(p.snapshots) else (False,):
                how = ", Idempotency-Key on each commit" if keyed else ""
                self.say(f"iceberg: committing to {turns} table(s) of {n} snapshots in turn, 1 writer{how}, "
                         f"{p.snapshot_duration_s:g} s ...")

                async def measure(groups=groups, n: int = n, keyed: bool = keyed):
                    return await run(TakingTurns(IcebergFlow(idempotency_keys=keyed)), self.base, groups, 1,
                                     p.snapshot_duration_s, meter=self.meter(), metrics_base=self.base,
                                     scenario=f"{n} snapshots")
                r = trio.run(measure)
                d = r.as_dict()
                d["metadata_response_bytes"] = meta_bytes
                d["tables_in_turn"] = turns
                d["snapshots_at_end"] = n + -(-r.commits // turns)
                self.raw["snapshots"][f"{n}+keys" if keyed else str(n)] = d
                self.report.add(Row("ours: iceberg vs table size", f"{n} snapshots, 1 writer{how}",
                                    f"{r.commits_per_s:.0f} commits/s", r.p50_ms, r.p99_ms,
                                    r.server_cpu_ms_per_commit, r.loadgen_cpu_pct,
                                    f"{turns} table(s) in turn, each {n} -> {d['snapshots_at_end']} snapshots; "
                                    f"loadTable response {meta_bytes / 1024:.0f} KiB; "
                                    f"of the server CPU, {r.file_write_cpu_ms_per_commit} ms/commit writing the "
                                    f"metadata file durably; PG {r.pg_cpu_ms_per_commit} ms CPU/commit"))

    def baselines_section(self) -> None:
        p = self.plan
        self.raw["baselines"] = {}
        missing = [m for m in ("sqlalchemy", "psycopg2", "pyiceberg") if importlib.util.find_spec(m) is None]
        hot = p.matrix[0]
        if missing:
            self.report.add(Row("baseline: pyiceberg SqlCatalog", f"hot table 1x{p.sql_writers}", notes=(
                f"skipped: {', '.join(missing)} not installed; pip install -e '.[loadtest]'")))
        else:
            self.say(f"baseline: pyiceberg SqlCatalog on the same PostgreSQL, 1 table x {p.sql_writers} writer "
                     f"processes, {p.sql_duration_s:g} s ...")
            uri = "postgresql+psycopg2://" + self.create_database("loadtest_sqlcatalog").split("://", 1)[1]
            warehouse = (self.tmp / "sqlcatalog-warehouse")
            warehouse.mkdir(exist_ok=True)
            r = baselines.sqlcatalog_hot_table(uri, warehouse.as_uri(), p.sql_writers, p.sql_duration_s, self.pg_pid,
                                               self.logs / "sqlcatalog.log", self.retry)
            self.raw["baselines"]["sqlcatalog"] = r
            self.report.add(Row("baseline: pyiceberg SqlCatalog", f"1x{p.sql_writers} (writer processes)",
                                f"{r['commits_per_s']:.0f} commits/s", r["p50_ms"], r["p99_ms"], None, None,
                                f"{r['commits']} commits, {r['conflicts']} conflicts, {r['gave_up']} given up, "
                                f"{r['errors']} errors; catalog "
                                f"work runs in the writers: {r['client_cpu_ms_per_commit']} ms CPU/commit there; "
                                f"PG {r['pg_cpu_ms_per_commit']} ms CPU/commit"))
            if hot != (1, p.sql_writers):
                self.say(f"iceberg: ours at 1x{p.sql_writers} for the SqlCatalog comparison ...")
                ours = self.run_flow("iceberg", (1, p.sql_writers), p.sql_duration_s, f"1x{p.sql_writers}")
                self.raw["baselines"]["ours_iceberg_same_config"] = ours.as_dict()
                self.matrix_row("ours: iceberg", f"1x{p.sql_writers} (vs SqlCatalog)", ours)

        if importlib.util.find_spec("lance") is None:
            self.report.add(Row("baseline: lance RestAdapter", "version/create",
                                notes="skipped: pylance not installed; pip install -e '.[loadtest]'"))
            return
        adapter, port = self.adapter or self.launch_adapter()
        self.start_child(adapter, f"http://127.0.0.1:{port}/v1/namespace/$/list")
        try:
            self.raw["baselines"]["lance_rest_adapter"] = {}
            for cfg in p.adapter_matrix:
                self.say(f"baseline: lance RestAdapter, {cfg[0]} tables x {cfg[1]} writers, "
                         f"{p.adapter_duration_s:g} s ...")
                r = self.run_flow("lance", cfg, p.adapter_duration_s, label(cfg), base=f"http://127.0.0.1:{port}",
                                  server_pid=adapter.pid, metrics=False)
                self.raw["baselines"]["lance_rest_adapter"][label(cfg)] = r.as_dict()
                self.matrix_row("baseline: lance RestAdapter", f"{label(cfg)} closed loop", r)
        finally:
            self.stop_child(adapter)

    def launch_adapter(self) -> tuple[procs.Child, int]:
        """Start lance's RestAdapter in its own process; importing lance takes seconds, so --smoke starts it
        first thing and lets the import overlap the other sections."""
        port = free_port()
        root = self.tmp / "lance-rest-root"
        root.mkdir(exist_ok=True)
        child = procs.Child("lance RestAdapter", [sys.executable, "-m", "loadtest.baselines", "lance-rest", "--root",
                                                  str(root), "--port", str(port)],
                            self.logs / "lance-rest-adapter.log", stop_signal=signal.SIGTERM)
        self.children.append(child)
        self.adapter = (child.launch(), port)
        return self.adapter

    def rss(self) -> None:
        p = self.plan
        dsn = self.create_database("loadtest_rss")
        svc, base = self.start_service(dsn, "service-rss")
        ns = "rss"

        async def template() -> bytes:
            conn = HttpConnection(base)
            try:
                await conn.request("POST", "/v1/namespaces", {"namespace": [ns]})
                await conn.request("POST", f"/v1/namespaces/{ns}/tables",
                                   {"name": "template", "schema": ICEBERG_SCHEMA})
                status, body = await conn.request("GET", f"/v1/namespaces/{ns}/tables/template")
                if status != 200:
                    raise SystemExit(f"loading the template table failed: HTTP {status} {body[:300]!r}")
                return body
            finally:
                await conn.close()
        meta = orjson.loads(trio.run(template))["metadata"]
        self.stop_child(svc)

        warehouse = self.tmp / "service-rss" / "warehouse" / ns
        self.say(f"memory: inserting {p.rss_known} known Iceberg tables (rows by SQL, metadata files on disk) ...")
        t = time.monotonic()
        asyncio.run(_insert_known_tables(dsn, ns, warehouse, meta, p.rss_known, self.say))
        self.say(f"memory: {p.rss_known} tables inserted in {time.monotonic() - t:.1f} s; restarting the service ...")

        # Idle actors end after 5 s here (10 s by default): long enough for every table loaded below to be alive
        # when "active" is measured, short enough for the dormant waves to be quick.
        svc, base = self.start_service(dsn, "service-rss", env={"COORDINATOR_ACTOR_IDLE_S": "5"})
        try:
            async def touch(paths: list[str]) -> None:
                async def get(c: HttpConnection, path: str) -> None:
                    status, body = await c.request("GET", path)
                    if status != 200:
                        raise SystemExit(f"GET {path} failed: HTTP {status} {body[:200]!r}")
                await parallel(base, paths, get)

            trio.run(touch, ["/v1/config", "/v1/namespaces", f"/v1/namespaces/{ns}/tables/template"])
            rss_known = procs.rss_bytes(svc.pid)

            async def list_all() -> int:
                conn = HttpConnection(base)
                count, token = 0, None
                try:
                    while True:
                        q = "?pageSize=1000" + (f"&pageToken={token}" if token else "")
                        _status, body = await conn.request("GET", f"/v1/namespaces/{ns}/tables{q}")
                        doc = orjson.loads(body)
                        count += len(doc.get("identifiers", []))
                        token = doc.get("next-page-token")
                        if not token:
                            return count
                finally:
                    await conn.close()
            self.say("memory: listing every table through the API ...")
            listed = trio.run(list_all)
            rss_listed = procs.rss_bytes(svc.pid)

            sample = random.Random(7).sample(range(p.rss_known), p.rss_active)
            paths = [f"/v1/namespaces/{ns}/tables/k{i}" for i in sample]
            self.say(f"memory: loading {p.rss_active} tables through the API (each becomes an actor) ...")
            trio.run(touch, paths[:p.rss_warm])
            rss_warm = procs.rss_bytes(svc.pid)
            t = time.monotonic()
            trio.run(touch, paths[p.rss_warm:])
            rss_active = procs.rss_bytes(svc.pid)
            self.say(f"memory: {p.rss_active - p.rss_warm} more tables loaded in {time.monotonic() - t:.1f} s")
            actors = _gauge(base, "coordinator_active_actors")

            # Dormant: tables used, then idle (actor ended, state kept compact). Loaded in waves, each left to go
            # dormant before the next, so the next wave's actors reuse the memory the last one's freed: the RSS
            # growth per table is then what an idle table keeps.
            self.say(f"memory: {p.rss_active} more tables in waves of {p.rss_warm}, each left to go dormant ...")
            fresh = [f"/v1/namespaces/{ns}/tables/k{i}" for i in
                     random.Random(8).sample(sorted(set(range(p.rss_known)) - set(sample)), p.rss_active)]
            _wait_dormant(base)
            rss_dormant_start = procs.rss_bytes(svc.pid)
            for i in range(0, len(fresh), p.rss_warm):
                trio.run(touch, fresh[i:i + p.rss_warm])
                _wait_dormant(base)
            rss_dormant = procs.rss_bytes(svc.pid)
            dormant = _gauge(base, "coordinator_dormant_tables")
        finally:
            self.stop_child(svc)
        per_dormant = (rss_dormant - rss_dormant_start) / max(len(fresh), 1)
        per_table = (rss_active - rss_warm) / max(p.rss_active - p.rss_warm, 1)
        self.raw["rss"] = {"known": p.rss_known, "listed": listed, "rss_known_bytes": rss_known,
                           "rss_after_listing_bytes": rss_listed, "warm": p.rss_warm, "rss_warm_bytes": rss_warm,
                           "active": p.rss_active, "rss_active_bytes": rss_active, "active_actors": actors,
                           "bytes_per_active_idle_table": per_table, "rss_dormant_start_bytes": rss_dormant_start,
                           "rss_dormant_bytes": rss_dormant, "dormant": dormant,
                           "bytes_per_dormant_table": per_dormant}
        mib = 1024 * 1024
        self.report.add(Row("memory (RSS)", f"{p.rss_known} known, none loaded", f"{rss_known / mib:.0f} MiB"))
        self.report.add(Row("memory (RSS)", f"{p.rss_known} known, all listed via API",
                            f"{rss_listed / mib:.0f} MiB", notes=f"{listed} tables listed"))
        self.report.add(Row("memory (RSS)", f"{p.rss_known} known, {p.rss_active} active",
                            f"{rss_active / mib:.0f} MiB", notes=f"{actors:.0f} actors alive (from /metrics)"
                            if actors is not None else ""))
        self.report.add(Row("memory (RSS)", "per loaded table (actor alive)", f"{per_table:.0f} B",
                            notes=f"(RSS at {p.rss_active} - RSS at {p.rss_warm} active) / {p.rss_active - p.rss_warm}"))
        self.report.add(Row("memory (RSS)", "per idle (dormant) table", f"{per_dormant:.0f} B",
                            notes=f"{len(fresh)} more tables loaded in waves of {p.rss_warm}, each gone dormant; "
                                  f"{dormant:.0f} dormant at the end (from /metrics)" if dormant is not None else ""))

    # -- targets -------------------------------------------------------------------------------------------------

    def targets(self) -> None:
        raw = self.raw
        rows: list[dict] = []

        def add(target: str, value: float | None, fmt: str, ok: bool | None, how: str) -> None:
            verdict = "n/a" if ok is None else ("OK" if ok else "MISS")
            rows.append({"target": target, "value": value, "verdict": verdict, "how": how})
            self.report.add(Row("targets (issue 6)", target, "" if value is None else fmt.format(value),
                                notes=f"{verdict}: {how}"))

        matrix = raw.get("matrix", {})
        bare = raw.get("bare", {})
        free_cfg = label(self.plan.ratio_config)
        for proto in PROTOCOLS:
            ours = matrix.get(proto, {}).get(free_cfg, {}).get("server_cpu_ms_per_request")
            base = bare.get(proto, {}).get("server_cpu_ms_per_request")
            if ours and base:
                x = ours / base
                add(f"{proto}: CPU per commit request <= 1.3x bare", x, "{:.1f}x", x <= 1.3,
                    f"server CPU {ours:.3f} ms/request ({free_cfg}, no conflicts) vs bare {base:.3f} ms "
                    f"({self.plan.bare_connections} conns)")
        for proto in PROTOCOLS:
            for cfg in self.plan.matrix:
                r = matrix.get(proto, {}).get(label(cfg))
                if not r or cfg[0] * cfg[1] < 64 and not self.smoke:
                    continue
                if self.smoke and cfg != self.plan.matrix[-1]:
                    continue
                v = r.get("writes_per_db_txn")
                add(f"{proto}: >= 10 commits per DB txn at {label(cfg)}", v, "{:.1f}", None if v is None else v >= 10,
                    f"{r['writes']} writes / {r['db_transactions']:.0f} DB transactions (coordinator_db_flushes_total)"
                    + ("; --smoke has fewer than 64 writers" if self.smoke else ""))
        for proto, ol in raw.get("openloop", {}).items():
            half = min(ol["points"], key=lambda d: abs(d["fraction_of_peak"] - 0.5), default=None)
            if half:
                # The commit's latency is that of one commit request (answered 200 or 409): what group commit
                # adds. A logical commit also waits for the client's reload and retry after each 409, which two
                # writers racing on a table cause whatever the server does; it is shown beside it.
                p99 = half["commit_request_p99_ms"]
                add(f"{proto}: p99 <= 25 ms at half of peak, {label(self.plan.open_config)}", p99, "{:.1f} ms",
                    p99 <= 25,
                    f"one commit request; offered {half['offered_per_s']:.0f}/s = {half['fraction_of_peak']:.0%} of "
                    f"peak {ol['peak_commits_per_s']:.0f}/s ({label(self.plan.open_config)}); per logical commit, "
                    f"409 retries included: p99 {half['p99_ms']:.1f} ms")
        for proto, r in raw.get("openloop_free", {}).items():
            p99 = r["commit_request_p99_ms"]
            add(f"{proto}: p99 <= 25 ms at half of peak, no conflicts", p99, "{:.1f} ms", p99 <= 25,
                f"one commit request; offered {r['offered_per_s']:.0f}/s = 50% of peak {r['peak_commits_per_s']:.0f}/s "
                f"({r['tables']}x{r['writers_per_table']}: group commit alone)")
        base = raw.get("baselines", {})
        sql = base.get("sqlcatalog")
        if sql:
            cfg = f"1x{self.plan.sql_writers}"
            ours = base.get("ours_iceberg_same_config") or matrix.get("iceberg", {}).get(cfg)
            if ours and sql["commits_per_s"]:
                x = ours["commits_per_s"] / sql["commits_per_s"]
                add("iceberg: >= 5x SqlCatalog commits/s on the hot table", x, "{:.1f}x", x >= 5,
                    f"{ours['commits_per_s']:.0f} vs {sql['commits_per_s']:.0f} commits/s at {cfg}")
        for cfg, adapter in base.get("lance_rest_adapter", {}).items():
            ours = matrix.get("lance", {}).get(cfg)
            if ours and adapter["commits_per_s"]:
                x = ours["commits_per_s"] / adapter["commits_per_s"]
                add(f"lance: >= 3x RestAdapter version/create/s at {cfg}", x, "{:.1f}x", x >= 3,
                    f"{ours['commits_per_s']:.0f} vs {adapter['commits_per_s']:.0f} commits/s")
        snaps = raw.get("snapshots", {})
        sizes = [k for k in snaps if k.isdigit()]
        if len(sizes) >= 2:
            lo, hi = min(sizes, key=int), max(sizes, key=int)
            a, b = snaps[lo]["server_cpu_ms_per_commit"], snaps[hi]["server_cpu_ms_per_commit"]
            x = b / a
            keyed = snaps.get(f"{hi}+keys")
            add(f"iceberg: commit cost at {hi} snapshots <= 1.5x at {lo}", x, "{:.1f}x", x <= 1.5,
                f"server CPU {b:.2f} vs {a:.2f} ms/commit; p50 {snaps[hi]['p50_ms']} vs {snaps[lo]['p50_ms']} ms"
                + (f"; with an Idempotency-Key on each commit {keyed['server_cpu_ms_per_commit']:.2f} ms/commit, "
                   f"PG {keyed['pg_cpu_ms_per_commit']} ms" if keyed else ""))
            fa, fb = snaps[lo].get("file_write_cpu_ms_per_commit"), snaps[hi].get("file_write_cpu_ms_per_commit")
            if fa is not None and fb is not None:
                # The words: "no O(metadata) work on the commit path beyond writing the file". The file
                # (MiBs at 10,000 snapshots) must be copied into the page cache and fsynced before the commit is
                # acknowledged; that CPU (FileIO.write_cpu_s) is shown apart from the rest.
                y = (b - fb) / (a - fa)
                add(f"iceberg: commit cost beyond writing the metadata file, {hi} vs {lo} snapshots <= 1.5x", y,
                    "{:.1f}x", y <= 1.5, f"server CPU less the file write: {b - fb:.2f} vs {a - fa:.2f} ms/commit; "
                    f"writing the file durably: {fb:.2f} vs {fa:.2f} ms/commit")
        rss = raw.get("rss")
        if rss:
            per = rss["bytes_per_active_idle_table"]
            idle = rss["bytes_per_dormant_table"]
            add("idle table <= 2 KiB", idle, "{:.0f} B", idle <= 2048,
                f"RSS growth per table used then idle (dormant: actor ended after actor_idle_s, state compact); "
                f"while its actor is alive a table costs {per:.0f} B")
            total = rss["rss_active_bytes"]
            add(f"{rss['known']} known tables <= 1 GiB RSS", total / 2**20, "{:.0f} MiB", total <= 2**30,
                f"with {rss['active']} active; all {rss['known']} used and now idle would be about "
                f"{(rss['rss_warm_bytes'] + idle * (rss['known'] - rss['warm'])) / 2**20:.0f} MiB")
        self.raw["targets"] = rows

    # -- the whole run -------------------------------------------------------------------------------------------

    def machine(self) -> dict[str, Any]:
        cpu = ""
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
        return {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "cpu": cpu,
                "cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                "smoke": self.smoke, "retry": self.retry}

    def execute(self) -> int:
        self.raw["machine"] = self.machine()
        self.raw["plan"] = self.plan.__dict__
        self.say(f"starting PostgreSQL in {self.tmp} ...")
        self.pg = EmbeddedPostgres(self.tmp / "pg")
        self.dsn = self.pg.start()
        self.pg_pid = procs.postmaster_pid(self.pg.pgdata)
        failed: list[str] = []
        try:
            if self.smoke and "baselines" in self.sections and importlib.util.find_spec("lance") is not None:
                self.launch_adapter()
            if "limits" in self.sections:
                self.limits()
            if self.sections & {"matrix", "openloop", "profile", "snapshots", "baselines"}:
                self.say("starting the service ...")
                self.service, self.base = self.start_service(self.dsn, "service")
            for name, fn in (("matrix", self.matrix), ("openloop", self.openloop),
                             ("profile", self.run_profile if self.profile else None),
                             ("snapshots", self.snapshots), ("baselines", self.baselines_section)):
                if name in self.sections and fn is not None:
                    fn()
            self.stop_child(self.service)
            self.service = None
            if "rss" in self.sections:
                self.rss()
        except KeyboardInterrupt:
            failed.append("interrupted")
        except Exception as exc:  # noqa: BLE001 - print the table of what was measured, then fail
            traceback.print_exc()
            failed.append(f"{type(exc).__name__}: {exc}")
        finally:
            for child in list(self.children):
                self.stop_child(child)
            self.pg.destroy()
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.targets()
        self.finish()
        if failed:
            print(f"\nbenchmark FAILED: {failed[0]}; the service logs are in {self.logs}", file=sys.stderr)
            return 1
        return 0

    def finish(self) -> None:
        m = self.raw["machine"]
        curves = {proto: ol["points"] for proto, ol in self.raw.get("openloop", {}).items()}
        png = self.out / "latency_vs_load.png"
        why_not = plot_latency_vs_load(curves, png, f"commit latency vs offered load ({label(self.plan.open_config)},"
                                                    f" {m['cores']} cores, {m['date'][:10]})") if curves else \
            "no open-loop section run"
        self.report.write_json(self.out / "results.json")
        print()
        print(f"## Coordinator benchmark{' (--smoke: tiny matrix, figures not meaningful)' if self.smoke else ''}")
        print(f"{m['date']} · {m['cpu']} · {m['cores']} cores · Python {m['python']} · "
              f"`python -m loadtest.bench{' --smoke' if self.smoke else ''}`")
        print()
        print(self.report.markdown())
        print()
        print(f"JSON: {self.out / 'results.json'}")
        print(f"PNG:  {png}" if why_not is None else f"PNG:  not written: {why_not}")
        if self.profile_text:
            print()
            print(self.profile_text)


def _gauge(base: str, name: str) -> float | None:
    _status, body = procs.http_get(base + "/metrics")
    return next((float(line.split()[1]) for line in body.decode().splitlines() if line.startswith(name + " ")), None)


def _wait_dormant(base: str, timeout_s: float = 30) -> None:
    """Until no actor is alive (every loaded table has gone dormant)."""
    deadline = time.monotonic() + timeout_s
    while (_gauge(base, "coordinator_active_actors") or 0) > 0 and time.monotonic() < deadline:
        time.sleep(0.25)


async def _insert_known_tables(dsn: str, ns: str, warehouse: Path, template: dict, count: int,
                               say: Callable[[str], None]) -> None:
    """Rows as the service writes them (table row + commit-log entry 0) and a metadata file per table."""
    import asyncpg

    from storage.files import location_key
    from storage.postgres import _connection_setup
    con = await asyncpg.connect(dsn)
    await _connection_setup(60)(con)
    chunk = 5000
    try:
        for start in range(0, count, chunk):
            ids, names, locations, states, payloads = [], [], [], [], []
            for i in range(start, min(start + chunk, count)):
                table_id = uuid.uuid4()
                location = warehouse / f"k{i}-{table_id.hex}"
                meta_path = location / "metadata" / f"00000-{uuid.uuid4()}.metadata.json"
                meta_path.parent.mkdir(parents=True)
                meta = {**template, "table-uuid": str(table_id), "location": location.as_uri()}
                meta_path.write_bytes(orjson.dumps(meta))
                ids.append(table_id)
                names.append(f"k{i}")
                locations.append(location.as_uri())
                states.append({"metadata-location": meta_path.as_uri()})
                payloads.append({"metadata-location": meta_path.as_uri(), "previous": None})
            async with con.transaction():
                await con.execute(
                    "INSERT INTO tables (table_id, realm, catalog, namespace, name, kind, format, location,"
                    " row_version, epoch, state, location_key) SELECT t, 'iceberg', '', $5, n, 'table', 'iceberg',"
                    " l, 1, 0, s, k FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $6::text[])"
                    " AS u(t, n, l, s, k)", ids, names, locations, states, ns, [location_key(x) for x in locations])
                await con.execute("INSERT INTO commits (table_id, version, payload)"
                                  " SELECT t, 0, p FROM unnest($1::uuid[], $2::jsonb[]) AS u(t, p)", ids, payloads)
            if count >= 20_000 and (start // chunk) % 4 == 3:
                say(f"memory: {min(start + chunk, count)} / {count} tables inserted ...")
    finally:
        await con.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny matrix, ~30 s, no thresholds (what CI runs)")
    ap.add_argument("--profile", action="store_true",
                    help="also break each format's CPU per commit down by stage (py-spy; loadtest/stages.py)")
    ap.add_argument("--only", help=f"comma-separated sections to run: {','.join(SECTIONS)} (default: all)")
    ap.add_argument("--duration", type=float, help="seconds per matrix run (default 10; --smoke 0.8)")
    ap.add_argument("--retry", choices=MODES, default="client",
                    help="how the clients (ours and the baselines') wait after a 409: as the real clients do "
                         "(default), or at once, the flows' old behaviour (see loadtest/retry.py)")
    ap.add_argument("--out", type=Path, help="where results.json, the PNG and logs go "
                                             "(default: loadtest/results/<date-time>)")
    args = ap.parse_args(argv)
    plan = SMOKE if args.smoke else FULL
    if args.duration:
        plan.duration_s = args.duration
    sections = set(SECTIONS)
    if args.only:
        sections = {s.strip() for s in args.only.split(",") if s.strip()}
        unknown = sections - set(SECTIONS)
        if unknown:
            ap.error(f"unknown sections {sorted(unknown)}; choose from {','.join(SECTIONS)}")
    if args.profile:
        sections.add("profile")
    out = args.out or Path(__file__).resolve().parent / "results" / datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    # 1,000 writers need 1,000 sockets here and in the service (children inherit the limit).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < min(hard, 65536):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    return Bench(plan, out, sections, args.profile or ("profile" in sections and args.only is not None),
                 args.smoke, args.retry).execute()


if __name__ == "__main__":
    sys.exit(main())
