"""What a user would pick instead of the coordinator, and the floor under everyone: measured in the same run.

* `pg_group_commit`: PostgreSQL's durable commit rate on this disk (asyncpg, `synchronous_commit=on`): one
  connection committing single-row transactions (one WAL flush each), many connections doing the same (the
  server groups their flushes), and one connection committing batches (rows per flush).
* `SqlCatalog` (pyiceberg) on the same PostgreSQL: each writer is its own process (as independent jobs are)
  running the same Iceberg commit as the coordinator's clients: add-snapshot + set-snapshot-ref guarded by
  assert-ref-snapshot-id; on CommitFailedException wait as the Java client does (`retry.py`), reload and
  retry. The catalog's work (read the current
  metadata file, apply, write the new file, compare-and-set the row) happens in the writers.
* lance's `RestAdapter("dir", {..., "table_version_tracking_enabled": "true"})`, the reference Lance Namespace
  server, in its own process: driven by the same Lance flow as the coordinator.

Subcommands (used by the benchmark; runnable by hand):

    python -m loadtest.baselines sqlcatalog-writer --setup --uri postgresql+psycopg2://... --warehouse file:///...
        --duration 10 [--retry at-once]    # prints "ready", then type "go"
    python -m loadtest.baselines lance-rest --root /tmp/lance-root --port 2333
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

from .procs import ROOT, CpuMeter
from .retry import MODES, schedule

SQL_NAMESPACE = "bench"
SQL_TABLE = "hot"

# -- PostgreSQL's own durable commit rate ---------------------------------------------------------------------


async def _pg_group_commit(dsn: str, duration_s: float, connections: int) -> list[dict]:
    import asyncpg
    payload = json.dumps({"metadata-location": "file:///warehouse/ns/t/metadata/00001-" + str(uuid.uuid4())
                          + ".metadata.json", "previous": "file:///warehouse/ns/t/metadata/00000.metadata.json"})
    admin = await asyncpg.connect(dsn)
    await admin.execute("DROP TABLE IF EXISTS loadtest_group_commit")
    await admin.execute("CREATE TABLE loadtest_group_commit (table_id uuid, version bigint, payload jsonb,"
                        " PRIMARY KEY (table_id, version))")
    sync = await admin.fetchval("SHOW synchronous_commit")
    fsync = await admin.fetchval("SHOW fsync")
    await admin.close()
    pool = await asyncpg.create_pool(dsn, min_size=connections, max_size=connections)
    out = []

    async def single(con, table_id: uuid.UUID, deadline: float) -> int:
        n = 0
        while time.perf_counter() < deadline:
            await con.execute("INSERT INTO loadtest_group_commit VALUES ($1, $2, $3)", table_id, n, payload)
            n += 1
        return n

    async def measure(label: str, conns: int, batch: int) -> None:
        cons = [await pool.acquire() for _ in range(conns)]
        try:
            t0 = time.perf_counter()
            deadline = t0 + duration_s
            if batch == 1:
                counts = await asyncio.gather(*(single(c, uuid.uuid4(), deadline) for c in cons))
                txns = rows = sum(counts)
            else:
                txns = rows = 0
                table_id = uuid.uuid4()
                while time.perf_counter() < deadline:
                    versions = list(range(rows, rows + batch))
                    await cons[0].execute(
                        "INSERT INTO loadtest_group_commit SELECT $1, v, $3::jsonb FROM unnest($2::bigint[]) v",
                        table_id, versions, payload)
                    txns += 1
                    rows += batch
            elapsed = time.perf_counter() - t0
        finally:
            for c in cons:
                await pool.release(c)
        out.append({"scenario": label, "connections": conns, "rows_per_txn": batch,
                    "txn_per_s": round(txns / elapsed, 1), "rows_per_s": round(rows / elapsed, 1),
                    "ms_per_txn": round(1000 * elapsed * conns / max(txns, 1), 3),
                    "synchronous_commit": sync, "fsync": fsync})

    await measure("1 conn, 1 row/txn", 1, 1)
    await measure(f"{connections} conns, 1 row/txn", connections, 1)
    await measure("1 conn, 64 rows/txn", 1, 64)
    await pool.close()
    admin = await asyncpg.connect(dsn)
    await admin.execute("DROP TABLE loadtest_group_commit")
    await admin.close()
    return out


def pg_group_commit(dsn: str, duration_s: float, connections: int = 16) -> list[dict]:
    return asyncio.run(_pg_group_commit(dsn, duration_s, connections))


# -- pyiceberg SqlCatalog ---------------------------------------------------------------------------------------


def _catalog(uri: str, warehouse: str):
    from pyiceberg.catalog.sql import SqlCatalog
    return SqlCatalog("loadtest", uri=uri, warehouse=warehouse)


def sqlcatalog_setup(uri: str, warehouse: str) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType
    cat = _catalog(uri, warehouse)
    cat.create_namespace_if_not_exists(SQL_NAMESPACE)
    ident = f"{SQL_NAMESPACE}.{SQL_TABLE}"
    if cat.table_exists(ident):
        cat.purge_table(ident)
    cat.create_table(ident, Schema(NestedField(1, "id", LongType(), required=False),
                                   NestedField(2, "data", StringType(), required=False)))


def sqlcatalog_writer(uri: str, warehouse: str, duration_s: float, setup: bool, retry_mode: str = "client") -> dict:
    """One writer process, driven over stdin/stdout so that start-up (imports) is never measured:
    the `setup` writer creates the table and says "ready"; the others say "imported", wait for "load" (the
    table exists by then), load it and say "ready"; all then wait for "go" and commit for `duration_s`."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table.snapshots import Operation, Snapshot, Summary
    from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate

    def expect(word: str) -> None:
        if sys.stdin.readline().strip() != word:
            raise SystemExit(f"expected {word!r} on stdin")

    if setup:
        sqlcatalog_setup(uri, warehouse)
    else:
        print("imported", flush=True)
        expect("load")
    cat = _catalog(uri, warehouse)
    ident = f"{SQL_NAMESPACE}.{SQL_TABLE}"
    rng = random.Random()

    def reload():
        t = cat.load_table(ident)
        return t, t.metadata.current_snapshot_id, t.metadata.last_sequence_number

    table, parent, seq = reload()
    print("ready", flush=True)
    expect("go")
    cpu0 = time.process_time()
    end = time.perf_counter() + duration_s
    commits = conflicts = errors = gave_up = 0
    latencies = []
    while time.perf_counter() < end:
        started = time.perf_counter()
        retry = schedule("iceberg", retry_mode, rng, started)
        while time.perf_counter() < end:
            new_id = rng.getrandbits(62)
            snap = Snapshot(snapshot_id=new_id, parent_snapshot_id=parent, sequence_number=seq + 1,
                            timestamp_ms=int(time.time() * 1000),
                            manifest_list=f"file:///tmp/loadtest/snap-{new_id}-{uuid.uuid4()}.avro",
                            summary=Summary(Operation.APPEND, **{"added-data-files": "1", "added-records": "100",
                                                                 "added-files-size": "4096"}),
                            schema_id=0)
            try:
                cat.commit_table(table, (AssertRefSnapshotId(ref="main", snapshot_id=parent),),
                                 (AddSnapshotUpdate(snapshot=snap),
                                  SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=new_id)))
            except CommitFailedException:
                conflicts += 1
                wait = retry.next_wait(time.perf_counter(), end)
                if wait is not None:
                    time.sleep(wait)
                table, parent, seq = reload()
                if wait is None:
                    gave_up += 1
                    break
                continue
            except Exception as exc:  # noqa: BLE001 - counted and reported, the run goes on
                errors += 1
                print(f"sqlcatalog writer error: {exc}", file=sys.stderr)
                table, parent, seq = reload()
                continue
            parent, seq = new_id, seq + 1
            commits += 1
            latencies.append(time.perf_counter() - started)
            break
    return {"commits": commits, "conflicts": conflicts, "errors": errors, "gave_up": gave_up, "latencies_s": latencies,
            "cpu_s": time.process_time() - cpu0}


def sqlcatalog_hot_table(uri: str, warehouse: str, writers: int, duration_s: float, pg_pid: int | None,
                         log: Path, retry_mode: str = "client") -> dict:
    """`writers` processes on one table; returns commits/s, latency and CPU (writers' and PostgreSQL's)."""
    from .runner import pct
    argv = [sys.executable, "-m", "loadtest.baselines", "sqlcatalog-writer", "--uri", uri, "--warehouse", warehouse,
            "--duration", str(duration_s), "--retry", retry_mode]
    with open(log, "ab") as err:
        procs = [subprocess.Popen(argv + (["--setup"] if i == 0 else []), cwd=ROOT, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=err) for i in range(writers)]

        def expect(p: subprocess.Popen, word: bytes) -> None:
            line = p.stdout.readline().strip()
            if line != word:
                raise SystemExit(f"a SqlCatalog writer said {line!r} instead of {word!r} (exit {p.poll()}); "
                                 f"see {log}")

        def say(p: subprocess.Popen, word: bytes) -> None:
            p.stdin.write(word + b"\n")
            p.stdin.flush()
        try:
            expect(procs[0], b"ready")
            for p in procs[1:]:
                expect(p, b"imported")
                say(p, b"load")
            for p in procs[1:]:
                expect(p, b"ready")
            meter = CpuMeter(None, pg_pid)
            meter.start()
            for p in procs:
                say(p, b"go")
            outs = [p.communicate(timeout=duration_s + 120)[0] for p in procs]
            cpu = meter.stop()
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    results = []
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"a SqlCatalog writer failed (exit {p.returncode}); it printed "
                             f"{out.decode(errors='replace')[-2000:]!r}; see {log}")
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    commits = sum(r["commits"] for r in results)
    latencies = [x for r in results for x in r["latencies_s"]]
    client_cpu = sum(r["cpu_s"] for r in results)
    return {"commits": commits, "commits_per_s": round(commits / cpu.wall_s, 1),
            "conflicts": sum(r["conflicts"] for r in results), "errors": sum(r["errors"] for r in results),
            "gave_up": sum(r["gave_up"] for r in results),
            "p50_ms": round(pct(latencies, 50) * 1000, 2), "p99_ms": round(pct(latencies, 99) * 1000, 2),
            "client_cpu_ms_per_commit": round(1000 * client_cpu / max(commits, 1), 3),
            "pg_cpu_ms_per_commit": round(1000 * cpu.pg_s / max(commits, 1), 3) if pg_pid else None}


# -- lance RestAdapter --------------------------------------------------------------------------------------------


def lance_rest(root: str, port: int) -> None:
    """Serve until killed (SIGTERM's default action: the benchmark throws its directory away anyway).

    `lance.namespace.RestAdapter` is a thin wrapper over the Rust `PyRestAdapter`; importing `lance.namespace`
    also imports the generated REST client's models, which takes ~8 s here, so the binding is used directly
    when it is there (same server, same arguments)."""
    props = {"root": root, "table_version_tracking_enabled": "true"}
    try:
        from lance.lance import PyRestAdapter
        adapter = PyRestAdapter("dir", props, None, "127.0.0.1", port)
    except ImportError:
        import lance.namespace
        adapter = lance.namespace.RestAdapter("dir", props, host="127.0.0.1", port=port)
    adapter.start()
    print(f"lance RestAdapter serving {root} on 127.0.0.1:{adapter.port}", flush=True)
    while True:
        time.sleep(3600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sqlcatalog-writer", help="one writer process (protocol on stdin/stdout, see the code)")
    s.add_argument("--uri", required=True, help="SQLAlchemy URL, e.g. postgresql+psycopg2://u@host:port/db")
    s.add_argument("--warehouse", required=True, help="file:///... where the metadata files go")
    s.add_argument("--duration", type=float, required=True)
    s.add_argument("--setup", action="store_true", help="create (or re-create) the table first")
    s.add_argument("--retry", choices=MODES, default="client", help="how a writer waits after a conflict")
    s = sub.add_parser("lance-rest")
    s.add_argument("--root", required=True)
    s.add_argument("--port", type=int, default=2333)
    args = ap.parse_args()
    if args.cmd == "sqlcatalog-writer":
        print(json.dumps(sqlcatalog_writer(args.uri, args.warehouse, args.duration, args.setup, args.retry)),
              flush=True)
    else:
        lance_rest(args.root, args.port)


if __name__ == "__main__":
    main()
