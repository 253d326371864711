"""Attacks on the service's conversion of Delta tables to Iceberg (UniForm, docs/uniform.md), made as a Delta writer
makes them: it writes the table's files (a local warehouse: the writer has the table's storage) and commits each
version through Unity Catalog's API over HTTP, as Delta's catalog-managed clients do (a staged commit, ratified
with `POST /delta/commit`, then published as `_delta_log/<v>.json`).

- `uniform-schema-churn`: one table whose schema changes on every commit (`columns` columns, new ones each time,
  with a `comment_bytes` comment each: Iceberg keeps comments), with one small real data file per commit. Converted,
  its metadata would keep every schema ever seen. With `growth`, each schema has that many more columns than the
  last, until the table's schema alone is beyond what the service writes.
- `uniform-deep-schema`: `tables` tables whose schema nests structs `depth` deep, which the converter cannot
  express, then (with `rate` > 0) appends to them, each a new version to convert.

Each runs on a thread of its own while the `with` block does and yields its `Run`: the tables it made, the
versions committed, the errors it met (a driver of the attack reads them; the attack itself never waits for a
conversion).
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pyarrow as pa
import pyarrow.parquet as pq

from storage import files

from ..flows import DELTA_COLUMNS, UC, delta_properties
from . import Target

# A catalog-managed Delta table the service converts (PROTOCOL.md "Iceberg Compatibility V2", "Column Mapping").
PROPERTIES = {"delta.universalFormat.enabledFormats": "iceberg", "delta.enableIcebergCompatV2": "true",
              "delta.columnMapping.mode": "name", "delta.enableInCommitTimestamps": "true"}
PROTOCOL = {"minReaderVersion": 3, "minWriterVersion": 7,
            "readerFeatures": ["catalogManaged", "vacuumProtocolCheck", "columnMapping"],
            "writerFeatures": ["catalogManaged", "inCommitTimestamp", "vacuumProtocolCheck", "columnMapping",
                               "icebergCompatV2"]}
ID_COLUMN = {"name": "id", "type": "long", "nullable": True,
             "metadata": {"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-id"}}
ID_FILE_SCHEMA = pa.schema([pa.field("col-id", pa.int64(), metadata={b"PARQUET:field_id": b"1"})])


@dataclass
class Run:
    """What an attack did, for its driver to look at while and after it runs."""

    catalog: str
    schema: str
    tables: list[str] = field(default_factory=list)
    commits: int = 0
    errors: list[str] = field(default_factory=list)
    writers: dict[str, "Writer"] = field(default_factory=dict)


class Writer:
    """One catalog-managed Delta table the service converts, written version by version (see the module doc)."""

    def __init__(self, http: httpx.Client, catalog: str, schema: str, name: str):
        self.http, self.catalog, self.schema, self.name = http, catalog, schema, name
        self.version = -1
        self.table_id = self.location = ""
        self.last_ict = 0

    @property
    def root(self) -> Path:
        path = files.local_path(self.location)
        if path is None:
            raise RuntimeError(f"table location {self.location} is not local: run the service with a local warehouse "
                               f"(the attacker writes the table's files)")
        return Path(path)

    def create(self, fields: list[dict]) -> None:
        """Version 0 (a CTAS: the schema, one data file) at a staging location, then the table."""
        staging = _ok(self.http.post(f"{UC}/staging-tables", json={
            "name": self.name, "catalog_name": self.catalog, "schema_name": self.schema}))
        self.table_id, self.location = staging["id"], staging["staging_location"]
        config = {**PROPERTIES, "io.unitycatalog.tableId": self.table_id}
        self._write(self.root / "_delta_log" / f"{0:020d}.json", self._actions(0, [
            {"protocol": PROTOCOL},
            {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                          "schemaString": json.dumps({"type": "struct", "fields": fields}),
                          "partitionColumns": [], "configuration": config, "createdTime": self.last_ict}},
            self.data_file(0)]))
        info = _ok(self.http.post(f"{UC}/tables", json={
            "name": self.name, "catalog_name": self.catalog, "schema_name": self.schema, "table_type": "MANAGED",
            "data_source_format": "DELTA", "columns": DELTA_COLUMNS[:1], "storage_location": self.location,
            "properties": {**delta_properties(self.table_id), **config}}))
        self.location = info["storage_location"]
        self.version = 0

    def data_file(self, version: int) -> dict:
        """A real one-row data file (the `id` column, by field id 1) and its add action."""
        name = f"part-{version:05d}-{uuid.uuid4()}.parquet"
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table([pa.array([version], pa.int64())], schema=ID_FILE_SCHEMA), path)
        stats = {"numRecords": 1, "minValues": {"col-id": version}, "maxValues": {"col-id": version},
                 "nullCount": {"col-id": 0}}
        return {"add": {"path": name, "partitionValues": {}, "size": path.stat().st_size,
                        "modificationTime": self.last_ict, "dataChange": True, "stats": json.dumps(stats)}}

    def commit(self, actions: list[dict]) -> int:
        """`actions` as the next version: staged, ratified through the service, then published."""
        version = self.version + 1
        data = self._actions(version, actions)
        staged = f"{version:020d}.{uuid.uuid4()}.json"
        self._write(self.root / "_delta_log" / "_staged_commits" / staged, data)
        _ok(self.http.post(f"{UC}/delta/commit", json={
            "table_id": self.table_id, "table_uri": self.location, "latest_published_version": self.version,
            "commit_info": {"version": version, "timestamp": self.last_ict, "file_name": staged,
                            "file_size": len(data), "file_modification_timestamp": self.last_ict}}))
        self._write(self.root / "_delta_log" / f"{version:020d}.json", data)   # (reported with the next commit)
        self.version = version
        return version

    def metadata(self, fields: list[dict]) -> dict:
        """A metaData action changing the schema to `fields`."""
        return {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                             "schemaString": json.dumps({"type": "struct", "fields": fields}),
                             "partitionColumns": [], "createdTime": self.last_ict,
                             "configuration": {**PROPERTIES, "io.unitycatalog.tableId": self.table_id}}}

    def _actions(self, version: int, actions: list[dict]) -> bytes:
        self.last_ict = max(int(time.time() * 1000), self.last_ict + 1)
        info = {"commitInfo": {"inCommitTimestamp": self.last_ict, "timestamp": self.last_ict, "operation": "WRITE",
                               "engineInfo": "coordinator-loadtest-attack"}}
        return b"".join(json.dumps(a).encode() + b"\n" for a in [info, *actions])

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def column(column_id: int, comment_bytes: int = 0) -> dict:
    """A long column with column-mapping id `column_id` (and a comment of that many bytes: Iceberg keeps it)."""
    meta = {"delta.columnMapping.id": column_id, "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}"}
    if comment_bytes:
        meta["comment"] = random.Random(column_id).randbytes(comment_bytes // 2).hex()
    return {"name": f"c{column_id}", "type": "long", "nullable": True, "metadata": meta}


def nested(depth: int) -> dict:
    """A column nesting structs `depth` deep, each level with a column-mapping id of its own."""
    inner: dict = {"name": "leaf", "type": "long", "nullable": True,
                   "metadata": {"delta.columnMapping.id": depth + 2, "delta.columnMapping.physicalName": "col-leaf"}}
    for level in range(depth, 0, -1):
        inner = {"name": f"s{level}", "type": {"type": "struct", "fields": [inner]}, "nullable": True,
                 "metadata": {"delta.columnMapping.id": level + 1, "delta.columnMapping.physicalName": f"col-s{level}"}}
    return inner


@contextmanager
def _running(target: Target, body: Callable[[httpx.Client, Run, threading.Event], None]) -> Iterator[Run]:
    """`body` on a thread of its own while the block runs, with an HTTP client (a writer's token, when the
    service authenticates) and a catalog and schema of its own; the block's `Run` is what it did."""
    headers = {}
    if "writer" in target.clients:
        client_id, secret = target.clients["writer"]
        token = _ok(httpx.post(f"{target.base_url}/v1/oauth/tokens", timeout=30, data={
            "grant_type": "client_credentials", "client_id": client_id, "client_secret": secret,
            "scope": "catalog"}))["access_token"]
        headers["Authorization"] = f"Bearer {token}"
    http = httpx.Client(base_url=target.base_url, headers=headers, timeout=60)
    run = Run(catalog="attack", schema=f"s{uuid.uuid4().hex[:8]}")
    r = http.post(f"{UC}/catalogs", json={"name": run.catalog})
    if r.status_code != 409:
        _ok(r)
    _ok(http.post(f"{UC}/schemas", json={"name": run.schema, "catalog_name": run.catalog}))
    stop = threading.Event()

    def guarded() -> None:
        try:
            body(http, run, stop)
        except Exception as exc:   # (the driver sees it in `run.errors`)
            run.errors.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=guarded, name="uniform-attack", daemon=True)
    thread.start()
    try:
        yield run
    finally:
        stop.set()
        thread.join(timeout=60)
        http.close()


def schema_churn(target: Target, columns: int = 20, comment_bytes: int = 4096, growth: int = 0,
                 pause_s: float = 0.0):
    """`uniform-schema-churn` (see the module doc): commits as fast as the service takes them (or every
    `pause_s`), each with a schema of its own (`id` and `columns` new columns with a `comment_bytes` comment each,
    `growth` more each time) and one data file."""
    def churn(http: httpx.Client, run: Run, stop: threading.Event) -> None:
        writer = run.writers["churn"] = Writer(http, run.catalog, run.schema, "churn")
        writer.create([ID_COLUMN])
        run.tables.append("churn")
        next_id, width = 2, columns
        while not stop.is_set():
            fields = [ID_COLUMN, *(column(next_id + i, comment_bytes) for i in range(width))]
            next_id, width = next_id + width, width + growth
            writer.commit([writer.metadata(fields), writer.data_file(writer.version + 1)])
            run.commits += 1
            stop.wait(pause_s)
    return _running(target, churn)


def deep_schema(target: Target, depth: int = 100, tables: int = 1, rate: float = 0.0):
    """`uniform-deep-schema` (see the module doc): `tables` tables, each with a column nesting structs `depth`
    deep from its version 1 on; then, with `rate` > 0, that many appends a second to them in turn."""
    def deep(http: httpx.Client, run: Run, stop: threading.Event) -> None:
        writers = []
        for i in range(tables):
            writer = run.writers[f"deep{i}"] = Writer(http, run.catalog, run.schema, f"deep{i}")
            writer.create([ID_COLUMN])
            writer.commit([writer.metadata([ID_COLUMN, nested(depth)]), writer.data_file(1)])
            run.tables.append(writer.name)
            run.commits += 1
            writers.append(writer)
        n = 0
        while rate > 0 and not stop.wait(1 / rate):
            writer = writers[n % len(writers)]
            writer.commit([writer.data_file(writer.version + 1)])
            run.commits += 1
            n += 1
    return _running(target, deep)


def conversion_workers(pid: int) -> list[int]:
    """The service's conversion worker processes (`python -m coordinator.uniform`), by their ids."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid \
                    and b"coordinator.uniform" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return sorted(found)


def _ok(r: httpx.Response) -> dict:
    if r.status_code != 200:
        raise RuntimeError(f"{r.request.method} {r.request.url.path} answered {r.status_code}: {r.text[:300]}")
    return r.json()


ATTACKS = {"uniform-schema-churn": schema_churn, "uniform-deep-schema": deep_schema}
