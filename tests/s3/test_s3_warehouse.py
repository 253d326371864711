"""The whole loop on an S3 warehouse: `coordinator serve --warehouse s3://bucket/wh` pointed at a real S3 server
(moto on loopback) by its S3 flags, with its credentials from the AWS_* environment, and the real clients writing
their data to the same bucket."""

from __future__ import annotations

import time

import httpx
import lance
import lance_namespace
import obstore
import pyarrow as pa
import pytest
from lance_namespace import CreateNamespaceRequest, DescribeTableRequest, DropTableRequest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from coordinator.lance.files import version_of_manifest_name
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
