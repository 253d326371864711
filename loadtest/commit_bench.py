"""Ad-hoc commit throughput and latency: any flow, any TABLESxWRITERS, against a running service or its own.

    python -m loadtest.commit_bench                                  # own PostgreSQL + service
    python -m loadtest.commit_bench --url http://127.0.0.1:8181 --flows iceberg --matrix 64x8 --duration 20
    python -m loadtest.commit_bench --processes 1,2 --flows iceberg-props,iceberg --matrix 8x1,64x1   # scale-out
    python -m loadtest.commit_bench --processes 1,2 --one-port --flows iceberg-props --matrix 8x1   # serve --workers 2
    python -m loadtest.commit_bench --flows lance --matrix 64x1 --rate 600 --duration 15   # open loop, fixed rate

`--processes 1,2` measures, in one run on one PostgreSQL, the service as one process (the default, no cluster)
and as a cluster of 2 member processes (`serve --cluster`, each on its own port; writers spread over them
round-robin as a load balancer would, so about half the requests are forwarded to the owning member). First it
measures the machine's ceiling for the same counts: the bare quart-trio app (loadtest/bare.py) as 1 and as 2
processes, no database, no work: what N processes of the HTTP stack alone can serve here; with `--rate`, also
what they cost per request at that offered load (the floor of "N members over one" at that load: at a moderate
rate each process's requests share fewer wake-ups).

Flows (loadtest/flows.py): `iceberg` (add-snapshot + set-snapshot-ref guarded by assert-ref-snapshot-id, reload
and retry on 409), `delta` (staged commit at last+1, backfill every few versions), `lance` (version/list limit 1,
version/create at latest+1), and `iceberg-props` (set-properties with no requirement: never conflicts, the
coordinator's raw commit rate). For the fixed matrix with baselines and targets, use `python -m loadtest.bench`.

With one process, each flow and matrix is measured on the bare quart-trio app first, with the flow's commit
request at the same load (`--rate` on the same connections, or closed loop): `x_bare` is the service's CPU per
request over the bare app's in the same run, the figure issue 34's targets are set in. A flow whose commits each
make a new file durable (Iceberg's metadata file, Lance's manifest) is also measured on the bare app with
`--durable-file` (each request writes its body as a durable file, the textbook way), right after the plain one:
`x_floor` is the service's CPU per request over that, the floor of a commit that must make one file durable.
`--stages` records the service (every member of a cluster, summed; and the bare apps) with py-spy during each run
and prints where the CPU per commit went, by stage (loadtest/stages.py); `--keep` keeps the py-spy files and the
service logs.

`--one-port` runs each member count N > 1 as `serve --workers N` instead: N members on one port, each connection
handed by the kernel to one of them; their CPU is summed (the supervisor, which only waits, is left out).

`--warehouses local,s3` measures, in one run, the service with a local warehouse and with one on S3: it starts
moto's S3 server on loopback (`pip install 'moto[server]'`), a bucket in it, and the service with
`--warehouse s3://<bucket>/wh` and its S3 flags; the load generator writes what a client writes (Delta's first
commit, Lance's staged manifests) to the same bucket. moto is not AWS: no network between the machines, but a
Python server on the same 2 cores, so its figures tell what S3 requests cost the service, not AWS's latency.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import orjson
import trio

from storage.embedded import EmbeddedPostgres, free_port

from . import flows, procs, stages
from .flows import FLOWS
from .retry import MODES
from .runner import hammer, run

COLUMNS = ("warehouse", "processes", "protocol", "scenario", "commits_per_s", "p50_ms", "p99_ms", "commit_request_p99_ms",
           "conflicts", "gave_up", "errors", "server_cpu_ms_per_request", "server_cpu_ms_per_commit",
           "bare_cpu_ms_per_request", "x_bare", "floor_cpu_ms_per_request", "x_floor", "writes_per_db_txn",
           "server_cpu_pct", "pg_cpu_pct", "loadgen_cpu_pct")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running service; default: start PostgreSQL and the service here")
    ap.add_argument("--server-pid", type=int, help="with --url: the service's pid, for its CPU per request")
    ap.add_argument("--matrix", default="1x8,64x2", help="comma-separated TABLESxWRITERS configurations")
    ap.add_argument("--flows", default="iceberg,iceberg-props", help=f"comma-separated: {','.join(FLOWS)}")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per configuration")
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    ap.add_argument("--processes", default="1", help="comma-separated member counts to measure in this run, "
                                                     "e.g. 1,2 (1 = the default single process)")
    ap.add_argument("--one-port", action="store_true",
                    help="with --processes: run N > 1 as `serve --workers N` (N member processes on one port, the "
                         "kernel handing each connection to one of them) instead of N members on ports of their own")
    ap.add_argument("--rate", type=float, help="open loop: offer this many commits/s in all (Poisson arrivals, "
                                               "latency from the scheduled time) instead of a closed loop")
    ap.add_argument("--retry", choices=MODES, default="client",
                    help="how writers wait after a 409: as the real clients do, or at once (loadtest/retry.py)")
    ap.add_argument("--warehouses", default="local", help="comma-separated: local, s3 (moto's S3 server, started "
                                                          "here); each is measured in turn")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare app's runs (plain and --durable-file) "
                                                           "before each of one process")
    ap.add_argument("--stages", action="store_true", help="py-spy each run (every member of a cluster, and the bare "
                                                          "apps) and print its CPU per commit by stage")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (service logs, py-spy files)")
    args = ap.parse_args()
    warehouses = args.warehouses.split(",")
    if set(warehouses) - {"local", "s3"}:
        ap.error(f"unknown warehouses {warehouses}; choose from local,s3")
    if args.url and warehouses != ["local"]:
        ap.error("--warehouses starts its own services; it cannot be combined with --url")
    unknown = [f for f in args.flows.split(",") if f not in FLOWS]
    if unknown:
        ap.error(f"unknown flows {unknown}; choose from {','.join(FLOWS)}")

    counts = [int(p) for p in args.processes.split(",")]
    if args.url and counts != [1]:
        ap.error("--processes starts its own services; it cannot be combined with --url")
    tmp = pg = s3 = bare = floor = None
    children: list = []
    rows = []
    ceiling: list[dict] = []
    try:
        tmp = Path(tempfile.mkdtemp(prefix="commit-bench-"))
        tmp.chmod(0o755)
        if not args.no_bare and 1 in counts:
            bare = start_bare(tmp / "bare.log")
            if any(FLOWS[f].durable_file for f in args.flows.split(",")):
                floor = start_bare(tmp / "bare-durable.log", tmp / "bare-durable-files")
        if args.url:
            measure(args, [args.url], args.server_pid, rows, processes=1, bare=bare, floor=floor, profile_dir=tmp)
        else:
            print("starting PostgreSQL ...", flush=True)
            pg = EmbeddedPostgres(tmp / "pg")
            dsn = pg.start()
            pg_pid = procs.postmaster_pid(pg.pgdata)
            if len(counts) > 1:
                ceiling = [bare_ceiling(n, args.duration, tmp) for n in counts]
                if args.rate:   # the floor of "N members over one" at the load the service is offered
                    ceiling += [bare_ceiling(n, args.duration, tmp, args.rate) for n in counts]
            if "s3" in warehouses:
                s3 = start_s3(tmp)
            for warehouse, n in [(w, n) for w in warehouses for n in counts]:
                print(f"starting the service as {n} process(es), {warehouse} warehouse ...", flush=True)
                children = []
                where = dict(warehouse=tmp / f"warehouse-{n}")
                if warehouse == "s3":
                    where = dict(warehouse=f"s3://{s3.bucket()}/wh", env=s3.env, extra_args=s3.serve_args)
                if args.one_port and n > 1:
                    port = free_port()
                    workers = where.get("extra_args", []) + ["--workers", str(n)]
                    child = procs.service(port, dsn, tmp / f"w{n}-{warehouse}", tmp / f"w{n}-{warehouse}.log",
                                          **{**where, "extra_args": workers})
                    children.append((child.launch(), f"http://127.0.0.1:{port}"))
                else:
                    for i in range(n):
                        port = free_port()
                        child = procs.service(port, dsn, tmp / f"p{n}-{i}-{warehouse}",
                                              tmp / f"p{n}-{i}-{warehouse}.log", cluster=n > 1, **where)
                        children.append((child.launch(), f"http://127.0.0.1:{port}"))
                for child, base in children:
                    child.start(base + "/readyz")
                bases = [base for _, base in children]
                if args.one_port and n > 1:
                    pids = wait_workers(bases[0], children[0][0].pid, n)
                else:
                    pids = [c.pid for c, _ in children]
                    if n > 1:
                        wait_balanced(bases)
                measure(args, bases, pids, rows, processes=n, pg_pid=pg_pid, warehouse=warehouse,
                        bare=bare if n == 1 else None, floor=floor if n == 1 else None, profile_dir=tmp)
                for child, _ in children:
                    child.stop()
                children = []
    finally:
        for child, _ in children:
            child.stop()
        for app in (bare, floor):
            if app is not None:
                app[0].stop()
        if s3 is not None:
            s3.stop()
        if pg is not None:
            pg.destroy()
        if tmp is not None and args.keep:
            print(f"kept {tmp}")
        elif tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print()
    if ceiling:
        print("| bare quart-trio processes | offered | requests/s | ratio | server CPU ms/request | CPU ratio "
              "| server CPU % |")
        print("|---|---|---|---|---|---|---|")
        for r in ceiling:
            one = next(c for c in ceiling if c["offered"] == r["offered"])   # (1 process, the same load)
            print(f"| {r['processes']} | {r['offered']} | {r['requests_per_s']} "
                  f"| {r['requests_per_s'] / one['requests_per_s']:.2f}x | {r['server_cpu_ms_per_request']} "
                  f"| {r['server_cpu_ms_per_request'] / one['server_cpu_ms_per_request']:.2f}x "
                  f"| {r['server_cpu_pct']} |")
        print()
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "|".join("---" for _ in COLUMNS) + "|")
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in COLUMNS) + " |")
    for r in rows:
        if "stages" in r:
            load = f" at {args.rate:g}/s offered" if args.rate else " closed loop"
            print(f"\n{r['protocol']} {r['scenario']} on {r['processes']} process(es){load}, {r['commits_per_s']} "
                  f"commits/s: server CPU ms per commit (bare app: per request) by stage\n")
            columns = {"service": r.pop("stages")}
            if "bare_stages" in r:
                columns["bare app"] = r.pop("bare_stages")
            if "floor_stages" in r:
                columns["bare app, durable file"] = r.pop("floor_stages")
            print(stages.table(columns))
            print()
            print(stages.top_functions(columns["service"]))
    if args.json:
        args.json.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2))


def start_bare(log: Path, durable_dir: Path | None = None) -> tuple[procs.Child, str]:
    """The bare app (with `durable_dir`: `--durable-file` there) started on a free port, and its base URL."""
    port = free_port()
    child = procs.bare_app(port, log, durable_dir)
    return child.start(f"http://127.0.0.1:{port}/healthz"), f"http://127.0.0.1:{port}"


def bare_ceiling(n: int, duration_s: float, tmp: Path, rate: float | None = None) -> dict:
    """The bare quart-trio app as `n` processes, hammered at once (the HTTP stack's own limit on this machine), or
    offered `rate` requests/s in all (what N processes cost per request at that load, against one)."""
    offered = f"{rate:g}/s" if rate else "closed loop"
    print(f"measuring the bare quart-trio app as {n} process(es), {offered}, for {duration_s:g} s ...", flush=True)
    children = []
    try:
        for i in range(n):
            children.append(start_bare(tmp / f"bare{n}-{i}.log"))
        r = trio.run(hammer, [base for _, base in children], [FLOWS["iceberg"].sample_request()], 64, duration_s,
                     procs.CpuMeter([c.pid for c, _ in children], None), rate)
        return {"processes": n, "offered": offered, **r}
    finally:
        for child, _ in children:
            child.stop()


def start_s3(tmp: Path):
    """moto's S3 server on loopback, for an s3:// warehouse; the load generator's client files go there too."""
    try:
        from tests.support import MotoS3
        s3 = MotoS3(tmp / "moto.log")
    except ImportError as exc:
        raise SystemExit(f"--warehouses s3 needs the test extras ({exc}): pip install -e '.[test]'")
    print(f"starting moto's S3 server on {s3.endpoint} ...", flush=True)
    flows.S3_OPTIONS = s3.options
    return s3.start()


def measure(args, bases: list[str], pids, rows: list, *, processes: int, pg_pid: int | None = None,
            warehouse: str = "local", bare: tuple[procs.Child, str] | None = None,
            floor: tuple[procs.Child, str] | None = None, profile_dir: Path | None = None) -> None:
    """Each flow x matrix against the service (after the bare app's run at the same load, if `bare`, and for a
    flow that makes a file durable per commit the `--durable-file` bare app's, if `floor`); with `args.stages`
    recorded by py-spy (every member of a cluster), its breakdown by stage in the row's "stages"."""
    profile = getattr(args, "stages", False) and profile_dir is not None
    for name in args.flows.split(","):
        flow = FLOWS[name]
        for cfg in args.matrix.split(","):
            tables, writers = (int(x) for x in cfg.split("x"))
            offered = f" at {args.rate:g} commits/s offered" if args.rate else ""
            row: dict = {}
            for key, app in (("bare", bare), ("floor", floor if flow.durable_file else None)):
                if app is not None:
                    row.update(bare_run(args, flow, tables, writers, app, profile_dir if profile else None, key))
            print(f"running {name}: {tables} tables x {writers} writers on {processes} process(es){offered}, "
                  f"{warehouse} warehouse, for {args.duration:g} s ...", flush=True)
            tag = f"cb_{name.replace('-', '_')}_{cfg}_{free_port()}"
            recording: list[stages.Recording] = []

            def on_start(tag=tag) -> None:
                if profile:   # every member of a cluster, each into its own file
                    for i, pid in enumerate(pids if isinstance(pids, list) else [pids]):
                        recording.append(stages.Recording(pid, args.duration, profile_dir / f"pyspy-{tag}-{i}.txt"))

            async def go(flow=flow, tables=tables, writers=writers, cfg=cfg, tag=tag):
                ts = await flow.prepare(bases[0], tables, tag)
                return await run(flow, bases, ts, writers, args.duration, meter=procs.CpuMeter(pids, pg_pid),
                                 metrics_base=bases, scenario=cfg, retry=args.retry, rate_per_s=args.rate,
                                 on_start=on_start)
            r = trio.run(go)
            # What the machine's cores went to: the service processes, PostgreSQL and this load generator.
            pg_pct = None if r.pg_cpu_ms_per_commit is None else round(r.pg_cpu_ms_per_commit * r.commits_per_s / 10, 1)
            row = {"warehouse": warehouse, "processes": processes, **r.as_dict(), "pg_cpu_pct": pg_pct, **row}
            for key in ("bare", "floor"):
                if row.get(f"{key}_cpu_ms_per_request") and r.server_cpu_ms_per_request:
                    row[f"x_{key}"] = round(r.server_cpu_ms_per_request / row[f"{key}_cpu_ms_per_request"], 2)
            if recording:
                row["stages"] = stages.summed([each.finish(r.commits) for each in recording])
            rows.append(row)
    if processes > 1:
        for base in bases:
            _, body = procs.http_get(base + "/metrics")
            forwarded = [line for line in body.decode().splitlines()
                         if line.startswith("coordinator_cluster_forwarded_total ")]
            print(f"{base}: {forwarded[0] if forwarded else 'no forwarding figure'}")


def bare_run(args, flow, tables: int, writers: int, bare: tuple[procs.Child, str], profile_dir: Path | None,
             key: str = "bare") -> dict:
    """The bare app at the same load as the flow's run: its commit request to as many tables, on as many
    connections, at the same offered rate (or closed loop); figures under `key` ("floor": the app with
    `--durable-file`)."""
    requests = [flow.sample_request(t) for t in range(tables)]
    connections = tables * writers
    offered = f" at {args.rate:g} requests/s offered" if args.rate else ", closed loop"
    what = "the bare quart-trio app" + (", a durable file per request" if key == "floor" else "")
    print(f"running {what}: {flow.name}'s commit request to {tables} tables on {connections} connections{offered}, "
          f"for {args.duration:g} s ...", flush=True)
    child, base = bare
    recording: list[stages.Recording] = []

    def on_start() -> None:
        if profile_dir is not None:
            recording.append(stages.Recording(child.pid, args.duration, profile_dir / f"pyspy-bare-{free_port()}.txt"))
    r = trio.run(hammer, base, requests, connections, args.duration, procs.CpuMeter(child.pid, None), args.rate,
                 on_start)
    out = {f"{key}_cpu_ms_per_request": r["server_cpu_ms_per_request"]}
    if recording:
        out[f"{key}_stages"] = recording[0].finish(r["requests"])
    return out


def wait_workers(base: str, supervisor: int, n: int, timeout_s: float = 30) -> list[int]:
    """`serve --workers n` on one port: its worker processes' pids, once every one of them is live and holds its
    share of the shards (each read of /metrics reaches whichever worker accepts the connection)."""
    deadline = time.monotonic() + timeout_s
    settled = 0
    while time.monotonic() < deadline:
        _, body = procs.http_get(base + "/metrics")
        figures = {line.split()[0]: float(line.split()[1]) for line in body.decode().splitlines()
                   if line.startswith(("coordinator_cluster_shards_held ", "coordinator_cluster_members_live "))}
        held, live = figures.get("coordinator_cluster_shards_held", 0), figures.get("coordinator_cluster_members_live")
        settled = settled + 1 if live == n and abs(held - 64 / n) <= 1 else 0
        if settled >= 10:
            pids = procs.children(supervisor)
            if len(pids) == n:
                return pids
        time.sleep(0.1)
    raise SystemExit(f"the {n} workers did not share the shards within {timeout_s} s")


def wait_balanced(bases: list[str], timeout_s: float = 30) -> None:
    """Until the members together hold every shard (they rebalance for a few lease rounds after starting)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        held = []
        for base in bases:
            _, body = procs.http_get(base + "/metrics")
            held += [float(line.split()[1]) for line in body.decode().splitlines()
                     if line.startswith("coordinator_cluster_shards_held ")]
        if sum(held) == 64 and len(held) == len(bases) and min(held) > 0:
            return
        time.sleep(0.2)
    raise SystemExit(f"the cluster did not take all shards within {timeout_s} s")


if __name__ == "__main__":
    main()
