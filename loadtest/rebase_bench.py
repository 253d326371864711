"""Concurrent appends to one Iceberg table with rebasing on (docs/rebasing.md), against the same appends spread
over tables of their own, in one run: prints one table.

    python -m loadtest.rebase_bench                       # own PostgreSQL + service, 10 s per configuration
    python -m loadtest.rebase_bench --duration 20 --rounds 2
    python -m loadtest.rebase_bench --stages              # where a rebased commit's CPU goes, against a plain one
    python -m loadtest.rebase_bench --code ../main         # the service from another checkout (the load stays this one)
    python -m loadtest.rebase_bench --rate 120            # every configuration offered 120 commits/s: CPU at one load

Every commit is a real fast append (`loadtest/append_flow.py`: pyiceberg's writers write the manifest and the
manifest list the service reads when it rebases). Configurations, each measured `--rounds` times in turn:

* `8x1`: 8 tables, one writer each: nothing to rebase, the baseline;
* `1x8`: one table, 8 writers, rebasing on: almost every commit is rebased;
* `1x32`: one table, 32 writers, rebasing on;
* `1x8, rebasing off`: the same appends answered 409 as the spec says, retried as Java's client retries.

Targets (issue 40): `1x8` reaches >= 0.8x the commits/s of `8x1`, with p99 <= 2x; and the server's CPU per
commit of `1x8` (a rebased commit: its first offer, the reads, the new manifest list) against `8x1` (a plain one).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import trio

from storage.embedded import EmbeddedPostgres, free_port

from . import procs, stages
from .append_flow import APPENDS_PER_TABLE, IcebergAppendFlow
from .http import HttpConnection
from .runner import run

CONFIGS = (("8x1", True), ("1x8", True), ("1x32", True), ("1x8", False))
COLUMNS = ("scenario", "commits/s", "x 8x1", "p50 ms", "p99 ms", "p99 x 8x1", "rebased %", "409s", "gave up",
           "requests/commit", "server CPU ms/commit", "CPU x 8x1", "loadgen CPU %")


async def rebased_total(base: str) -> float:
    conn = HttpConnection(base)
    try:
        _, body = await conn.request("GET", "/metrics")
    finally:
        await conn.close()
    return next((float(line.split()[-1]) for line in body.decode().splitlines()
                 if line.startswith("coordinator_rebased_commits_total")), 0.0)


def measure(base: str, pids: list[int], pg_pid: int | None, cfg: str, rebase: bool, duration_s: float,
            appends_per_table: int, tag: str, profile: Path | None = None, rate: float | None = None) -> dict:
    """One configuration's run; with `profile`, the service recorded by py-spy into it (its stages); with `rate`,
    open loop: that many commits a second offered in all, spread over the writers."""
    tables, writers = (int(x) for x in cfg.split("x"))
    flow = IcebergAppendFlow(rebase, appends_per_table)
    recording: list[stages.Recording] = []

    def on_start() -> None:
        if profile is not None:
            recording.append(stages.Recording(pids[0], duration_s, profile))

    async def go():
        groups = await flow.prepare(base, tables, tag)
        before = await rebased_total(base)
        result = await run(flow, base, groups, writers, duration_s, meter=procs.CpuMeter(pids, pg_pid),
                           metrics_base=base, scenario=cfg, on_start=on_start, rate_per_s=rate)
        return result, await rebased_total(base) - before
    result, rebased = trio.run(go)
    extra = {"stages": recording[0].finish(result.commits)} if recording else {}
    return {**extra, "scenario": cfg + ("" if rebase else ", rebasing off"), "commits_per_s": result.commits_per_s,
            "p50_ms": result.p50_ms, "p99_ms": result.p99_ms, "commits": result.commits, "rebased": rebased,
            "conflicts": result.conflicts, "gave_up": result.gave_up, "errors": result.errors,
            "requests": result.requests,
            "server_cpu_ms_per_commit": result.server_cpu_ms_per_commit, "loadgen_cpu_pct": result.loadgen_cpu_pct,
            "error_samples": result.error_samples[:3]}


def summarize(runs: list[dict]) -> dict:
    """Several rounds of one configuration: medians of the rates and latencies, sums of the counts."""
    out = dict(runs[0])
    for key in ("commits_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_commit", "loadgen_cpu_pct"):
        out[key] = round(statistics.median(r[key] for r in runs), 3)
    for key in ("commits", "rebased", "conflicts", "gave_up", "errors", "requests"):
        out[key] = sum(r[key] for r in runs)
    return out


def table(rows: list[dict], rate: float | None = None) -> str:
    base = next(r for r in rows if r["scenario"] == "8x1")
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        cells = [r["scenario"], f"{r['commits_per_s']:.1f}", f"{r['commits_per_s'] / base['commits_per_s']:.2f}x",
                 f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"{r['p99_ms'] / base['p99_ms']:.2f}x",
                 f"{100 * r['rebased'] / max(r['commits'], 1):.0f}", str(r["conflicts"]), str(r["gave_up"]),
                 f"{r['requests'] / max(r['commits'], 1):.3f}",
                 f"{r['server_cpu_ms_per_commit']:.3f}",
                 f"{r['server_cpu_ms_per_commit'] / base['server_cpu_ms_per_commit']:.2f}x",
                 f"{r['loadgen_cpu_pct']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    hot = next(r for r in rows if r["scenario"] == "1x8")
    ratio, p99 = hot["commits_per_s"] / base["commits_per_s"], hot["p99_ms"] / base["p99_ms"]
    target = (f"target: 1x8 with rebasing >= 0.8x the commits/s of 8x1: {ratio:.2f}x "
              f"{'OK' if ratio >= 0.8 else 'MISS'}; p99 <= 2x: {p99:.2f}x {'OK' if p99 <= 2 else 'MISS'}"
              if rate is None else f"open loop at {rate:g} commits/s offered: the commits/s target is a closed "
                                   f"loop's (run without --rate)")
    lines += ["", target,
              f"a rebased commit costs the server {hot['server_cpu_ms_per_commit']:.3f} ms CPU, a plain one "
              f"{base['server_cpu_ms_per_commit']:.3f} ms "
              f"({hot['server_cpu_ms_per_commit'] / base['server_cpu_ms_per_commit']:.2f}x; "
              f"{100 * hot['rebased'] / max(hot['commits'], 1):.0f}% of 1x8's commits were rebased)"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per configuration and round")
    ap.add_argument("--rounds", type=int, default=1, help="measure each configuration this many times, in turn")
    ap.add_argument("--appends-per-table", type=int, default=APPENDS_PER_TABLE,
                    help="a group's writers move to its next table once they started this many appends on it")
    ap.add_argument("--stages", action="store_true", help="py-spy the service in the first round's 8x1 and 1x8 "
                                                          "and print their CPU per commit by stage")
    ap.add_argument("--code", type=Path, help="run the service from this checkout instead (e.g. main, to compare "
                    "with a change: run each in turn); the load generator stays this checkout's")
    ap.add_argument("--rate", type=float, help="open loop: offer every configuration this many commits a second in "
                    "all (a closed loop by default: each writer commits again once answered). The server's CPU per "
                    "commit then compares at one load, not at each configuration's own peak, where batches differ")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (service log, warehouse, py-spy files)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rebase-bench-"))
    tmp.chmod(0o755)
    pg = service = None
    results: dict[tuple[str, bool], list[dict]] = {}
    try:
        print("starting PostgreSQL and the service ...", flush=True)
        pg = EmbeddedPostgres(tmp / "pg")
        dsn = pg.start()
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        print(f"the service runs {args.code or 'this checkout'}", flush=True)
        service = procs.service(port, dsn, tmp / "service", tmp / "service.log",
                                **({"code": args.code, "env": {"PYTHONPATH": str(args.code)}} if args.code else {})
                                ).start(base + "/readyz")
        pg_pid = procs.postmaster_pid(pg.pgdata)
        for round_ in range(args.rounds):
            for cfg, rebase in CONFIGS:
                print(f"round {round_ + 1}/{args.rounds}: {cfg}{'' if rebase else ', rebasing off'} for "
                      f"{args.duration:g} s ...", flush=True)
                tag = f"rb_{cfg}_{int(rebase)}_{round_}_{free_port()}"
                profile = (tmp / f"pyspy-{cfg}.txt" if args.stages and round_ == 0 and rebase and cfg in ("8x1", "1x8")
                           else None)
                row = measure(base, [service.pid], pg_pid, cfg, rebase, args.duration, args.appends_per_table,
                              tag, profile, args.rate)
                if row["errors"]:
                    print(f"  {row['errors']} errors, e.g. {row['error_samples']}", flush=True)
                results.setdefault((cfg, rebase), []).append(row)
    finally:
        procs.tear_down([service] if service is not None else [], pg, tmp, args.keep)
    print()
    print(f"Iceberg fast appends with their files (pyiceberg's writers), {args.duration:g} s x {args.rounds} "
          f"round(s) per configuration, {args.appends_per_table} appends started per table, "
          f"{'a closed loop' if args.rate is None else f'{args.rate:g} commits/s offered'}; medians over rounds; "
          f"the service: {args.code or 'this checkout'}; load average at the end {os.getloadavg()[0]:.1f}")
    print()
    print(table([summarize(results[key]) for key in CONFIGS], args.rate))
    profiled = {f"{cfg} (server CPU ms/commit)": results[(cfg, True)][0]["stages"] for cfg in ("8x1", "1x8")
                if "stages" in results[(cfg, True)][0]}
    if profiled:
        print()
        print(stages.table(profiled))
        print()
        print(stages.thread_table(profiled))
        print()
        print(stages.top_functions(profiled[next(k for k in profiled if k.startswith("1x8"))]))


if __name__ == "__main__":
    main()
