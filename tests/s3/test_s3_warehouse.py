"""The whole loop on an S3 warehouse: `coordinator serve --warehouse s3://bucket/wh` pointed at a real S3 server
(moto on loopback) by its S3 flags, with its credentials from the AWS_* environment, and the real clients writing
their data to the same bucket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import lance
import lance_namespace
import obstore
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from lance_namespace import CreateNamespaceRequest, DescribeTableRequest, DropTableRequest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType
from unitycatalog.client.models import TemporaryCredentials

from coordinator.lance.layout import version_of_manifest_name
from tests.delta.conftest import COLUMNS, FIRST, UC, commit_info, first_commit, table_properties
from tests.support import ServerProcess


@pytest.fixture
def server(database_url, tmp_path, s3_server, s3_bucket):
    """The service as `coordinator serve` runs it: S3 settings from its flags, credentials from AWS_*."""
    with ServerProcess(database_url, tmp_path / "service", warehouse=f"s3://{s3_bucket}/wh",
                       extra_env=s3_server.env, extra_args=s3_server.serve_args) as process:
        yield process


def wait_until_gone(s3_server, bucket: str, prefix: str, timeout_s: float = 60) -> list[str]:
    """The keys left under `prefix` once a purge (which runs after the drop is answered) has had its time."""
    deadline = time.monotonic() + timeout_s
    while (left := s3_server.keys(bucket, prefix)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_pyiceberg_writes_commits_reads_and_purges_a_table_on_s3(server, s3_server, s3_bucket):
    catalog = RestCatalog("s3", uri=server.base_url, **{
        "s3.endpoint": s3_server.endpoint, "s3.access-key-id": s3_server.access_key_id,
        "s3.secret-access-key": s3_server.secret_access_key, "s3.region": s3_server.region})
    catalog.create_namespace("db")
    schema = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "name", StringType(),
                                                                                  required=False))
    table = catalog.create_table("db.events", schema)
    assert table.location().startswith(f"s3://{s3_bucket}/wh/")
    prefix = table.location().removeprefix(f"s3://{s3_bucket}/") + "/"
    for i in range(3):
        table.append(pa.table({"id": pa.array([i], pa.int64()), "name": pa.array([f"n{i}"])}))
    again = catalog.load_table("db.events")
    assert sorted(again.scan().to_arrow()["id"].to_pylist()) == [0, 1, 2]
    assert len(again.metadata.snapshots) == 3

    keys = s3_server.keys(s3_bucket, prefix)
    metadata = [k for k in keys if k.endswith(".metadata.json")]
    assert len(metadata) == 4, keys   # created, then one per commit: each written by the service
    assert again.metadata_location == f"s3://{s3_bucket}/{max(metadata)}"
    assert [k for k in keys if k.endswith(".parquet")], keys   # pyiceberg's data files, beside them

    catalog.purge_table("db.events")
    assert wait_until_gone(s3_server, s3_bucket, prefix) == []
    assert not catalog.table_exists("db.events")


def test_pylance_writes_and_reads_a_table_on_s3_through_the_namespace(server, s3_server, s3_bucket):
    """pylance writes data and a staged manifest to S3 and commits through the namespace; the service publishes
    the final manifest `_versions/N.manifest` on S3 and removes the staged one."""
    ns = lance_namespace.connect("rest", {"uri": server.base_url})
    ns.create_namespace(CreateNamespaceRequest(id=["db"]))
    storage = {"aws_endpoint": s3_server.endpoint, "aws_access_key_id": s3_server.access_key_id,
               "aws_secret_access_key": s3_server.secret_access_key, "aws_region": s3_server.region,
               "allow_http": "true"}
    t = ["db", "points"]
    ds = lance.write_dataset(pa.table({"a": [1, 2, 3]}), namespace_client=ns, table_id=t, mode="create",
                             storage_options=storage)
    for i in range(2):
        ds = lance.write_dataset(pa.table({"a": [10 + i]}), namespace_client=ns, table_id=t, mode="append",
                                 storage_options=storage)
    ds = lance.dataset(namespace_client=ns, table_id=t, storage_options=storage)
    assert ds.version == 3 and sorted(ds.to_table()["a"].to_pylist()) == [1, 2, 3, 10, 11]

    location = ns.describe_table(DescribeTableRequest(id=t)).location
    assert location.startswith(f"s3://{s3_bucket}/wh/")
    prefix = location.removeprefix(f"s3://{s3_bucket}/").rstrip("/") + "/"
    names = [k.rsplit("/", 1)[1] for k in s3_server.keys(s3_bucket, prefix + "_versions/")]
    assert sorted(version_of_manifest_name(n)[0] for n in names) == [1, 2, 3], names   # finals only: no staged

    ns.drop_table(DropTableRequest(id=t))
    assert wait_until_gone(s3_server, s3_bucket, prefix) == []


def test_a_managed_delta_table_commits_on_s3_through_uc_and_is_purged(server, s3_server, s3_bucket):
    """UC's managed-table flow on S3: the staging location is in the bucket, the client writes version 0 and its
    staged commits there, the service reads version 0 from S3 and ratifies the commits; a drop deletes the
    table's objects."""
    uc = UC(server.base_url)
    uc.setup_schema()
    staging = uc.staging("t")
    location = staging["staging_location"]
    assert location.startswith(f"s3://{s3_bucket}/wh/")
    store = s3_server.store(s3_bucket)
    prefix = location.removeprefix(f"s3://{s3_bucket}/").rstrip("/") + "/"
    obstore.put(store, prefix + f"_delta_log/{FIRST}", first_commit(staging["id"]))
    r = uc.post("/tables", json={"name": "t", "catalog_name": "main", "schema_name": "default",
                                 "table_type": "MANAGED", "data_source_format": "DELTA", "columns": COLUMNS,
                                 "storage_location": location, "properties": table_properties(staging["id"])})
    assert r.status_code == 200, r.text
    table = r.json()
    for version in (1, 2, 3):
        info = commit_info(version)
        obstore.put(store, prefix + f"_delta_log/_staged_commits/{info['file_name']}", b'{"commitInfo": {}}\n')
        r = uc.post("/delta/commit", json={"table_id": table["table_id"], "table_uri": location,
                                           "commit_info": info})
        assert r.status_code == 200, r.text
    assert [c["version"] for c in uc.commits(table)["commits"]] == [1, 2, 3]
    r = uc.post("/temporary-table-credentials", json={"table_id": table["table_id"], "operation": "READ_WRITE"})
    assert r.status_code == 200, r.text
    # As unitycatalog-client reads the answer (UC's TemporaryCredentials): the keys come from the service's AWS_*
    # environment, and `expiration_time` (epoch ms), which delta-rs requires, lies ahead.
    credentials = TemporaryCredentials.from_json(r.text)
    assert credentials.aws_temp_credentials.access_key_id == s3_server.access_key_id
    assert credentials.url == location and credentials.expiration_time > time.time() * 1000

    assert s3_server.keys(s3_bucket, prefix)
    assert uc.delete("/tables/main.default.t").status_code == 200
    assert wait_until_gone(s3_server, s3_bucket, prefix) == []


@pytest.mark.skipif(not os.environ.get("COORDINATOR_TEST_DELTA_RS"),
                    reason="deltalake 1.6 often stalls inside DeltaTable('uc://...') after both UC answers arrived "
                           "and before its first S3 request; set COORDINATOR_TEST_DELTA_RS=1 to run it")
def test_delta_rs_reads_an_external_table_on_s3_through_uc_with_vended_credentials(server, s3_server, s3_bucket,
                                                                                  monkeypatch):
    """delta-rs (`deltalake`) opens `uc://catalog.schema.table`: it looks the table up and asks
    /temporary-table-credentials, and refuses an answer without `expiration_time`; it then reads from S3 with
    the keys vended (this process has none of its own; the endpoint is the client's setting, which delta-rs's
    UC store takes from the environment only)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_REGION", s3_server.region)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    location = f"s3://{s3_bucket}/wh/external/events"
    s3 = {"AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": s3_server.region,
          "AWS_ACCESS_KEY_ID": s3_server.access_key_id, "AWS_SECRET_ACCESS_KEY": s3_server.secret_access_key}
    write_deltalake(location, pa.table({"id": [1, 2, 3]}), storage_options=s3)
    uc = UC(server.base_url)
    uc.setup_schema()
    r = uc.post("/tables", json={"name": "events", "catalog_name": "main", "schema_name": "default",
                                 "table_type": "EXTERNAL", "data_source_format": "DELTA", "columns": None,
                                 "storage_location": location})
    assert r.status_code == 200, r.text
    uc_options = {"unity_workspace_url": server.base_url, "unity_access_token": "anonymous",
                  "unity_allow_http_url": "true"}
    read = ("import json, sys\nfrom deltalake import DeltaTable\n"
            "t = DeltaTable('uc://main.default.events', storage_options=json.loads(sys.argv[1]))\n"
            "print(json.dumps(sorted(t.to_pyarrow_table()['id'].to_pylist())))")
    # In a process of its own, given up after a minute and tried again (three times at most): deltalake 1.6
    # often stalls inside DeltaTable() after both UC answers arrived and before its first S3 request (nothing
    # is pending at the service or the S3 server then), and only a process can be stopped.
    outcomes = []
    for _ in range(3):
        try:
            done = subprocess.run([sys.executable, "-c", read, json.dumps(uc_options)], capture_output=True,
                                  text=True, timeout=60)
        except subprocess.TimeoutExpired:
            outcomes.append("stalled for 60 s")
            continue
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout) == [1, 2, 3]
        return
    pytest.fail(f"delta-rs did not read the table through UC: {outcomes}")
