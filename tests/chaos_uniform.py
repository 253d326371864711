"""The chaos run's UniForm table: a Delta table the service converts to Iceberg, committed to under the same kills
as the others, with real staged commits and data files (one per commit, named after the commit's id).

What is checked, besides everything the run checks of any Delta table:
- after every restart, the Iceberg side never shows a Delta version the Delta side does not have (`sample`);
- at the end, the Iceberg side catches up with the Delta side, and every snapshot it keeps holds exactly the data
  files of the Delta versions up to the one it says it converts (`check_iceberg_side`).
"""

from __future__ import annotations

import io
import json
import time
import uuid

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

from tests.delta.conftest import FIRST, PREFIX, UC, table_properties

TABLE = "tu"
MOUNT = "/api/2.1/unity-catalog/iceberg/v1/catalogs/main/namespaces/{schema}/tables/{table}"
PROPERTIES = {"delta.universalFormat.enabledFormats": "iceberg", "delta.enableIcebergCompatV2": "true",
              "delta.columnMapping.mode": "name"}
SCHEMA = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {
    "delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-id"}}]}
CATCH_UP_S = 120


def create(base: str, schema: str, files) -> dict:
    """The table, its version 0 (a catalog-managed, IcebergCompatV2 table with column mapping) written by `files`."""
    uc = UC(base)
    try:
        uc.setup_schema("main", schema)
        st = uc.staging(TABLE, schema=schema)
        now = int(time.time() * 1000)
        actions = [{"commitInfo": {"inCommitTimestamp": now, "timestamp": now, "operation": "CREATE TABLE"}},
                   {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                                 "readerFeatures": ["catalogManaged", "vacuumProtocolCheck", "columnMapping"],
                                 "writerFeatures": ["catalogManaged", "inCommitTimestamp", "vacuumProtocolCheck",
                                                    "columnMapping", "icebergCompatV2"]}},
                   {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                                 "schemaString": json.dumps(SCHEMA), "partitionColumns": [], "createdTime": now,
                                 "configuration": {**PROPERTIES, "delta.enableInCommitTimestamps": "true",
                                                   "delta.columnMapping.maxColumnId": "1",
                                                   "io.unitycatalog.tableId": st["id"]}}}]
        files.write_log(st["staging_location"], FIRST, b"".join(json.dumps(a).encode() + b"\n" for a in actions))
        r = uc.post("/tables", json={"name": TABLE, "catalog_name": "main", "schema_name": schema,
                                     "table_type": "MANAGED", "data_source_format": "DELTA",
                                     "columns": SCHEMA["fields"], "storage_location": st["staging_location"],
                                     "properties": {**table_properties(st["id"], now), **PROPERTIES}})
        assert r.status_code == 200, r.text
        return r.json()
    finally:
        uc.http.close()


def data_file(cid: str) -> tuple[str, bytes, dict]:
    """A commit's data file (one row), its bytes and its add action, as an IcebergCompatV2 writer writes them."""
    value = int(cid[:8], 16)
    table = pa.table([pa.array([value], pa.int64())],
                     schema=pa.schema([pa.field("col-id", pa.int64(), metadata={b"PARQUET:field_id": b"1"})]))
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    name = f"data/{cid}.parquet"
    stats = {"numRecords": 1, "minValues": {"col-id": value}, "maxValues": {"col-id": value},
             "nullCount": {"col-id": 0}}
    add = {"path": name, "partitionValues": {}, "size": len(buffer.getvalue()), "modificationTime": 1,
           "dataChange": True, "stats": json.dumps(stats)}
    return name, buffer.getvalue(), add


def staged_commit(add: dict) -> bytes:
    now = int(time.time() * 1000)
    actions = [{"commitInfo": {"inCommitTimestamp": now, "timestamp": now, "operation": "WRITE"}}, {"add": add}]
    return b"".join(json.dumps(a).encode() + b"\n" for a in actions)


def sample(base: str, schema: str, info: dict) -> list[str]:
    """After a restart: the Iceberg side shows no Delta version beyond the Delta side's latest."""
    try:
        iceberg = httpx.get(base + MOUNT.format(schema=schema, table=TABLE), timeout=30)
        delta = httpx.get(base + PREFIX + "/delta/commits", timeout=30,
                          params={"table_id": info["table_id"], "table_uri": info["storage_location"]})
    except httpx.HTTPError:
        return []
    if iceberg.status_code != 200 or delta.status_code != 200:
        return []
    shown = int(iceberg.json()["metadata"]["properties"].get("delta-version", -1))
    latest = delta.json()["latest_table_version"]
    return [f"the Iceberg side shows Delta version {shown}, beyond the Delta side's {latest}"] if shown > latest \
        else []


def check_iceberg_side(base: str, schema: str, entries: list[tuple[int, str | None]],
                       s3_properties: dict | None = None) -> list[str]:
    """At the end (see the module doc): the anomalies found, none if the Iceberg side is right."""
    from pyiceberg.catalog.rest import RestCatalog
    latest = max(v for v, _ in entries)
    catalog = RestCatalog("chaos", uri=base + "/api/2.1/unity-catalog/iceberg", warehouse="main",
                          **(s3_properties or {}))
    deadline, shown = time.monotonic() + CATCH_UP_S, None
    while time.monotonic() < deadline:
        try:
            table = catalog.load_table(f"{schema}.{TABLE}")
            shown = int(table.properties.get("delta-version", -1))
        except Exception as exc:   # not converted yet (404), or an answer to look into below
            shown = f"{type(exc).__name__}: {exc}"
        if shown == latest:
            break
        time.sleep(0.5)
    if shown != latest:
        return [f"the Iceberg side did not catch up in {CATCH_UP_S}s: it shows {shown}, the Delta side is at {latest}"]
    problems = []
    by_version = dict(entries)
    for snapshot in table.metadata.snapshots:
        version = int(snapshot.summary["delta-version"])
        if version > latest:
            problems.append(f"snapshot {snapshot.snapshot_id} converts Delta version {version}, beyond {latest}")
            continue
        want = {by_version[v] for v in range(1, version + 1) if by_version.get(v)}
        got = {task.file.file_path.rsplit("/", 1)[1].removesuffix(".parquet")
               for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files()}
        if got != want:
            problems.append(f"snapshot {snapshot.snapshot_id} (Delta version {version}) holds "
                            f"{len(got - want)} files of other commits and lacks {len(want - got)}")
    return problems
