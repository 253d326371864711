"""Helpers for the Unity Catalog / Delta suites: the API's base URL, and real Delta log files on disk."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import httpx
import pytest

from storage.files import to_local_path
from tests.support import sql

PREFIX = "/api/2.1/unity-catalog"
FIRST = "00000000000000000000.json"

SCHEMA_STRING = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "name", "type": "string", "nullable": True, "metadata": {}}]})

COLUMNS = [
    {"name": "id", "type_text": "bigint", "type_name": "LONG", "position": 0, "nullable": True,
     "type_json": '{"name":"id","type":"long","nullable":true,"metadata":{}}'},
    {"name": "name", "type_text": "string", "type_name": "STRING", "position": 1, "nullable": True,
     "type_json": '{"name":"name","type":"string","nullable":true,"metadata":{}}'},
]


def local_path(uri: str) -> Path:
    path = to_local_path(uri)
    assert path is not None, uri
    return path


def hadoop_uri(uri: str) -> str:
    """How Delta's Hadoop client spells a local table path: `file:/p`, not `file:///p`."""
    return "file:" + str(local_path(uri))


def table_properties(table_id: str, ict: int = 1704067400000) -> dict[str, str]:
    return {"delta.minReaderVersion": "3", "delta.minWriterVersion": "7",
            "delta.enableInCommitTimestamps": "true", "delta.feature.inCommitTimestamp": "supported",
            "delta.feature.vacuumProtocolCheck": "supported", "delta.feature.catalogManaged": "supported",
            "io.unitycatalog.tableId": table_id, "delta.lastUpdateVersion": "0",
            "delta.lastCommitTimestamp": str(ict)}


def first_commit(table_id: str, *, ict: int | None = None, reader: int = 3, writer: int = 7,
                 reader_features=("catalogManaged", "vacuumProtocolCheck"),
                 writer_features=("catalogManaged", "inCommitTimestamp", "vacuumProtocolCheck"),
                 configuration: dict[str, str] | None = None, commit_info: bool = True) -> bytes:
    """A real Delta `00000000000000000000.json` for a catalog-managed table (newline-delimited actions,
    commitInfo first as in-commit timestamps require)."""
    ict = ict or int(time.time() * 1000)
    conf = {"delta.enableInCommitTimestamps": "true", "io.unitycatalog.tableId": table_id}
    if configuration is not None:
        conf = configuration
    actions = []
    if commit_info:
        actions.append({"commitInfo": {"inCommitTimestamp": ict, "timestamp": ict, "operation": "CREATE TABLE",
                                       "operationParameters": {}, "isBlindAppend": True,
                                       "txnId": str(uuid.uuid4()), "engineInfo": "coordinator-tests"}})
    actions.append({"protocol": {"minReaderVersion": reader, "minWriterVersion": writer,
                                 "readerFeatures": list(reader_features), "writerFeatures": list(writer_features)}})
    actions.append({"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                                 "schemaString": SCHEMA_STRING, "partitionColumns": [], "configuration": conf,
                                 "createdTime": ict}})
    return b"".join(json.dumps(a).encode() + b"\n" for a in actions)


def write_log_file(location: str, name: str, data: bytes) -> Path:
    path = local_path(location) / "_delta_log" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


class UC:
    """A thin httpx wrapper for the UC API with the set-up steps every test repeats."""

    def __init__(self, base_url: str):
        self.http = httpx.Client(base_url=base_url + PREFIX, timeout=30)

    def __getattr__(self, name):
        return getattr(self.http, name)

    def get_json(self, path: str, body: dict | None = None, params: dict | None = None) -> httpx.Response:
        # GET with a JSON body, as the seed and Delta's Java client send it.
        return self.http.request("GET", path, content=json.dumps(body) if body is not None else None,
                                 params=params, headers={"Content-Type": "application/json"})

    def setup_schema(self, catalog: str = "main", schema: str = "default") -> None:
        if self.http.get(f"/catalogs/{catalog}").status_code == 404:
            assert self.http.post("/catalogs", json={"name": catalog}).status_code == 200
        if self.http.get(f"/schemas/{catalog}.{schema}").status_code == 404:
            r = self.http.post("/schemas", json={"name": schema, "catalog_name": catalog})
            assert r.status_code == 200, r.text

    def staging(self, name: str, catalog: str = "main", schema: str = "default") -> dict:
        r = self.http.post("/staging-tables", json={"name": name, "catalog_name": catalog, "schema_name": schema})
        assert r.status_code == 200, r.text
        return r.json()

    def create_managed(self, name: str, catalog: str = "main", schema: str = "default",
                       write_log=write_log_file) -> dict:
        """Staging table, a real 0.json at its location (written by `write_log`), then the table. Returns the
        TableInfo."""
        self.setup_schema(catalog, schema)
        st = self.staging(name, catalog, schema)
        write_log(st["staging_location"], FIRST, first_commit(st["id"]))
        r = self.http.post("/tables", json={
            "name": name, "catalog_name": catalog, "schema_name": schema, "table_type": "MANAGED",
            "data_source_format": "DELTA", "columns": COLUMNS, "storage_location": st["staging_location"],
            "properties": table_properties(st["id"])})
        assert r.status_code == 200, r.text
        return r.json()

    def commit(self, table: dict, version: int, *, file_name: str | None = None, published: int | None = None,
               route: str = "/delta/commit", **extra) -> httpx.Response:
        body: dict = {"table_id": table["table_id"], "table_uri": table["storage_location"], **extra}
        if version is not None:
            body["commit_info"] = commit_info(version, file_name)
        if published is not None:
            body["latest_published_version" if route == "/delta/commit" else "latest_backfilled_version"] = published
        return self.http.post(route, json=body)

    def commits(self, table: dict, **range_) -> dict:
        r = self.get_json("/delta/commits", {"table_id": table["table_id"],
                                             "table_uri": table["storage_location"], **range_})
        assert r.status_code == 200, r.text
        return r.json()


def commit_info(version: int, file_name: str | None = None) -> dict:
    now = int(time.time() * 1000)
    return {"version": version, "timestamp": now, "file_name": file_name or f"{version:020d}.{uuid.uuid4()}.json",
            "file_size": 1024, "file_modification_timestamp": now}


def commit_log(database_url: str, table_id: str) -> dict[int, str]:
    """Version -> ratified file name, as the database holds the commit log: published commits are no longer
    served by GET commits, so this is the only record of them the service keeps."""
    rows = sql(database_url, "SELECT version, payload FROM commits WHERE table_id = $1 ORDER BY version",
               uuid.UUID(table_id))
    return {r["version"]: json.loads(r["payload"])["file_name"] for r in rows}


@pytest.fixture
def uc(service) -> UC:
    client = UC(service)
    yield client
    client.http.close()
