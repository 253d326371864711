"""A named warehouse on the S3 server beside the default local one: the service writes each table's files with
its own warehouse's settings (the default has none), vends that warehouse's keys, and purges there."""

from __future__ import annotations

import time

import httpx
import pyarrow as pa
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))


def test_an_s3_warehouse_beside_the_local_default(service, config, s3_server, s3_bucket):
    made = httpx.post(service + "/api/coordinator/v1/warehouses", json={
        "name": "s3lake", "location": f"s3://{s3_bucket}/tables",
        "storage": {"endpoint": s3_server.endpoint, "region": s3_server.region, "path_style": True,
                    "credentials": "keys", "access_key_id": s3_server.access_key_id,
                    "secret_access_key": s3_server.secret_access_key}})
    assert made.status_code == 201, made.text
    catalog = load_catalog("s3", type="rest", uri=service, warehouse="s3lake", **{
        "s3.endpoint": s3_server.endpoint, "s3.region": s3_server.region,
        "s3.access-key-id": s3_server.access_key_id, "s3.secret-access-key": s3_server.secret_access_key,
        "s3.force-virtual-addressing": False})
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=SCHEMA)
    table.append(pa.table({"id": pa.array([1, 2], pa.int64())}))
    table.append(pa.table({"id": pa.array([3], pa.int64())}))
    assert table.location().startswith(f"s3://{s3_bucket}/tables/db/t-")
    # The metadata files are the service's, written to S3 with the warehouse's settings.
    assert table.metadata_location.removeprefix(f"s3://{s3_bucket}/") in s3_server.keys(s3_bucket, "tables/db/")
    assert catalog.load_table("db.t").scan().to_arrow().num_rows == 3
    # Vended credentials are the warehouse's keys.
    vended = httpx.get(f"{service}/v1/s3lake/namespaces/db/tables/t/credentials").json()["storage-credentials"]
    assert vended[0]["config"]["s3.access-key-id"] == s3_server.access_key_id
    assert vended[0]["config"]["s3.endpoint"] == s3_server.endpoint
    # The local default warehouse works alongside, with no S3 settings at all.
    local = load_catalog("local", type="rest", uri=service)
    local.create_namespace("db")
    assert local.create_table("db.t", schema=SCHEMA).location().startswith(config.warehouse_uri + "/db/t-")
    # Drop with purge deletes the table's objects, once the drop is durable.
    catalog.purge_table("db.t")
    for _ in range(300):
        if not s3_server.keys(s3_bucket, "tables/db/"):
            break
        time.sleep(0.1)
    assert s3_server.keys(s3_bucket, "tables/db/") == []
