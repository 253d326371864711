"""A warehouse on a real S3 server (moto's, on loopback) beside the default local one: the service writes each
table's files with its own warehouse's settings, and vends that warehouse's keys."""

from __future__ import annotations

import time

import httpx
import obstore
import pyarrow as pa
import pytest
from obstore.store import S3Store
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from storage.embedded import free_port

SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))
KEYS = {"access_key_id": "wh-key", "secret_access_key": "wh-secret"}


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def test_an_s3_warehouse_beside_the_local_default(service, config, s3_endpoint):
    store = S3Store("lake", endpoint=s3_endpoint, region="us-east-1", allow_http=True,
                    virtual_hosted_style_request=False, **KEYS)
    assert httpx.put(f"{s3_endpoint}/lake").status_code == 200   # the bucket
    made = httpx.post(service + "/api/coordinator/v1/warehouses", json={
        "name": "s3lake", "location": "s3://lake/tables",
        "storage": {"endpoint": s3_endpoint, "region": "us-east-1", "path_style": True, "credentials": "keys",
                    **KEYS}})
    assert made.status_code == 201, made.text
    catalog = load_catalog("s3", type="rest", uri=service, warehouse="s3lake", **{
        "s3.endpoint": s3_endpoint, "s3.region": "us-east-1", "s3.access-key-id": KEYS["access_key_id"],
        "s3.secret-access-key": KEYS["secret_access_key"], "s3.force-virtual-addressing": False})
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", schema=SCHEMA)
    table.append(pa.table({"id": pa.array([1, 2], pa.int64())}))
    table.append(pa.table({"id": pa.array([3], pa.int64())}))
    assert table.location().startswith("s3://lake/tables/db/t-")
    assert table.metadata_location.startswith(table.location() + "/metadata/")
    # The metadata files are the service's, written to S3 with the warehouse's settings (the default warehouse
    # is local and has none).
    keys = {meta["path"] for chunk in obstore.list(store, prefix="tables/db/") for meta in chunk}
    assert table.metadata_location.removeprefix("s3://lake/") in keys
    assert catalog.load_table("db.t").scan().to_arrow().num_rows == 3
    # Vended credentials are the warehouse's keys.
    vended = httpx.get(f"{service}/v1/s3lake/namespaces/db/tables/t/credentials").json()["storage-credentials"]
    assert vended[0]["config"]["s3.access-key-id"] == "wh-key"
    assert vended[0]["config"]["s3.endpoint"] == s3_endpoint
    # The local default warehouse works alongside, with no S3 settings at all.
    local = load_catalog("local", type="rest", uri=service)
    local.create_namespace("db")
    assert local.create_table("db.t", schema=SCHEMA).location().startswith(config.warehouse_uri + "/db/t-")
    # Drop with purge deletes the table's objects.
    catalog.purge_table("db.t")
    for _ in range(300):   # the purge runs once the drop is durable
        if not any(chunk for chunk in obstore.list(store, prefix=table.location().removeprefix("s3://lake/"))):
            break
        time.sleep(0.1)
    assert not [m for chunk in obstore.list(store, prefix="tables/db/") for m in chunk]
