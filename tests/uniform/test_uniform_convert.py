"""The service converts a Delta table to Iceberg itself when its writer (here delta-rs) sends no Iceberg metadata:
after each kind of commit, an Iceberg reader sees exactly the rows of the Delta snapshot."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from .conftest import iceberg_catalog, wait_converted
from .support import ManagedDelta, batch, iceberg_rows


@pytest.fixture
def table(uc, tmp_path) -> ManagedDelta:
    return ManagedDelta(uc, "events", tmp_path).create(batch(range(0, 3)))


def test_each_kind_of_commit_reads_as_the_delta_snapshot(service, table):
    md = table
    catalog = iceberg_catalog(service)
    t = wait_converted(catalog, "default.events", 0)
    assert iceberg_rows(t) == md.rows(0)
    steps = [("append", lambda: md.append(batch(range(3, 6)))),
             ("append", lambda: md.append(batch(range(6, 9), "b"))),
             ("delete", lambda: md.delete_file(0)),
             ("overwrite", lambda: md.overwrite(batch(range(100, 104), "c"))),
             ("append", lambda: md.append(batch(range(200, 202), "d"))),
             ("replace", lambda: md.optimize()),
             ("append", lambda: md.add_column(pa.table({"id": pa.array([300], pa.int64()), "name": ["e"],
                                                         "score": pa.array([1.5])})))]
    for operation, step in steps:
        version = step()
        t = wait_converted(catalog, "default.events", version)
        assert iceberg_rows(t) == md.rows(version), operation
        assert t.current_snapshot().summary.operation.value == operation
        assert t.current_snapshot().summary["delta-version"] == str(version)
        assert {f.file_path for task in t.scan().plan_files() for f in [task.file]} == \
            {md.location + "/" + p for p in md.live_files()}
    assert [f.name for f in t.schema().fields] == ["id", "name", "score"]
    assert t.metadata_location.startswith(md.location + "/metadata/")
    assert t.properties["delta-timestamp"] == str(md.last_ict)


def _refusal(service, name: str, timeout_s: float = 60.0) -> str:
    """The message loadTable answers (406) once the conversion of `name` is refused."""
    import time

    import httpx
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = httpx.get(f"{service}/api/2.1/unity-catalog/iceberg/v1/catalogs/main/namespaces/default/tables/{name}")
        if r.status_code == 406:
            error = r.json()["error"]
            assert error["type"] == "UnsupportedOperationException"
            return error["message"]
        time.sleep(0.1)
    raise AssertionError(f"{name}'s conversion was not refused in {timeout_s} s: {r.status_code} {r.text}")


def test_a_deletion_vector_is_refused_clearly_and_the_table_converts_again_once_it_is_gone(service, table):
    md = table
    catalog = iceberg_catalog(service)
    wait_converted(catalog, "default.events", 0)
    path = sorted(md.live_files())[0]
    add = {"path": path, "partitionValues": {}, "size": 1, "modificationTime": md.last_ict, "dataChange": True,
           "stats": json.dumps({"numRecords": 3}),
           "deletionVector": {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 4,
                              "sizeInBytes": 40, "cardinality": 1}}
    md.commit([{"remove": {"path": path, "dataChange": True}}, {"add": add}])
    message = _refusal(service, "events")
    assert "Delta version 1 cannot" in message and "deletion vector" in message and path in message
    # A later version the service can convert (the file rewritten without its deletion vector): read again.
    md.commit([{"remove": {"path": path, "dataChange": True}}, {"add": {**add, "deletionVector": None}}])
    assert wait_converted(catalog, "default.events", 2).properties["delta-version"] == "2"


def test_a_type_outside_icebergcompatv2s_list_is_refused(service, table, uc):
    md = table
    catalog = iceberg_catalog(service)
    wait_converted(catalog, "default.events", 0)
    schema = json.loads(next(a["metaData"]["schemaString"] for a in md._managed_actions_of(0) if "metaData" in a))
    schema["fields"].append({"name": "payload", "type": "variant", "nullable": True,
                             "metadata": {"delta.columnMapping.id": 3, "delta.columnMapping.physicalName": "col-p"}})
    metadata = next(a["metaData"] for a in md._managed_actions_of(0) if "metaData" in a)
    md.commit([{"metaData": {**metadata, "schemaString": json.dumps(schema)}}], schema=schema["fields"])
    message = _refusal(service, "events")
    assert "payload" in message and "variant" in message and "IcebergCompatV2" in message


def test_partition_columns_not_in_the_files_are_refused(service, uc, tmp_path):
    """delta-rs keeps partition values in the paths only, as Delta does by default: Iceberg readers would not find
    them in the files, which IcebergCompatV2 writers materialize."""
    md = ManagedDelta(uc, "parted", tmp_path, partition_by=["part"])
    md.create(pa.table({"id": pa.array([1, 2], pa.int64()), "part": ["x", "y"]}))
    message = _refusal(service, "parted")
    assert "Delta version 0 cannot" in message and "partition column(s) part" in message


@pytest.fixture
def quick_grace(config):
    config.uniform_grace_s = 0.5
    return config


def test_old_snapshots_expire_and_their_metadata_goes_but_never_a_data_file(quick_grace, service, table):
    md = table
    catalog = iceberg_catalog(service)
    wait_converted(catalog, "default.events", 0)
    for i in range(14):
        version = md.append(batch(range(10 * i + 10, 10 * i + 12)))
        wait_converted(catalog, "default.events", version)   # one conversion (one snapshot) per commit
    t = catalog.load_table("default.events")
    assert len(t.metadata.snapshots) == 10 and len(t.metadata.metadata_log) == 10
    import httpx
    refs = httpx.get(f"{service}/api/2.1/unity-catalog/iceberg/v1/catalogs/main/namespaces/default/tables/events",
                     params={"snapshots": "refs"}).json()["metadata"]
    assert [s["snapshot-id"] for s in refs["snapshots"]] == [t.metadata.current_snapshot_id]
    assert refs["snapshot-log"] == json.loads(t.metadata.model_dump_json(by_alias=True))["snapshot-log"]
    assert iceberg_rows(t) == md.rows(version)
    referenced = {t.metadata_location, *(e.metadata_file for e in t.metadata.metadata_log),
                  *(s.manifest_list for s in t.metadata.snapshots),
                  *(m.manifest_path for s in t.metadata.snapshots for m in s.manifests(t.io))}
    metadata_dir = md.path / "metadata"
    import time
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = {"file://" + str(p) for p in metadata_dir.iterdir()}
        if left <= referenced:
            break
        time.sleep(0.2)
    assert left <= referenced, sorted(left - referenced)[:5]
    assert {md.path / p for p in md.live_files()} <= set(md.path.rglob("*.parquet"))   # every data file is there


def test_progress_is_visible_and_a_drop_removes_the_iceberg_side(service, table, uc):
    import httpx
    md = table
    catalog = iceberg_catalog(service)
    version = md.append(batch(range(3, 6)))
    wait_converted(catalog, "default.events", version)
    metrics = httpx.get(service + "/metrics").text
    assert "coordinator_uniform_versions_behind 0.0" in metrics
    assert "coordinator_uniform_conversions_total" in metrics
    assert uc.delete("/tables/main.default.events").status_code == 200
    from pyiceberg.exceptions import NoSuchTableError
    with pytest.raises(NoSuchTableError):
        catalog.load_table("default.events")
    assert catalog.list_tables("default") == []
    import time
    deadline = time.monotonic() + 30
    while md.path.exists() and time.monotonic() < deadline:   # the managed table's directory is purged
        time.sleep(0.2)
    assert not md.path.exists()
