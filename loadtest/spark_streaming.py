"""Spark Structured Streaming into N Iceberg tables through the coordinator: commits/s and commit latency.

    python -m loadtest.spark_streaming                          # starts an EmbeddedService (embedded PostgreSQL)
    python -m loadtest.spark_streaming --uri http://127.0.0.1:8181 --tables 8 --duration 120
    python -m loadtest.spark_streaming --one-table --tables 2 --duration 130 --warmup 10   # 2 queries, one table

`--one-table`: the queries (`--tables` of them) all append to one table, which has rebasing on
(`commit.rebase-appends.enabled`, docs/rebasing.md) and Spark's own retries off (`commit.retry.num-retries=0`), so
that a micro-batch that loses the race to another query is the service's to land, never Spark's retry: the run
fails if any query fails, and counts each query's rows in the table against what it sent. `--no-rebase` keeps the
one table's conflicts as 409s (Spark's default retries on), for comparison.

One streaming query per table (rate source -> Iceberg sink, fixed processing-time trigger); every micro-batch
is one Iceberg commit made by Spark's own REST client. Figures, over the window after --warmup:

  * Spark side (StreamingQuery progress): micro-batches committed per second, and per batch `addBatch`
    (write the data files + commit to the catalog) and `triggerExecution` (the whole micro-batch) latencies.
  * Spark's Iceberg client (its own CommitReports, which it POSTs to the catalog's `.../metrics` route and the
    service stores): commit duration (manifest list + REST commit + retries) and attempts per commit. Read
    from the service's database, so only with --database-url or when this script starts the service.
  * Service side (the service's /metrics, scraped at both ends of the window): commit requests per second
    by status and the commit request latency percentiles (estimated from the histogram buckets).

Needs PySpark 3.5 and the Iceberg runtime jars from tests/spark/build_runtime.sh (or pass --jars).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from coordinator.spark import spark_session

COMMIT_ROUTE_SUFFIX = "/namespaces/<namespace>/tables/<table>"


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def scrape_commits(base: str) -> dict[str, dict[float, float]]:
    """Cumulative bucket counts of the table-commit route, by status class: {"2xx": {le: count}}."""
    text = httpx.get(base.rstrip("/") + "/metrics", timeout=10).text
    out: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "coordinator_request_seconds":
            continue
        for s in family.samples:
            route = s.labels.get("route", "")
            if s.name.endswith("_bucket") and route.startswith("POST ") and route.endswith(COMMIT_ROUTE_SUFFIX):
                buckets = out.setdefault(s.labels["status"], {})
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
    return out


def histogram_pct(buckets: dict[float, float], p: float) -> float:
    """Percentile from cumulative buckets, interpolating linearly inside the bucket (Prometheus' method)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0
    if not total:
        return float("nan")
    rank, lower, below = p / 100 * total, 0.0, 0.0
    for le in bounds:
        if buckets[le] >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(buckets[le] - below, 1e-9)
        lower, below = le, buckets[le]
    return lower


def diff(after: dict[str, dict[float, float]], before: dict[str, dict[float, float]]) -> dict[str, dict[float, float]]:
    return {st: {le: n - before.get(st, {}).get(le, 0.0) for le, n in b.items()} for st, b in after.items()}


def commit_reports(database_url: str, namespace: str, since: float, until: float) -> list[tuple[float, int]]:
    """(duration_s, attempts) of every Iceberg CommitReport the tables in `namespace` sent in the window."""
    import asyncio

    import asyncpg

    async def fetch():
        con = await asyncpg.connect(database_url)
        try:
            return await con.fetch(
                "SELECT (report->'metrics'->'total-duration'->>'total-duration')::float8 / 1e9 AS s,"
                " coalesce((report->'metrics'->'attempts'->>'value')::int, 1) AS attempts"
                " FROM iceberg_metric_reports WHERE report_type = 'commit-report'"
                " AND report->>'table-name' LIKE $1"
                " AND created_at >= to_timestamp($2) AND created_at < to_timestamp($3)",
                f"%{namespace}.%", since, until)
        finally:
            await con.close()
    return [(r["s"], r["attempts"]) for r in asyncio.run(fetch()) if r["s"] is not None]


def default_jars() -> list[str]:
    from tests.spark.session import SparkJarsMissing, jars
    try:
        return jars()
    except SparkJarsMissing as exc:
        raise SystemExit(str(exc)) from None


def run(base: str, args: argparse.Namespace, database_url: str | None) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    jars = args.jars.split(",") if args.jars else default_jars()
    batches_expected = int((args.duration + 10) / args.trigger_s) + 100
    spark = spark_session(base, args.catalog, jars=jars, master=args.master, app_name="coordinator-spark-loadtest",
                          conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                                "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                                "spark.ui.showConsoleProgress": "false",
                                "spark.sql.streaming.numRecentProgressUpdates": str(batches_expected)})
    spark.sparkContext.setLogLevel("ERROR")
    namespace = f"loadtest_{uuid.uuid4().hex[:8]}"
    ns = f"{args.catalog}.{namespace}"
    checkpoints = Path(args.checkpoint_dir or tempfile.mkdtemp(prefix="coordinator-spark-loadtest-"))
    spark.sql(f"CREATE NAMESPACE {ns}")
    if args.one_table:
        tables = [f"{ns}.t0"] * args.tables
        rebase = "false" if args.no_rebase else "true"
        retries = "" if args.no_rebase else ", 'commit.retry.num-retries'='0'"
        spark.sql(f"CREATE TABLE {tables[0]} (value bigint, ts timestamp, src string) USING iceberg "
                  f"TBLPROPERTIES ('commit.rebase-appends.enabled'='{rebase}'{retries})")
    else:
        tables = [f"{ns}.t{i}" for i in range(args.tables)]
        for t in tables:
            spark.sql(f"CREATE TABLE {t} (value bigint, ts timestamp) USING iceberg")

    print(f"{args.tables} streaming queries{' into one table' if args.one_table else ''}, "
          f"{args.rows_per_second} rows/s each, trigger {args.trigger_s} s, "
          f"{args.duration:.0f} s (first {args.warmup:.0f} s not measured), master {args.master}, service {base}",
          flush=True)
    queries = []
    for i, t in enumerate(tables):
        columns = ("value", "timestamp AS ts") + ((f"'q{i}' AS src",) if args.one_table else ())
        df = (spark.readStream.format("rate").option("rowsPerSecond", args.rows_per_second)
              .option("numPartitions", 1).load().selectExpr(*columns))
        queries.append(df.writeStream.format("iceberg").outputMode("append")
                       .trigger(processingTime=f"{args.trigger_s} seconds")
                       .option("checkpointLocation", str(checkpoints / f"t{i}")).toTable(t))

    started = time.time()
    time.sleep(args.warmup)
    window_start, before = time.time(), scrape_commits(base)
    failed = None
    while time.time() < started + args.duration and failed is None:
        time.sleep(1)
        failed = next((q for q in queries if not q.isActive), None)
    window_end, after = time.time(), scrape_commits(base)
    for q in queries:
        # stop between triggers so the last micro-batch is whole
        idle_by = time.monotonic() + 120   # (a busy machine may take long over a micro-batch)
        while q.isActive and q.status["isTriggerActive"] and time.monotonic() < idle_by:
            time.sleep(0.05)
        q.stop()
    if failed is not None:
        raise SystemExit(f"streaming query into {failed.name or 'a table'} failed: {failed.exception()}")

    elapsed = window_end - window_start
    add_batch, trigger, commits, rows_written = [], [], 0, {}
    for i, (q, t) in enumerate(zip(queries, tables)):
        progress = q.recentProgress
        rows_written[(t, f"q{i}") if args.one_table else t] = sum(p["numInputRows"] for p in progress)
        for p in progress:
            at = datetime.fromisoformat(p["timestamp"]).timestamp()
            if window_start <= at < window_end:
                commits += 1
                add_batch.append(p["durationMs"].get("addBatch", 0) / 1000)
                trigger.append(p["durationMs"].get("triggerExecution", 0) / 1000)
    reports = commit_reports(database_url, namespace, window_start, window_end) if database_url else []
    if args.one_table:   # each query's rows, each value once
        lost = [src for (t, src), n in rows_written.items() if tuple(spark.sql(
            f"SELECT count(*), count(DISTINCT value) FROM {t} WHERE src = '{src}'").collect()[0]) != (n, n)]
        snapshots = spark.sql(f"SELECT count(*), count_if(manifest_list LIKE '%-rebased-%') "
                              f"FROM {tables[0]}.snapshots").collect()[0]
    else:
        lost = [t for t in tables if spark.sql(f"SELECT count(*) FROM {t}").collect()[0][0] != rows_written[t]]

    window = diff(after, before)
    ok = window.get("2xx", {}).get(float("inf"), 0.0)
    conflicts = window.get("4xx", {}).get(float("inf"), 0.0)
    errors = window.get("5xx", {}).get(float("inf"), 0.0)
    ms = lambda s: f"{s * 1000:.1f}"  # noqa: E731
    print()
    print(f"measured window: {elapsed:.1f} s, {commits} micro-batches")
    print(f"spark:   {commits / elapsed:.2f} commits/s; addBatch (files + commit) p50 {ms(pct(add_batch, 50))} ms, "
          f"p95 {ms(pct(add_batch, 95))} ms, max {ms(max(add_batch, default=float('nan')))} ms; "
          f"micro-batch p50 {ms(pct(trigger, 50))} ms, p95 {ms(pct(trigger, 95))} ms"
          + (f", mean {ms(statistics.fmean(trigger))} ms" if trigger else ""))
    if reports:
        durations = [d for d, _ in reports]
        print(f"iceberg: {len(reports)} commit reports; commit p50 {ms(pct(durations, 50))} ms, "
              f"p95 {ms(pct(durations, 95))} ms, max {ms(max(durations))} ms; "
              f"{sum(a for _, a in reports) - len(reports)} retried attempts")
    served = window.get("2xx", {})
    print(f"service: {ok / elapsed:.2f} commits/s (2xx {ok:.0f}, 4xx {conflicts:.0f}, 5xx {errors:.0f}); "
          f"commit request p50 {ms(histogram_pct(served, 50))} ms, p95 {ms(histogram_pct(served, 95))} ms, "
          f"p99 {ms(histogram_pct(served, 99))} ms")
    if args.one_table:
        print(f"table:   {snapshots[0]} snapshots, {snapshots[1]} of them rebased by the service; "
              f"{len(queries)} queries ran to the end, none failed")
    print(f"rows:    {sum(rows_written.values())} written, "
          + (("the table holds exactly what each query wrote, each row once" if args.one_table else
              "every table holds exactly what its query wrote") if not lost else f"MISMATCH in {lost}"))
    spark.stop()
    if not args.checkpoint_dir:
        shutil.rmtree(checkpoints, ignore_errors=True)
    if lost:
        raise SystemExit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", help="a running coordinator's base URL; default: start an EmbeddedService here")
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--rows-per-second", type=int, default=100, help="per table")
    ap.add_argument("--trigger-s", type=float, default=1.0)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds, then everything stops")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds at the start left out of the figures")
    ap.add_argument("--catalog", default="coordinator")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--jars", 
                    help="comma-separated Iceberg Spark runtime jars; default: tests/spark/build_runtime.sh's")
    ap.add_argument("--database-url", help="the service's PostgreSQL, to read Spark's commit reports (with --uri)")
    ap.add_argument("--checkpoint-dir")
    ap.add_argument("--one-table", action="store_true",
                    help="all queries append to one table, rebasing on and Spark's retries off (see above)")
    ap.add_argument("--no-rebase", action="store_true", help="with --one-table: rebasing off, Spark's retries on")
    args = ap.parse_args()
    if args.warmup >= args.duration:
        ap.error("--warmup must be shorter than --duration")
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise SystemExit("needs PySpark 3.5: bash tests/spark/build_runtime.sh installs it with the jars") from None

    if args.uri:
        run(args.uri, args, args.database_url)
        return
    from api.server import EmbeddedService
    print("starting an EmbeddedService with an embedded PostgreSQL ...", flush=True)
    service = EmbeddedService(log_level="warning")
    with service as base:
        run(base, args, service.coordinator.store.dsn)


if __name__ == "__main__":
    main()
