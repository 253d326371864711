"""Ad-hoc commit throughput and latency: any flow, any TABLESxWRITERS, against a running service or its own.

    python -m loadtest.commit_bench                                  # own PostgreSQL + service
    python -m loadtest.commit_bench --url http://127.0.0.1:8181 --flows iceberg --matrix 64x8 --duration 20

Flows (loadtest/flows.py): `iceberg` (add-snapshot + set-snapshot-ref guarded by assert-ref-snapshot-id, reload
and retry on 409), `delta` (staged commit at last+1, backfill every few versions), `lance` (version/list limit 1,
version/create at latest+1), and `iceberg-props` (set-properties with no requirement: never conflicts, the
coordinator's raw commit rate). For the fixed matrix with baselines and targets, use `python -m loadtest.bench`.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import orjson
import trio

from storage.embedded import EmbeddedPostgres, free_port

from . import procs
from .flows import FLOWS
from .runner import run

COLUMNS = ("protocol", "scenario", "commits_per_s", "p50_ms", "p99_ms", "conflicts", "errors",
           "server_cpu_ms_per_request", "writes_per_db_txn", "loadgen_cpu_pct")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running service; default: start PostgreSQL and the service here")
    ap.add_argument("--server-pid", type=int, help="with --url: the service's pid, for its CPU per request")
    ap.add_argument("--matrix", default="1x8,64x2", help="comma-separated TABLESxWRITERS configurations")
    ap.add_argument("--flows", default="iceberg,iceberg-props", help=f"comma-separated: {','.join(FLOWS)}")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per configuration")
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    args = ap.parse_args()
    unknown = [f for f in args.flows.split(",") if f not in FLOWS]
    if unknown:
        ap.error(f"unknown flows {unknown}; choose from {','.join(FLOWS)}")

    tmp = pg = child = None
    pid = args.server_pid
    try:
        if args.url:
            base = args.url
        else:
            tmp = Path(tempfile.mkdtemp(prefix="commit-bench-"))
            tmp.chmod(0o755)
            print("starting PostgreSQL and the service ...", flush=True)
            pg = EmbeddedPostgres(tmp / "pg")
            port = free_port()
            child = procs.service(port, pg.start(), tmp / "service", tmp / "service.log")
            base = f"http://127.0.0.1:{port}"
            child.start(base + "/readyz")
            pid = child.pid
        rows = []
        for name in args.flows.split(","):
            flow = FLOWS[name]
            for cfg in args.matrix.split(","):
                tables, writers = (int(x) for x in cfg.split("x"))
                print(f"running {name}: {tables} tables x {writers} writers for {args.duration:g} s ...", flush=True)

                tag = f"cb_{name.replace('-', '_')}_{cfg}_{free_port()}"

                async def go(flow=flow, tables=tables, writers=writers, cfg=cfg, tag=tag):
                    ts = await flow.prepare(base, tables, tag)
                    return await run(flow, base, ts, writers, args.duration, meter=procs.CpuMeter(pid, None),
                                     metrics_base=base, scenario=cfg)
                rows.append(trio.run(go).as_dict())
    finally:
        if child is not None:
            child.stop()
        if pg is not None:
            pg.destroy()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print()
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "|".join("---" for _ in COLUMNS) + "|")
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in COLUMNS) + " |")
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
