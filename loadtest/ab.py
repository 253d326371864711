"""Same-run A/B of two checkouts: server CPU per commit, alternated, on one PostgreSQL.

    python -m loadtest.ab /work/ab-old /work/ab-new                         # 3 rounds, 600 commits/s, 15 s
    python -m loadtest.ab /work/ab-old /work/ab-new --rounds 1 --duration 8 # quick check that it works
    python -m loadtest.ab /work/ab-old /work/ab-new --rate 0                # closed loop: the peak

Starts one throwaway PostgreSQL (storage.embedded.EmbeddedPostgres) and two services side by side, each
`python -m api.cli serve` run from its own checkout (cwd and PYTHONPATH = the checkout, so that checkout's code
runs) with its own database (CREATE DATABASE), data dir and warehouse. Then, for each round and each flow, it runs
commit_bench's measurement (open loop, `--rate` commits/s offered, `--matrix`, `--duration` s) against A, then
against B: A, B, A, B, ... so both see the same hour of this noisy, shared machine. The load generator is this
checkout's (the same for both). Prints a table per flow x round with server CPU ms per request and per commit,
commits/s, p99, errors and late commits for A and B, then the medians per flow and the ratio B/A. Services and PostgreSQL are
stopped on every exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

from storage.embedded import EmbeddedPostgres, free_port

from . import procs
from .commit_bench import measure
from .flows import FLOWS
from .retry import MODES

FIELDS = (("server_cpu_ms_per_request", "CPU ms/req"), ("server_cpu_ms_per_commit", "CPU ms/commit"),
          ("commits_per_s", "commits/s"), ("p99_ms", "p99 ms"), ("errors", "errors"),
          ("late", "late"))   # late: due in the window but never started (the service did not keep up)


def start_service(name: str, checkout: Path, pg: EmbeddedPostgres, tmp: Path,
                  log_level: str = "warning") -> tuple[procs.Child, str]:
    """The service from `checkout`, on its own database of `pg`; procs.service builds the command, but it must
    run with cwd = the checkout (procs.Child.launch runs it in this checkout)."""
    db = f"ab_{name.lower()}"
    pg._psql("-c", f"CREATE DATABASE {db}")
    dsn = f"postgresql://coordinator@127.0.0.1:{pg.port}/{db}"
    port = free_port()
    child = procs.service(port, dsn, tmp / name, tmp / f"{name}.log", warehouse=tmp / name / "warehouse",
                          env={"PYTHONPATH": str(checkout)}, extra_args=["--log-level", log_level])
    with open(child.log, "ab") as out:
        child.proc = subprocess.Popen(child.argv, stdout=out, stderr=subprocess.STDOUT, cwd=checkout, env=child.env)
    base = f"http://127.0.0.1:{port}"
    child.start(base + "/readyz")
    return child, base


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
    ap.add_argument("--rate", type=float, default=600, help="commits/s offered in all (open loop); 0: closed loop "
                                                             "(each writer commits again when answered: the peak)")
    ap.add_argument("--duration", type=float, default=15, help="seconds per run")
    ap.add_argument("--retry", choices=MODES, default="client")
    ap.add_argument("--log-level", default="warning", help="the services' log level (info: a line per request, "
                                                            "as `serve` logs by default)")
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
    services: dict[str, tuple[procs.Child, str]] = {}
    rows: list[dict] = []
    try:
        print("starting PostgreSQL ...", flush=True)
        pg = EmbeddedPostgres(tmp / "pg")
        pg.start()
        for name, c in checkouts.items():
            print(f"starting service {name} from {c} ...", flush=True)
            services[name] = start_service(name, c, pg, tmp, args.log_level)
        bench = argparse.Namespace(flows=None, matrix=args.matrix, duration=args.duration, rate=args.rate or None,
                                   retry=args.retry)
        for rnd in range(1, args.rounds + 1):
            for flow in flows:
                for name, (child, base) in services.items():
                    if child.proc.poll() is not None:
                        raise SystemExit(f"service {name} exited ({child.proc.returncode}); see {child.log}")
                    print(f"round {rnd}/{args.rounds}, {flow}, {name}: ", end="", flush=True)
                    bench.flows = flow
                    got: list[dict] = []
                    measure(bench, [base], child.pid, got, processes=1, pg_pid=procs.postmaster_pid(pg.pgdata))
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
        for child, _ in services.values():
            child.stop()
        if pg is not None:
            pg.destroy()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))
    table(rows, flows, args)


def table(rows: list[dict], flows: list[str], args) -> None:
    if not rows:
        return
    load = f"{args.rate:g} commits/s offered" if args.rate else "closed loop"
    print(f"\n{args.matrix}, {load}, {args.duration:g} s per run, log level "
          f"{args.log_level}; A = {args.a}, B = {args.b}\n")
    head = ["flow", "round"] + [f"{side} {label}" for _, label in FIELDS for side in "AB"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|")
    at = {(r["flow"], r["round"], r["side"]): r for r in rows}
    for flow in flows:
        rounds = sorted({r["round"] for r in rows if r["flow"] == flow})
        for rnd in rounds:
            cells = [str(at.get((flow, rnd, s), {}).get(k, "")) for k, _ in FIELDS for s in "AB"]
            print(f"| {flow} | {rnd} | " + " | ".join(cells) + " |")
        medians, ratios = [], []
        for k, _ in FIELDS:
            m = {s: [at[flow, r, s][k] for r in rounds if (flow, r, s) in at and at[flow, r, s][k] is not None]
                 for s in "AB"}
            med = {s: statistics.median(v) if v else None for s, v in m.items()}
            medians += [f"{med[s]:g}" if med[s] is not None else "" for s in "AB"]
            ratios += ["", f"{med['B'] / med['A']:.3f}" if med["A"] and med["B"] is not None else ""]
        print(f"| **{flow}** | median | " + " | ".join(medians) + " |")
        print(f"| **{flow}** | B/A | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
