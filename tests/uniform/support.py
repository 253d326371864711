"""Real Delta data in a catalog-managed table, committed through the service's Unity Catalog API as a
catalog-managed writer does, for the UniForm suites.

delta-rs (`deltalake`) writes Parquet files and Delta actions, but neither commits through a catalog nor reads a
catalog-managed table by path (it asks for the catalog's version, which its Python API cannot be given). So each
`ManagedDelta` pairs two tables:

- the *source*, a plain path-based Delta table that delta-rs writes (column mapping `name`: physical column names
  and Parquet field ids, stats keyed by physical names) and reads: `rows()` is what a Delta reader sees;
- the *managed* table in the service, whose every version is the source's version with the same actions:
  `mirror()` copies the version's new data files into the managed location (same relative paths), writes the
  actions as a staged commit `_delta_log/_staged_commits/<v>.<uuid>.json` (commitInfo first, with its in-commit
  timestamp), ratifies it with `POST /delta/commit` (the metadata too when the schema changed), and publishes
  (backfills) it to `_delta_log/<v>.json` a few versions later (`publish_lag`), as Delta's UC client does.

So the managed table's Delta snapshot at version v holds exactly the files of the source at v (`live_files`
checks it from the managed table's own log), and delta-rs reading the source gives that snapshot's rows.

What delta-rs does not do on a column-mapped table, OPTIMIZE and removing one whole file, is written into the
source's log here, as Delta's own writer would write it.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from tests.delta.conftest import UC, local_path, table_properties

UNIFORM_PROPERTIES = {"delta.universalFormat.enabledFormats": "iceberg", "delta.enableIcebergCompatV2": "true",
                      "delta.columnMapping.mode": "name"}
READER_FEATURES = ["catalogManaged", "vacuumProtocolCheck", "columnMapping"]
WRITER_FEATURES = ["catalogManaged", "inCommitTimestamp", "vacuumProtocolCheck", "columnMapping", "icebergCompatV2"]


def log_name(version: int) -> str:
    return f"{version:020d}.json"


def read_actions(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def actions_bytes(actions: list[dict]) -> bytes:
    return b"".join(json.dumps(a).encode() + b"\n" for a in actions)


@dataclass
class ManagedDelta:
    """A catalog-managed Delta table `catalog.schema.name` whose writer is delta-rs (see the module doc).

    `properties` are the table's UniForm settings (UNIFORM_PROPERTIES: the service converts it); `uniform`, if
    given, is called with each version after it is mirrored and returns the commit's `uniform` block (a writer
    that converts to Iceberg itself)."""

    uc: UC
    name: str
    scratch: Path
    properties: dict[str, str] = field(default_factory=lambda: dict(UNIFORM_PROPERTIES))
    catalog: str = "main"
    schema: str = "default"
    partition_by: list[str] | None = None
    publish_lag: int = 2
    uniform: object = None
    info: dict = field(default_factory=dict)
    version: int = -1
    published: int = -1
    last_ict: int = 0

    # -- the source, written by delta-rs -------------------------------------------------------------------

    @property
    def source(self) -> str:
        return str(self.scratch / f"source-{self.name}")

    @property
    def location(self) -> str:
        return self.info["storage_location"]

    @property
    def path(self) -> Path:
        return local_path(self.location)

    def rows(self, version: int | None = None) -> list[dict]:
        """The Delta snapshot's rows as delta-rs reads them (logical column names), sorted. Through its query
        engine: deltalake 1.6's `to_pyarrow_table` reads a column-mapped table's columns as nulls."""
        reader = QueryBuilder().register("t", DeltaTable(self.source, version=version)).execute("SELECT * FROM t")
        return ordered(pa.table(reader).to_pylist())

    def create(self, data: pa.Table) -> "ManagedDelta":
        """The source's version 0 (delta-rs, column mapping `name`), then the managed table from its staging
        location with the same version 0 (a CTAS: the files are in it)."""
        config = {"delta.columnMapping.mode": self.properties.get("delta.columnMapping.mode", "none")}
        if config["delta.columnMapping.mode"] == "none":
            config = {}
        write_deltalake(self.source, data, configuration=config, partition_by=self.partition_by)
        self.uc.setup_schema(self.catalog, self.schema)
        staging = self.uc.staging(self.name, self.catalog, self.schema)
        self.info = {"storage_location": staging["staging_location"], "table_id": staging["id"]}
        actions = self._managed_actions(0)
        (self.path / "_delta_log").mkdir(parents=True, exist_ok=True)
        (self.path / "_delta_log" / log_name(0)).write_bytes(actions_bytes(actions))
        props = {**table_properties(staging["id"], self.last_ict), **self.properties}
        r = self.uc.post("/tables", json={
            "name": self.name, "catalog_name": self.catalog, "schema_name": self.schema, "table_type": "MANAGED",
            "data_source_format": "DELTA", "columns": self._columns(actions),
            "storage_location": staging["staging_location"], "properties": props})
        assert r.status_code == 200, r.text
        self.info = r.json()
        self.version = self.published = 0
        return self

    def append(self, data: pa.Table) -> int:
        write_deltalake(self.source, data, mode="append", partition_by=self.partition_by)
        return self.mirror()

    def overwrite(self, data: pa.Table) -> int:
        write_deltalake(self.source, data, mode="overwrite", partition_by=self.partition_by)
        return self.mirror()

    def add_column(self, data: pa.Table) -> int:
        """An append whose data has a column the table lacks, adding it to the schema (a metaData action with the
        new column's column-mapping id and physical name), as Delta's writer does with schema evolution; delta-rs
        evolves only schemas without column mapping."""
        if "delta.columnMapping.mode" not in self.properties:
            write_deltalake(self.source, data, mode="append", schema_mode="merge", partition_by=self.partition_by)
            return self.mirror()
        metadata = [a["metaData"] for f in sorted((Path(self.source) / "_delta_log").glob("*.json"))
                    for a in read_actions(f) if "metaData" in a][-1]
        schema = json.loads(metadata["schemaString"])
        config = dict(metadata.get("configuration") or {})
        top = int(config.get("delta.columnMapping.maxColumnId", "0"))
        known = {f["name"] for f in schema["fields"]}
        for name in data.column_names:
            if name not in known:
                top += 1
                kind = {pa.float64(): "double", pa.int64(): "long", pa.string(): "string"}[data.schema.field(name).type]
                schema["fields"].append({"name": name, "type": kind, "nullable": True, "metadata": {
                    "delta.columnMapping.id": top, "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}"}})
        config["delta.columnMapping.maxColumnId"] = str(top)
        physical = pa.schema([pa.field(f["metadata"]["delta.columnMapping.physicalName"],
                                       data.schema.field(f["name"]).type,
                                       metadata={b"PARQUET:field_id": str(f["metadata"]["delta.columnMapping.id"])})
                              for f in schema["fields"]])
        table = pa.table([data.column(f["name"]) for f in schema["fields"]], schema=physical)
        name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
        pq.write_table(table, Path(self.source) / name)
        now = self._now()
        self._commit_source([
            {"commitInfo": {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Append"},
                            "engineInfo": "coordinator-tests"}},
            {"metaData": {**metadata, "schemaString": json.dumps(schema), "configuration": config}},
            {"add": {"path": name, "partitionValues": {}, "size": (Path(self.source) / name).stat().st_size,
                     "modificationTime": now, "dataChange": True, "stats": json.dumps(stats_of(table))}}])
        return self.mirror()

    def delete_file(self, index: int = 0) -> int:
        """Remove one whole data file (a DELETE whose predicate covers exactly that file's rows)."""
        live = self._source_live()
        path = sorted(live)[index]
        now = self._now()
        self._commit_source([{"commitInfo": {"timestamp": now, "operation": "DELETE",
                                             "operationParameters": {}, "engineInfo": "coordinator-tests"}},
                             {"remove": {"path": path, "dataChange": True, "deletionTimestamp": now,
                                         "extendedFileMetadata": True, "partitionValues": live[path]["partitionValues"],
                                         "size": live[path]["size"]}}])
        return self.mirror()

    def optimize(self) -> int:
        """Compact every live file of each partition into one (dataChange=false adds and removes), as Delta's
        OPTIMIZE does; delta-rs does not run it on column-mapped tables."""
        live = self._source_live()
        groups: dict[str, list[str]] = {}
        for path, add in live.items():
            groups.setdefault(json.dumps(add["partitionValues"], sort_keys=True), []).append(path)
        now = self._now()
        actions: list[dict] = [{"commitInfo": {"timestamp": now, "operation": "OPTIMIZE",
                                               "operationParameters": {}, "engineInfo": "coordinator-tests"}}]
        for key, paths in groups.items():
            if len(paths) < 2:
                continue
            table = pa.concat_tables([pq.read_table(Path(self.source) / p) for p in sorted(paths)])
            prefix = "/".join(f"{k}={v}" for k, v in json.loads(key).items())
            name = (prefix + "/" if prefix else "") + f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
            (Path(self.source) / name).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, Path(self.source) / name)
            actions.append({"add": {"path": name, "partitionValues": json.loads(key),
                                    "size": (Path(self.source) / name).stat().st_size, "modificationTime": now,
                                    "dataChange": False, "stats": json.dumps(stats_of(table))}})
            actions += [{"remove": {"path": p, "dataChange": False, "deletionTimestamp": now,
                                    "extendedFileMetadata": True, "partitionValues": live[p]["partitionValues"],
                                    "size": live[p]["size"]}} for p in paths]
        self._commit_source(actions)
        return self.mirror()

    def _source_live(self) -> dict[str, dict]:
        """The source's live add actions by path, replayed from its JSON log."""
        live: dict[str, dict] = {}
        log = Path(self.source) / "_delta_log"
        for f in sorted(log.glob("*.json")):
            for a in read_actions(f):
                if "add" in a:
                    live[a["add"]["path"]] = a["add"]
                elif "remove" in a:
                    live.pop(a["remove"]["path"], None)
        return live

    def _commit_source(self, actions: list[dict]) -> None:
        version = DeltaTable(self.source).version() + 1
        (Path(self.source) / "_delta_log" / log_name(version)).write_bytes(actions_bytes(actions))

    # -- the managed table, committed through the service ------------------------------------------------

    def _now(self) -> int:
        return max(int(time.time() * 1000), self.last_ict + 1)

    def _managed_actions(self, version: int) -> list[dict]:
        """The source's version as the managed table's: commitInfo first with an in-commit timestamp, the
        protocol and metaData of a catalog-managed table (the source's schema, the managed table's settings)."""
        ict = self._now()
        self.last_ict = ict
        out: list[dict] = []
        for a in read_actions(Path(self.source) / "_delta_log" / log_name(version)):
            if "commitInfo" in a:
                out.insert(0, {"commitInfo": {**a["commitInfo"], "inCommitTimestamp": ict, "timestamp": ict}})
            elif "protocol" in a:
                features = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": list(READER_FEATURES),
                            "writerFeatures": list(WRITER_FEATURES)}
                if "delta.columnMapping.mode" not in self.properties:
                    features["readerFeatures"] = [f for f in READER_FEATURES if f != "columnMapping"]
                    features["writerFeatures"] = [f for f in WRITER_FEATURES
                                                  if f not in ("columnMapping", "icebergCompatV2")]
                out.append({"protocol": features})
            elif "metaData" in a:
                md = dict(a["metaData"])
                md["configuration"] = {**md.get("configuration", {}), **self.properties,
                                       "delta.enableInCommitTimestamps": "true",
                                       "io.unitycatalog.tableId": self.info["table_id"]}
                out.append({"metaData": md})
            elif "add" in a or "remove" in a:
                out.append(a)
        if not out or "commitInfo" not in out[0]:
            out.insert(0, {"commitInfo": {"inCommitTimestamp": ict, "timestamp": ict, "operation": "WRITE"}})
        for a in out:
            if "add" in a:
                src = Path(self.source) / a["add"]["path"]
                dst = self.path / a["add"]["path"]
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)
        return out

    def _columns(self, actions: list[dict]) -> list[dict]:
        schema = next(json.loads(a["metaData"]["schemaString"]) for a in actions if "metaData" in a)
        return schema["fields"]

    def mirror(self) -> int:
        """The source's next version, committed to the managed table through the service (see the module doc)."""
        return self.commit(self._managed_actions(self.version + 1))

    def _managed_actions_of(self, version: int) -> list[dict]:
        """The managed table's version as committed (its staged or published file)."""
        f = self.path / "_delta_log" / log_name(version)
        if not f.exists():
            f = next((self.path / "_delta_log" / "_staged_commits").glob(f"{version:020d}.*.json"))
        return read_actions(f)

    def commit(self, actions: list[dict], schema: list[dict] | None = None) -> int:
        """`actions` committed as the managed table's next version (staged, ratified, published later); with
        `schema`, the commit's catalog metadata carries it (a metaData change)."""
        version = self.version + 1
        if "commitInfo" not in actions[0]:
            ict = self._now()
            self.last_ict = ict
            actions = [{"commitInfo": {"inCommitTimestamp": ict, "timestamp": ict, "operation": "WRITE"}}, *actions]
        data = actions_bytes(actions)
        staged = f"{version:020d}.{uuid.uuid4()}.json"
        path = self.path / "_delta_log" / "_staged_commits" / staged
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        body: dict = {"table_id": self.info["table_id"], "table_uri": self.location,
                      "commit_info": {"version": version, "timestamp": self.last_ict, "file_name": staged,
                                      "file_size": len(data), "file_modification_timestamp": self.last_ict},
                      "latest_published_version": self.published}
        metadata = next((a["metaData"] for a in actions if "metaData" in a), None)
        if metadata is not None:
            body["metadata"] = {"properties": {**table_properties(self.info["table_id"]), **self.properties},
                                "schema": schema or json.loads(metadata["schemaString"])["fields"]}
        if self.uniform is not None:
            self.version = version
            body["uniform"] = self.uniform(self, version)
        r = self.uc.post("/delta/commit", json=body)
        assert r.status_code == 200, r.text
        self.version = version
        self.publish(version - self.publish_lag)
        return version

    def publish(self, upto: int) -> None:
        """Backfill versions up to `upto` to `_delta_log/<v>.json`; the service hears of it with the next commit."""
        for v in range(self.published + 1, upto + 1):
            staged = next((self.path / "_delta_log" / "_staged_commits").glob(f"{v:020d}.*.json"))
            (self.path / "_delta_log" / log_name(v)).write_bytes(staged.read_bytes())
            self.published = v

    def live_files(self) -> set[str]:
        """The data files of the managed table's snapshot, replayed from its own log: the published JSON and the
        staged commits of the versions not yet published (which the catalog holds)."""
        live: set[str] = set()
        for v in range(self.version + 1):
            for a in self._managed_actions_of(v):
                if "add" in a:
                    live.add(a["add"]["path"])
                elif "remove" in a:
                    live.discard(a["remove"]["path"])
        return live


def stats_of(table: pa.Table) -> dict:
    """Delta's per-file statistics of a data file (keyed by its column names, which are the physical ones)."""
    mins, maxs, nulls = {}, {}, {}
    for name in table.column_names:
        column = table.column(name)
        nulls[name] = column.null_count
        if pa.types.is_integer(column.type) or pa.types.is_string(column.type) or pa.types.is_floating(column.type):
            mm = pc.min_max(column).as_py()
            if mm["min"] is not None:
                mins[name], maxs[name] = mm["min"], mm["max"]
    return {"numRecords": table.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


def batch(ids: range, tag: str = "a") -> pa.Table:
    """Rows (id, name) to write."""
    return pa.table({"id": pa.array(list(ids), pa.int64()), "name": [f"{tag}{i}" for i in ids]})


def ordered(rows: list[dict]) -> list[dict]:
    """Rows in one order whatever order a reader gave them in, to compare readers."""
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def iceberg_rows(table) -> list[dict]:
    """The rows of a pyiceberg table, ordered."""
    return ordered(table.scan().to_arrow().to_pylist())


def iso_now() -> str:
    return datetime.now(timezone.utc).isoformat()


class PyicebergWriter:
    """A writer that converts to Iceberg itself before it commits, as Delta 4.3's converter does, done here with
    pyiceberg's own catalog and writers: for each version it makes the Iceberg table's data files those of the
    Delta snapshot (`add_files`, which reads their footers; an overwrite deleting the removed ones), writes the
    metadata under the table's `metadata/` directory and hands back the commit's `uniform` block."""

    def __init__(self, scratch: Path):
        from pyiceberg.catalog.sql import SqlCatalog
        self.catalog = SqlCatalog("writer", uri=f"sqlite:///{scratch}/writer.db", warehouse=f"file://{scratch}/wh")
        self.catalog.create_namespace_if_not_exists("w")

    def __call__(self, md: ManagedDelta, version: int) -> dict:
        from pyiceberg.table.name_mapping import MappedField, NameMapping
        ident = f"w.{md.name}"
        arrow = DeltaTable(md.source, version=version).schema().to_arrow()
        if not self.catalog.table_exists(ident):
            table = self.catalog.create_table(ident, schema=pa.schema(arrow), location=md.location)
            fields = [MappedField(field_id=f.field_id, names=[f.name]) for f in table.schema().fields]
            with table.transaction() as tx:
                tx.set_properties({"schema.name-mapping.default": NameMapping(fields).model_dump_json()})
        table = self.catalog.load_table(ident)
        want = {str(md.path / p) for p in md.live_files()}
        have = {task.file.file_path.removeprefix("file://"): task.file for task in table.scan().plan_files()}
        with table.transaction() as tx:
            if set(pa.schema(arrow).names) - set(table.schema().column_names):
                with tx.update_schema() as update:
                    update.union_by_name(pa.schema(arrow))
            gone = [f for p, f in have.items() if p not in want]
            if gone:
                with tx.update_snapshot().overwrite() as overwrite:
                    for f in gone:
                        overwrite.delete_data_file(f)
            new = sorted(p for p in want if p not in have)
            if new:
                tx.add_files(["file://" + p for p in new])
            tx.set_properties({"delta-version": str(version)})
        table = self.catalog.load_table(ident)
        return {"iceberg": {"metadata_location": table.metadata_location, "converted_delta_version": version,
                            "converted_delta_timestamp": iso_now()}}
