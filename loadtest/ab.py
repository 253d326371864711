"""Same-run A/B of two checkouts: server CPU per commit, alternated, on one PostgreSQL.

    python -m loadtest.ab /work/ab-old /work/ab-new                         # 3 rounds, 600 commits/s, 15 s
    python -m loadtest.ab /work/ab-old /work/ab-new --rounds 1 --duration 8 # quick check that it works
    python -m loadtest.ab /work/ab-old /work/ab-new --processes 1,2          # ... and as 2 cluster members each

Starts one throwaway PostgreSQL (storage.embedded.EmbeddedPostgres) and two services side by side, each
`python -m api.cli serve` run from its own checkout (cwd and PYTHONPATH = the checkout, so that checkout's code
runs) with its own database (CREATE DATABASE), data dir and warehouse. Then, for each round and each flow, it runs
commit_bench's measurement (open loop, `--rate` commits/s offered, `--matrix`, `--duration` s) against A and B in
turn, A first in odd rounds and B first in even ones (A, B, B, A, A, B, ...), so that both see the same hour of
this noisy, shared machine and neither is always the one that runs second (the second run of a pair has measured
slower whichever checkout it was: it follows the first's writes onto the same disk). The load generator is this
checkout's (the same for both). Prints a table per flow x round with server CPU ms per request and per commit,
commits/s, p99, errors and late commits for A and B, then the medians per flow and the ratio B/A. Services and PostgreSQL are
stopped on every exit, Ctrl-C included.

`--processes 1,2` starts each side also as a cluster of 2 members (each on a port of its own, writers spread over
them round-robin as in commit_bench; `--one-port`: as `serve --workers 2`) and measures every count in every round,
then prints each side's CPU per commit and commits/s with 2 members against its own with 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import orjson

from storage.embedded import EmbeddedPostgres, free_port

from . import procs
from .commit_bench import measure, wait_balanced, wait_workers
from .flows import FLOWS
from .retry import MODES

FIELDS = (("server_cpu_ms_per_request", "CPU ms/req"), ("server_cpu_ms_per_commit", "CPU ms/commit"),
          ("workers_cpu_ms_per_commit", "workers CPU ms/commit"),   # the service's child processes (UniForm)
          ("commits_per_s", "commits/s"), ("p99_ms", "p99 ms"), ("errors", "errors"),
          ("late", "late"))   # late: due in the window but never started (the service did not keep up)


@dataclass
class Side:
    """One checkout's service, as one process or as a cluster of members."""

    children: list[procs.Child]
    bases: list[str]   # where the load generator connects (one per member, or the one shared port)
    pids: list[int]    # whose CPU counts


def start_service(name: str, checkout: Path, pg: EmbeddedPostgres, tmp: Path, processes: int = 1,
                  one_port: bool = False, log_level: str = "warning") -> Side:
    """The service from `checkout`, on its own database of `pg`: one process, `processes` cluster members on ports
    of their own, or (`one_port`) `serve --workers N`."""
    db = f"ab_{name.lower()}"
    pg._psql("-c", f"CREATE DATABASE {db}")
    dsn = pg.dsn_for(db)
    env = {"PYTHONPATH": str(checkout)}
    children, bases = [], []
    for i in range(1 if one_port else processes):
        port = free_port()
        extra = ["--log-level", log_level] + (["--workers", str(processes)] if one_port and processes > 1 else [])
        child = procs.service(port, dsn, tmp / f"{name}-{i}", tmp / f"{name}-{i}.log",
                              warehouse=tmp / name / "warehouse", cluster=processes > 1 and not one_port, env=env,
                              extra_args=extra, code=checkout)
        children.append(child.launch())
        bases.append(f"http://127.0.0.1:{port}")
    for child, base in zip(children, bases):
        child.start(base + "/readyz")
    if processes == 1:
        return Side(children, bases, [children[0].pid])
    if one_port:
        return Side(children, bases, wait_workers(bases[0], children[0].pid, processes))
    wait_balanced(bases)
    return Side(children, bases, [c.pid for c in children])


def which_code(checkout: Path) -> str:
    """Where `api` is imported from when run as the service is: must be the checkout itself."""
    out = subprocess.run([sys.executable, "-c", "import api; print(api.__file__)"], check=False,
                         cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)}, capture_output=True, text=True)
    where = out.stdout.strip()
    if not where.startswith(str(checkout) + "/"):
        raise SystemExit(f"run from {checkout}, `api` is imported from {where or out.stderr}")
    return where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path, help="checkout A (e.g. the old main)")
    ap.add_argument("b", type=Path, help="checkout B (e.g. the new commit path)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flows", default="iceberg,delta,lance")
    ap.add_argument("--matrix", default="64x1", help="TABLESxWRITERS (one configuration)")
    ap.add_argument("--rate", type=float, default=600, help="commits/s offered in all (open loop); 0: a closed "
                                                            "loop, each writer committing as fast as it is answered")
    ap.add_argument("--duration", type=float, default=15, help="seconds per run")
    ap.add_argument("--retry", choices=MODES, default="client")
    ap.add_argument("--log-level", default="warning", help="the services' log level (info: a line per request, "
                                                            "as `serve` logs by default)")
    ap.add_argument("--processes", default="1", help="comma-separated member counts, each measured for A and B, "
                                                     "e.g. 1,2 (1 = one process, no cluster)")
    ap.add_argument("--one-port", action="store_true", help="run member counts N > 1 as `serve --workers N`")
    ap.add_argument("--json", type=Path, help="also write every run's row here")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (service logs, warehouses)")
    args = ap.parse_args()
    flows = args.flows.split(",")
    if unknown := [f for f in flows if f not in FLOWS]:
        ap.error(f"unknown flows {unknown}; choose from {','.join(FLOWS)}")
    checkouts = {"A": args.a.resolve(), "B": args.b.resolve()}
    for name, c in checkouts.items():
        head = subprocess.run(["git", "-C", str(c), "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True)
        print(f"{name}: {c} at {head.stdout.strip()} (runs {which_code(c)})", flush=True)

    def stop(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)   # `kill` cleans up as Ctrl-C does
    tmp = Path(tempfile.mkdtemp(prefix="ab-"))
    tmp.chmod(0o755)                      # PostgreSQL runs as its own OS user when we are root
    pg = None
    services: dict[tuple[str, int], Side] = {}
    rows: list[dict] = []
    counts = [int(n) for n in args.processes.split(",")]
    try:
        print("starting PostgreSQL ...", flush=True)
        pg = EmbeddedPostgres(tmp / "pg")
        pg.start()
        for n in counts:
            for name, c in checkouts.items():
                print(f"starting service {name} from {c} as {n} process(es) ...", flush=True)
                services[name, n] = start_service(f"{name}{n}", c, pg, tmp, n, args.one_port, args.log_level)
        bench = argparse.Namespace(flows=None, matrix=args.matrix, duration=args.duration, rate=args.rate or None,
                                   retry=args.retry)
        for rnd in range(1, args.rounds + 1):
            for flow in flows:
                turns = list(services.items())
                for (name, n), side in turns if rnd % 2 else turns[::-1]:
                    for child in side.children:
                        if child.proc.poll() is not None:
                            raise SystemExit(f"service {name} exited ({child.proc.returncode}); see {child.log}")
                    print(f"round {rnd}/{args.rounds}, {flow}, {name} x{n}: ", end="", flush=True)
                    bench.flows = flow
                    got: list[dict] = []
                    measure(bench, side.bases, side.pids, got, processes=n, pg_pid=procs.postmaster_pid(pg.pgdata))
                    r = {**got[0], "side": name, "round": rnd, "flow": flow}
                    rows.append(r)
                    print(f"  -> {r['commits_per_s']} commits/s, CPU {r['server_cpu_ms_per_request']} ms/req "
                          f"{r['server_cpu_ms_per_commit']} ms/commit, p99 {r['p99_ms']} ms, errors {r['errors']}, "
                          f"conflicts {r['conflicts']}, late {r['late']}, server {r['server_cpu_pct']}% CPU, "
                          f"PG {r['pg_cpu_ms_per_commit']} ms/commit, loadgen {r['loadgen_cpu_pct']}% CPU"
                          + (f"; e.g. {r['error_samples'][:2]}" if r["error_samples"] else ""), flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted; stopping the services and PostgreSQL", flush=True)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C must not cut the cleanup short
        procs.tear_down([child for side in services.values() for child in side.children], pg, tmp, args.keep)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    table(rows, flows, args)


def table(rows: list[dict], flows: list[str], args) -> None:
    if not rows:
        return
    counts = sorted({r["processes"] for r in rows})
    ways = " (serve --workers N)" if args.one_port else ""
    offered = f"{args.rate:g} commits/s offered" if args.rate else "closed loop"
    print(f"\n{args.matrix}, {offered}, {args.duration:g} s per run, log level {args.log_level}; A = {args.a}, "
          f"B = {args.b}"
          + (f"; processes {','.join(map(str, counts))}{ways}" if counts != [1] else "") + "\n")
    head = ["flow", "round"] + [f"{side} {label}" for _, label in FIELDS for side in "AB"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|")
    at = {(r["flow"], r["processes"], r["round"], r["side"]): r for r in rows}
    medians: dict[tuple[str, int, str, str], float | None] = {}
    for flow in flows:
        for n in counts:
            label = flow if counts == [1] else f"{flow} x{n}"
            rounds = sorted({r["round"] for r in rows if r["flow"] == flow and r["processes"] == n})
            for rnd in rounds:
                cells = [str(at.get((flow, n, rnd, s), {}).get(k, "")) for k, _ in FIELDS for s in "AB"]
                print(f"| {label} | {rnd} | " + " | ".join(cells) + " |")
            cells, ratios = [], []
            for k, _ in FIELDS:
                for s in "AB":
                    found = [at.get((flow, n, r, s), {}).get(k) for r in rounds]
                    v = [x for x in found if x is not None]
                    medians[flow, n, s, k] = statistics.median(v) if v else None
                cells += [f"{medians[flow, n, s, k]:g}" if medians[flow, n, s, k] is not None else "" for s in "AB"]
                a, b = medians[flow, n, "A", k], medians[flow, n, "B", k]
                ratios += ["", f"{b / a:.3f}" if a and b is not None else ""]
            print(f"| **{label}** | median | " + " | ".join(cells) + " |")
            print(f"| **{label}** | B/A | " + " | ".join(ratios) + " |")
    if len(counts) > 1:
        print(f"\nEach side's medians with N processes against its own with {counts[0]}:\n")
        print("| flow | N | A CPU ms/commit | B CPU ms/commit | A commits/s | B commits/s |")
        print("|---|---|---:|---:|---:|---:|")
        for flow in flows:
            for n in counts[1:]:
                cells = []
                for k in ("server_cpu_ms_per_commit", "commits_per_s"):
                    for s in "AB":
                        one, many = medians.get((flow, counts[0], s, k)), medians.get((flow, n, s, k))
                        cells.append(f"{many / one:.2f}x" if one and many is not None else "")
                print(f"| {flow} | {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
