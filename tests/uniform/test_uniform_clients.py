"""Real clients read Delta tables through the Iceberg mount and see exactly the rows of the Delta snapshot (delta-rs
reading the same table), after appends, a delete of a file, an overwrite, OPTIMIZE and an added column: pyiceberg,
DuckDB 1.4 with its iceberg extension, and Spark 3.5 with Iceberg 1.10 (skipped without its runtime, as in
tests/spark). Both kinds of table: one whose writer converts to Iceberg itself and sends `uniform.iceberg`, and one
the service converts."""

from __future__ import annotations


import pyarrow as pa
import pytest

from tests.conftest import fresh_database
from tests.delta.conftest import UC
from tests.spark.test_spark_iceberg import spark_jars  # noqa: F401 (the fixture: skipped without the runtime)

from .conftest import MOUNT, duckdb_catalog, iceberg_catalog, wait_converted
from .support import ManagedDelta, PyicebergWriter, batch, ordered


CATALOG = "uniform_clients"


@pytest.fixture(scope="module")
def module_service(pg_admin_dsn, tmp_path_factory):
    """One service for the module (Spark's session, like its JVM, is started once)."""
    from api.server import EmbeddedService
    from coordinator.config import Config
    data_dir = tmp_path_factory.mktemp("uniform-clients")
    with fresh_database(pg_admin_dsn, "uniform_") as database_url:
        config = Config(database_url=database_url, data_dir=data_dir, port=0, warehouse=str(data_dir / "warehouse"),
                        shutdown_grace_s=0.5)
        with EmbeddedService(config) as base_url:
            yield base_url


@pytest.fixture(scope="module")
def spark(module_service, spark_jars):  # noqa: F811
    from coordinator.spark import spark_session
    # No catalog cache: each read loads the table, as a fresh query of another engine would.
    # A catalog name of its own: a session another module started is handed back (getOrCreate), and the catalogs
    # it initialized keep their own service's URI.
    session = spark_session(module_service + MOUNT, CATALOG, warehouse="main", jars=spark_jars,
                            app_name="uniform-clients", conf={f"spark.sql.catalog.{CATALOG}.cache-enabled": "false"})
    yield session
    session.stop()


def steps(md: ManagedDelta):
    yield "append", lambda: md.append(batch(range(3, 6), "b"))
    yield "append", lambda: md.append(batch(range(6, 9), "c"))
    yield "delete a file", lambda: md.delete_file(0)
    yield "overwrite", lambda: md.overwrite(batch(range(100, 104), "d"))
    yield "append", lambda: md.append(batch(range(200, 203), "e"))
    yield "OPTIMIZE", lambda: md.optimize()
    yield "added column", lambda: md.add_column(pa.table({"id": pa.array([300, 301], pa.int64()),
                                                          "name": ["f300", "f301"],
                                                          "score": pa.array([1.5, None], pa.float64())}))


@pytest.mark.parametrize("kind", ["service", "writer"])
def test_pyiceberg_duckdb_and_spark_read_the_delta_snapshot(module_service, tmp_path, kind, request):
    uc = UC(module_service)
    name = f"{kind}_events"
    if kind == "writer":
        md = ManagedDelta(uc, name, tmp_path, properties={"delta.universalFormat.enabledFormats": "iceberg"},
                          uniform=PyicebergWriter(tmp_path))
    else:
        md = ManagedDelta(uc, name, tmp_path)
    md.create(batch(range(0, 3), "a"))
    if kind == "writer":
        md.append(batch(range(10, 12), "w"))   # (its version 0, a create, carries no conversion)
    catalog = iceberg_catalog(module_service)
    duck = duckdb_catalog(module_service)
    spark = request.getfixturevalue("spark") if _spark_available(request) else None
    for what, step in [("create", lambda: md.version), *steps(md)]:
        version = step()
        table = wait_converted(catalog, f"default.{name}", version)
        delta = md.rows(version)
        assert ordered(table.scan().to_arrow().to_pylist()) == delta, (kind, what, "pyiceberg")
        got = duck.execute(f"SELECT * FROM uc.default.{name}").fetch_arrow_table().to_pylist()
        assert ordered(got) == delta, (kind, what, "duckdb")
        if spark is not None:
            got = [row.asDict() for row in spark.table(f"{CATALOG}.default.{name}").collect()]
            assert ordered(got) == delta, (kind, what, "spark")
    uc.http.close()


def _spark_available(request) -> bool:
    try:
        request.getfixturevalue("spark_jars")
    except pytest.skip.Exception:
        return False
    return True
