"""Point Spark at the coordinator's Iceberg REST catalog.

    from coordinator.spark import spark_session
    spark = spark_session("http://127.0.0.1:8181", jars=[...iceberg-spark-runtime jars...])
    spark.sql("CREATE TABLE coordinator.db.t (id bigint) USING iceberg")

`spark_conf` returns the same settings as a dict, for `spark-submit --conf` or an existing builder.
The Iceberg Spark runtime is not bundled: pass its jars (or set `spark.jars.packages` yourself).
"""

from __future__ import annotations

from typing import Any

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
SPARK_CATALOG = "org.apache.iceberg.spark.SparkCatalog"


def spark_conf(uri: str, catalog: str = "coordinator", warehouse: str | None = None,
               jars: list[str] | None = None, credential: str | None = None) -> dict[str, str]:
    """Spark settings registering `catalog` as an Iceberg REST catalog served at `uri` (the service's base URL).

    `warehouse` is sent to the server's `/v1/config` as the client's warehouse hint; the coordinator decides
    table locations either way. `credential` ("client_id:secret") makes Spark fetch its bearer token from the
    service's `/v1/oauth/tokens` (and refresh it before it expires).
    """
    prefix = f"spark.sql.catalog.{catalog}"
    conf = {
        # The extensions add MERGE INTO / UPDATE / DELETE row-level plans and the `CALL ...system.*` procedures.
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        prefix: SPARK_CATALOG,
        f"{prefix}.type": "rest",
        f"{prefix}.uri": uri.rstrip("/"),
    }
    if warehouse is not None:
        conf[f"{prefix}.warehouse"] = warehouse
    if credential is not None:
        conf[f"{prefix}.credential"] = credential
        conf[f"{prefix}.oauth2-server-uri"] = uri.rstrip("/") + "/v1/oauth/tokens"
    if jars:
        conf["spark.jars"] = ",".join(jars)
    return conf


def spark_session(uri: str, catalog: str = "coordinator", *, warehouse: str | None = None,
                  jars: list[str] | None = None, credential: str | None = None, master: str = "local[2]", app_name: str = "coordinator",
                  conf: dict[str, Any] | None = None):
    """A SparkSession configured with `spark_conf`; `conf` entries are applied last and override it.

    Built with `getOrCreate`: if this process already runs a session, Spark hands that one back and only the
    runtime SQL settings take effect (jars and extensions are fixed when the JVM starts), so call this first.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise RuntimeError("coordinator.spark.spark_session needs PySpark 3.5: pip install 'pyspark==3.5.*' "
                           "(plus the iceberg-spark-runtime-3.5_2.12 jars, passed as jars=...)") from None
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**spark_conf(uri, catalog, warehouse, jars, credential), **(conf or {})}.items():
        builder = builder.config(key, str(value))
    return builder.getOrCreate()
