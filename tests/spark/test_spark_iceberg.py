"""Spark, the way users run it: PySpark 3.5 + iceberg-spark-runtime 1.10 against the coordinator over real HTTP.

One SparkSession and one service for the module (JVM start-up dominates). Each test works in its own namespace.
The jars come from tests/spark/build_runtime.sh; without them the module is skipped locally, but fails under CI
(CI builds them, so their absence there is a broken pipeline, not an optional extra).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from datetime import datetime

import httpx
import pytest

from coordinator.spark import spark_session
from tests.conftest import fresh_database
from tests.support import fetch_token, write_auth_file
from tests.spark.session import BUILD_SCRIPT, SparkJarsMissing, jars

pytestmark = pytest.mark.spark

CATALOG = "coord"
SPARK_CLIENT, SPARK_SECRET = "spark", "spark-secret"
ADMIN_CLIENT, ADMIN_SECRET = "operator", "operator-secret"   # manages warehouses
STREAM_SECONDS = 33


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


@pytest.fixture(scope="module")
def spark_jars() -> list[str]:
    try:
        import pyspark  # noqa: F401
        return jars()
    except ImportError:
        why = f"PySpark 3.5 is not installed; bash {BUILD_SCRIPT} installs it and builds the Iceberg runtime"
    except SparkJarsMissing as exc:
        why = str(exc)  # names the build script
    if _in_ci():
        pytest.fail(f"CI must build the Spark runtime before the spark tests: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def module_service(pg_admin_dsn, tmp_path_factory):
    """Like tests/conftest.py's `service`, but shared by the module: a fresh database cloned from the template."""
    from api.server import EmbeddedService
    from coordinator.config import Config

    data_dir = tmp_path_factory.mktemp("spark-service")
    # Authentication on: Spark gets its token with `credential` (client credentials), as in production.
    auth_file = write_auth_file(data_dir / "auth.toml", {SPARK_CLIENT: (SPARK_SECRET, [("iceberg", ["admin"])]),
                                                         ADMIN_CLIENT: (ADMIN_SECRET, [("*", ["admin"])])})
    with fresh_database(pg_admin_dsn, "spark_") as database_url:
        config = Config(database_url=database_url, data_dir=data_dir, port=0, warehouse=str(data_dir / "warehouse"),
                        actor_idle_s=30, log_level="warning", auth_file=auth_file,
                        # (only tables that opt in are expired: test_the_service_expires_a_spark_tables_snapshots)
                        maintenance_interval_s=0.2, maintenance_delete_grace_s=0.0)
        with EmbeddedService(config) as base_url:
            yield base_url


@pytest.fixture(scope="module")
def spark(spark_jars, module_service):
    # Spark binds its driver to the first non-loopback address unless told otherwise.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = spark_session(module_service, CATALOG, jars=spark_jars, master="local[2]", app_name="coordinator-tests",
                            credential=f"{SPARK_CLIENT}:{SPARK_SECRET}",
                            conf={"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                                  "spark.sql.shuffle.partitions": "2",
                                  "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                                  "spark.sql.session.timeZone": "UTC",
                                  # the streaming test counts every micro-batch from recentProgress
                                  "spark.sql.streaming.numRecentProgressUpdates": "1000"})
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def ns(spark) -> str:
    name = "ns_" + uuid.uuid4().hex[:8]
    spark.sql(f"CREATE NAMESPACE {CATALOG}.{name}")
    return name


def rest_metadata(base_url: str, namespace: str, table: str) -> dict:
    """The table metadata as the REST API serves it (what any other engine would load)."""
    r = httpx.get(f"{base_url}/v1/namespaces/{namespace}/tables/{table}", timeout=10,
                  headers={"Authorization": f"Bearer {fetch_token(base_url, SPARK_CLIENT, SPARK_SECRET)}"})
    assert r.status_code == 200, r.text
    return r.json()["metadata"]


def rows(spark, query: str) -> list[tuple]:
    return [tuple(r) for r in spark.sql(query).collect()]


# -- DDL and DML ---------------------------------------------------------------------------------------------


def test_create_table_partitioned_by(spark, ns, module_service):
    t = f"{CATALOG}.{ns}.events"
    spark.sql(f"CREATE TABLE {t} (id bigint, category string, ts timestamp) USING iceberg "
              "PARTITIONED BY (category, days(ts))")
    spark.sql(f"INSERT INTO {t} VALUES (1, 'a', TIMESTAMP '2024-01-01 10:00:00'), "
              "(2, 'a', TIMESTAMP '2024-01-02 10:00:00'), (3, 'b', TIMESTAMP '2024-01-01 11:00:00')")

    assert rows(spark, f"SELECT id FROM {t} ORDER BY id") == [(1,), (2,), (3,)]
    assert rows(spark, f"SELECT count(*) FROM {t}.partitions") == [(3,)]
    meta = rest_metadata(module_service, ns, "events")
    spec = next(s for s in meta["partition-specs"] if s["spec-id"] == meta["default-spec-id"])
    assert [(f["name"], f["transform"]) for f in spec["fields"]] == [("category", "identity"), ("ts_day", "day")]
    assert meta["snapshots"][-1]["summary"]["added-records"] == "3"


def test_create_table_as_select(spark, ns, module_service):
    src, dst = f"{CATALOG}.{ns}.src", f"{CATALOG}.{ns}.dst"
    spark.sql(f"CREATE TABLE {src} (id bigint, v string) USING iceberg")
    spark.sql(f"INSERT INTO {src} VALUES (1, 'x'), (2, 'y'), (3, 'z')")
    # CTAS is Spark's staged create: stage-create, then one commit with assert-create.
    spark.sql(f"CREATE TABLE {dst} USING iceberg PARTITIONED BY (bucket(4, id)) AS SELECT * FROM {src} WHERE id > 1")
    assert rows(spark, f"SELECT id, v FROM {dst} ORDER BY id") == [(2, "y"), (3, "z")]
    # RTAS replaces schema, spec and data in one commit on the existing table.
    spark.sql(f"CREATE OR REPLACE TABLE {dst} USING iceberg AS SELECT id * 10 AS id10 FROM {src}")
    assert rows(spark, f"SELECT id10 FROM {dst} ORDER BY id10") == [(10,), (20,), (30,)]
    meta = rest_metadata(module_service, ns, "dst")
    current = next(s for s in meta["schemas"] if s["schema-id"] == meta["current-schema-id"])
    assert [f["name"] for f in current["fields"]] == ["id10"]


def test_insert_and_merge_into(spark, ns):
    t = f"{CATALOG}.{ns}.accounts"
    spark.sql(f"CREATE TABLE {t} (id bigint, balance int) USING iceberg")
    spark.sql(f"INSERT INTO {t} VALUES (1, 10), (2, 20)")
    spark.sql(f"INSERT INTO {t} SELECT 3, 30")
    spark.sql(f"""
        MERGE INTO {t} t
        USING (SELECT 2 AS id, 5 AS delta UNION ALL SELECT 4, 40 UNION ALL SELECT 1, -10) s
        ON t.id = s.id
        WHEN MATCHED AND t.balance + s.delta = 0 THEN DELETE
        WHEN MATCHED THEN UPDATE SET t.balance = t.balance + s.delta
        WHEN NOT MATCHED THEN INSERT (id, balance) VALUES (s.id, s.delta)
    """)
    assert rows(spark, f"SELECT id, balance FROM {t} ORDER BY id") == [(2, 25), (3, 30), (4, 40)]
    ops = [r[0] for r in spark.sql(f"SELECT operation FROM {t}.snapshots ORDER BY committed_at").collect()]
    assert ops == ["append", "append", "overwrite"]


def test_alter_table_add_column(spark, ns, module_service):
    t = f"{CATALOG}.{ns}.people"
    spark.sql(f"CREATE TABLE {t} (id bigint, name string) USING iceberg")
    spark.sql(f"INSERT INTO {t} VALUES (1, 'ann')")
    before = rest_metadata(module_service, ns, "people")["current-schema-id"]
    spark.sql(f"ALTER TABLE {t} ADD COLUMN age int COMMENT 'years'")
    spark.sql(f"INSERT INTO {t} VALUES (2, 'bob', 42)")

    assert rows(spark, f"SELECT id, name, age FROM {t} ORDER BY id") == [(1, "ann", None), (2, "bob", 42)]
    meta = rest_metadata(module_service, ns, "people")
    assert meta["current-schema-id"] != before
    current = next(s for s in meta["schemas"] if s["schema-id"] == meta["current-schema-id"])
    age = next(f for f in current["fields"] if f["name"] == "age")
    assert age["type"] == "int" and age["required"] is False and age.get("doc") == "years"
    assert age["id"] == meta["last-column-id"] == 3


# -- procedures ----------------------------------------------------------------------------------------------


def test_rewrite_data_files_and_expire_snapshots(spark, ns, module_service):
    t = f"{CATALOG}.{ns}.logs"
    spark.sql(f"CREATE TABLE {t} (id bigint, msg string) USING iceberg")
    for i in range(4):
        spark.sql(f"INSERT INTO {t} VALUES ({i}, 'm{i}')")
    assert rows(spark, f"SELECT count(*) FROM {t}.files") == [(4,)]

    result = spark.sql(f"CALL {CATALOG}.system.rewrite_data_files(table => '{ns}.logs', "
                       "options => map('min-input-files', '2'))").collect()[0]
    assert (result.rewritten_data_files_count, result.added_data_files_count) == (4, 1)
    assert rows(spark, f"SELECT count(*) FROM {t}.files") == [(1,)]
    assert rows(spark, f"SELECT operation FROM {t}.snapshots ORDER BY committed_at DESC LIMIT 1") == [("replace",)]

    expired = spark.sql(f"CALL {CATALOG}.system.expire_snapshots(table => '{ns}.logs', "
                        "older_than => TIMESTAMP '9999-12-31 00:00:00', retain_last => 1)").collect()[0]
    assert expired.deleted_data_files_count == 4  # the files the rewrite replaced
    assert expired.deleted_manifest_lists_count == 4
    meta = rest_metadata(module_service, ns, "logs")
    assert [s["snapshot-id"] for s in meta["snapshots"]] == [meta["current-snapshot-id"]]
    assert rows(spark, f"SELECT id FROM {t} ORDER BY id") == [(0,), (1,), (2,), (3,)]


# -- time travel ---------------------------------------------------------------------------------------------


def test_time_travel(spark, ns):
    t = f"{CATALOG}.{ns}.history"
    spark.sql(f"CREATE TABLE {t} (id bigint) USING iceberg")
    spark.sql(f"INSERT INTO {t} VALUES (1)")
    spark.sql(f"INSERT INTO {t} VALUES (2)")
    spark.sql(f"DELETE FROM {t} WHERE id = 1")
    snaps = rows(spark, f"SELECT snapshot_id, unix_millis(committed_at) FROM {t}.snapshots ORDER BY committed_at")
    assert len(snaps) == 3
    (first, first_ms), (second, second_ms), _ = snaps

    assert rows(spark, f"SELECT id FROM {t} ORDER BY id") == [(2,)]
    assert rows(spark, f"SELECT id FROM {t} VERSION AS OF {first} ORDER BY id") == [(1,)]
    assert rows(spark, f"SELECT id FROM {t} VERSION AS OF {second} ORDER BY id") == [(1,), (2,)]
    # TIMESTAMP AS OF picks the snapshot current at that instant (the snapshot-log).
    assert rows(spark, f"SELECT id FROM {t} TIMESTAMP AS OF timestamp_millis({first_ms}) ORDER BY id") == [(1,)]
    assert rows(spark, f"SELECT id FROM {t} TIMESTAMP AS OF timestamp_millis({second_ms}) ORDER BY id") == [
        (1,), (2,)]
    with pytest.raises(Exception, match="Cannot find a snapshot older than"):
        spark.sql(f"SELECT * FROM {t} TIMESTAMP AS OF timestamp_millis({first_ms - 1})").collect()


def test_the_service_expires_a_spark_tables_snapshots_and_every_retained_one_reads(spark, ns, module_service):
    """Snapshot expiry by the service (docs/maintenance.md) on a table Spark writes (merge appends: manifests are
    rewritten, and the ones only expired snapshots held are deleted): every snapshot kept reads in Spark."""
    t = f"{CATALOG}.{ns}.expiring"
    spark.sql(f"CREATE TABLE {t} (id bigint) USING iceberg TBLPROPERTIES ("
              "'maintenance.expire-snapshots.enabled'='true', 'history.expire.max-snapshot-age-ms'='1', "
              "'history.expire.min-snapshots-to-keep'='3', 'commit.manifest.min-count-to-merge'='2')")
    for i in range(8):
        spark.sql(f"INSERT INTO {t} VALUES ({i})")
    deadline = time.monotonic() + 30
    while len(rest_metadata(module_service, ns, "expiring")["snapshots"]) > 3:
        assert time.monotonic() < deadline, "the snapshots were not expired"
        time.sleep(0.2)
    spark.sql(f"REFRESH TABLE {t}")
    kept = rest_metadata(module_service, ns, "expiring")["snapshots"]
    assert [s["summary"]["total-records"] for s in kept] == ["6", "7", "8"]
    for s in kept:
        assert rows(spark, f"SELECT count(*) FROM {t} VERSION AS OF {s['snapshot-id']}") == [
            (int(s["summary"]["total-records"]),)]
    assert rows(spark, f"SELECT count(*) FROM {t}.snapshots") == [(3,)]
    assert rows(spark, f"SELECT sum(id) FROM {t}") == [(28,)]


# -- Structured Streaming ------------------------------------------------------------------------------------


def test_streaming_into_two_tables_with_concurrent_batch_appends(spark, ns, tmp_path):
    """A rate source feeds two tables every second for >30 s while a batch job appends to one of them.

    Every micro-batch and every batch append is a commit; the two writers of `a` race, so some commits meet
    409 and Spark retries them on fresh metadata. Nothing may be lost or applied twice.
    """
    a, b = f"{CATALOG}.{ns}.stream_a", f"{CATALOG}.{ns}.stream_b"
    for t in (a, b):
        spark.sql(f"CREATE TABLE {t} (value bigint, ts timestamp, src string) USING iceberg")

    source = (spark.readStream.format("rate").option("rowsPerSecond", 20).option("numPartitions", 1).load()
              .selectExpr("value", "timestamp AS ts", "'stream' AS src"))
    queries = [
        source.writeStream.format("iceberg").outputMode("append").trigger(processingTime="1 second")
        .option("checkpointLocation", str(tmp_path / name)).queryName(f"{ns}_{name}").toTable(table)
        for name, table in (("a", a), ("b", b))
    ]

    batch_rows, batch_errors = 0, []
    stop = threading.Event()

    def batch_job() -> None:
        nonlocal batch_rows
        i = 0
        try:
            while not stop.is_set():
                i += 1
                # negative values keep the batch rows apart from the stream's 0, 1, 2, ...
                spark.sql(f"INSERT INTO {a} SELECT -id - {i * 1000}, current_timestamp(), 'batch' "
                          "FROM range(1, 6)")
                batch_rows += 5
                stop.wait(0.5)
        except Exception as exc:  # reported by the test thread
            batch_errors.append(exc)

    worker = threading.Thread(target=batch_job, name="batch-appender")
    worker.start()
    try:
        deadline = time.monotonic() + STREAM_SECONDS
        while time.monotonic() < deadline:
            for q in queries:
                assert q.isActive, f"query {q.name} died: {q.exception()}"
            time.sleep(1)
    finally:
        stop.set()
        worker.join(timeout=60)
        for q in queries:
            # Stopping between triggers keeps the last micro-batch whole (it is either committed or never run);
            # on a loaded machine a batch can take tens of seconds, and a stop during it is our interruption.
            idle_by = time.monotonic() + 90
            while q.isActive and q.status["isTriggerActive"] and time.monotonic() < idle_by:
                time.sleep(0.05)
            q.stop()

    assert not batch_errors, batch_errors
    for q in queries:
        assert q.exception() is None, f"{q.name}: {q.exception()}"
    assert batch_rows >= 5 * 4, "the batch job raced the streams fewer than 4 times"   # (9 at a load of 12)

    written = {}
    for q, table in zip(queries, (a, b)):
        progress = {p["batchId"]: p["numInputRows"] for p in q.recentProgress}
        stamps = [datetime.fromisoformat(p["timestamp"]) for p in q.recentProgress]
        assert (max(stamps) - min(stamps)).total_seconds() >= 30, f"{q.name} ran for less than 30 s"
        assert len(progress) >= 15, f"{q.name}: only {len(progress)} micro-batches with a 1 s trigger"
        written[table] = sum(progress.values())
        # exactly once: every rate value 0..n-1 once, and one append snapshot per micro-batch (the sink commits
        # empty batches too: the epoch id in the summary is how it recognises a replayed batch)
        assert rows(spark, f"SELECT count(*), count(DISTINCT value), min(value), max(value) FROM {table} "
                           "WHERE src = 'stream'") == [(written[table], written[table], 0, written[table] - 1)]
        epochs = rows(spark, f"SELECT summary['spark.sql.streaming.epochId'] FROM {table}.snapshots "
                             "WHERE summary['spark.sql.streaming.queryId'] IS NOT NULL")
        assert sorted(int(e) for (e,) in epochs) == sorted(progress)

    assert rows(spark, f"SELECT count(*) FROM {a} WHERE src = 'batch'") == [(batch_rows,)]
    assert rows(spark, f"SELECT count(*) FROM {a}") == [(written[a] + batch_rows,)]
    assert rows(spark, f"SELECT count(*) FROM {b}") == [(written[b],)]


def test_a_catalog_with_a_named_warehouse_writes_there(spark, module_service, tmp_path):
    """`spark.sql.catalog.X.warehouse` names a warehouse: X's tables live in its root, apart from the default's."""
    lake = (tmp_path / "lake").as_uri()
    admin = {"Authorization": f"Bearer {fetch_token(module_service, ADMIN_CLIENT, ADMIN_SECRET)}"}
    made = httpx.post(f"{module_service}/api/coordinator/v1/warehouses", json={"name": "lake", "location": lake},
                      headers=admin, timeout=30)
    assert made.status_code == 201, made.text
    prefix = "spark.sql.catalog.lake"
    for key, value in {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "rest", ".uri": module_service,
                       ".warehouse": "lake", ".credential": f"{SPARK_CLIENT}:{SPARK_SECRET}",
                       ".oauth2-server-uri": module_service + "/v1/oauth/tokens"}.items():
        spark.conf.set(prefix + key, value)
    spark.sql("CREATE NAMESPACE lake.db")
    spark.sql("CREATE TABLE lake.db.events (id bigint, name string) USING iceberg")
    spark.sql("INSERT INTO lake.db.events VALUES (1, 'a'), (2, 'b')")
    assert rows(spark, "SELECT count(*) FROM lake.db.events") == [(2,)]
    r = httpx.get(f"{module_service}/v1/lake/namespaces/db/tables/events", timeout=10,
                  headers={"Authorization": f"Bearer {fetch_token(module_service, SPARK_CLIENT, SPARK_SECRET)}"})
    metadata = r.json()["metadata"]
    assert metadata["location"].startswith(lake + "/db/events-"), metadata["location"]
    assert (tmp_path / "lake" / "db").is_dir()
    assert rows(spark, f"SHOW NAMESPACES IN {CATALOG} LIKE 'db'") == []   # the default warehouse has no `db`


# -- Rebased appends (docs/rebasing.md) --------------------------------------------------------------------------

REBASE_STREAM_SECONDS = 20       # at least; until both queries have made REBASE_BATCHES and one was rebased
REBASE_STREAM_MAX_SECONDS = 180
REBASE_BATCHES = 5


def rebased_snapshots(base_url: str, namespace: str, table: str) -> int:
    return sum("-rebased-" in s["manifest-list"] for s in rest_metadata(base_url, namespace, table)["snapshots"])


def test_two_streaming_queries_append_to_one_table_with_rebasing(spark, ns, tmp_path, module_service):
    """Two Structured Streaming queries into ONE table with rebasing on, Spark's retries off: no micro-batch
    fails (a batch that lost the race to the other query is rebased by the service, not refused), and the table
    holds exactly the rows both sent. It runs until the queries have raced at least once (a rebased snapshot).
    (`python -m loadtest.spark_streaming --one-table` runs it for minutes.)"""
    t = f"{CATALOG}.{ns}.clicks"
    spark.sql(f"CREATE TABLE {t} (value bigint, ts timestamp, src string) USING iceberg TBLPROPERTIES "
              f"('commit.rebase-appends.enabled'='true', 'commit.retry.num-retries'='0')")
    queries = [
        spark.readStream.format("rate").option("rowsPerSecond", 20).option("numPartitions", 1).load()
        .selectExpr("value", "timestamp AS ts", f"'{name}' AS src")
        .writeStream.format("iceberg").outputMode("append").trigger(processingTime="0.5 seconds")
        .option("checkpointLocation", str(tmp_path / name)).queryName(f"{ns}_{name}").toTable(t)
        for name in ("web", "app")]
    try:
        started = time.monotonic()
        while time.monotonic() < started + REBASE_STREAM_MAX_SECONDS:
            for q in queries:
                assert q.isActive, f"query {q.name} died: {q.exception()}"
            time.sleep(1)
            if (time.monotonic() > started + REBASE_STREAM_SECONDS
                    and all(len(q.recentProgress) >= REBASE_BATCHES for q in queries)
                    and rebased_snapshots(module_service, ns, "clicks")):
                break
    finally:
        for q in queries:
            idle_by = time.monotonic() + 120   # (a busy machine may take long over a micro-batch)
            while q.isActive and q.status["isTriggerActive"] and time.monotonic() < idle_by:
                time.sleep(0.05)
            q.stop()
    for q, name in zip(queries, ("web", "app")):
        # (a failed micro-batch ends its query: the loop above checked that both ran to the end; a stop during the
        # trigger's sleep may leave an InterruptedException behind, which is the stop's, not a batch's)
        progress = {p["batchId"]: p["numInputRows"] for p in q.recentProgress}
        sent = sum(progress.values())
        assert len(progress) >= REBASE_BATCHES and sent > 0, progress
        assert rows(spark, f"SELECT count(*), count(DISTINCT value), min(value), max(value) FROM {t} "
                           f"WHERE src = '{name}'") == [(sent, sent, 0, sent - 1)]
    history = rows(spark, f"SELECT snapshot_id, parent_id FROM {t}.history ORDER BY made_current_at")
    assert all(parent == before for (_, parent), (before, _) in zip(history[1:], history)), "history not linear"
    rebased = rows(spark, f"SELECT count(*) FROM {t}.snapshots WHERE manifest_list LIKE '%-rebased-%'")[0][0]
    if rebased == 0:
        # Whether two queries race within the time is the machine's doing (in CI's full run, after the module's
        # other tests, they once did not in 180 s); the rows and history above hold either way, and
        # tests/test_iceberg_rebase.py races 16 pyiceberg processes for certain.
        pytest.skip(f"the two queries never raced in {REBASE_STREAM_MAX_SECONDS} s: nothing was rebased")


def test_spark_reads_what_pyiceberg_writers_appended_with_rebasing(spark, ns, module_service):
    """pyiceberg processes append into one table at once, every append landing (rebased): Spark reads the
    service's manifest lists and counts every row once."""
    from pyiceberg.catalog import load_catalog
    from tests.test_iceberg_rebase import APPENDS, PROCESSES, SCHEMA as WRITER_SCHEMA, run_writers
    properties = {"credential": f"{SPARK_CLIENT}:{SPARK_SECRET}",
                  "oauth2-server-uri": module_service + "/v1/oauth/tokens"}
    catalog = load_catalog("setup", type="rest", uri=module_service, **properties)
    catalog.create_table(f"{ns}.appended", WRITER_SCHEMA, properties={
        "commit.rebase-appends.enabled": "true", "commit.retry.num-retries": "0"})
    ids, failed, errors = run_writers(module_service, ns, "appended", PROCESSES, APPENDS, properties)
    assert failed == 0, errors
    total = PROCESSES * APPENDS   # (COORDINATOR_REBASE_WRITERS, as tests/test_iceberg_rebase.py)
    assert rows(spark, f"SELECT count(*), count(DISTINCT (writer, n)) FROM {CATALOG}.{ns}.appended") == [
        (total, total)]
    assert rows(spark, f"SELECT count(*) FROM {CATALOG}.{ns}.appended.snapshots") == [(total,)]
    print(f"Spark counts {total} rows of {PROCESSES} pyiceberg processes x {APPENDS} appends, each once")
