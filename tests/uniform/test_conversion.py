"""One conversion (`coordinator.uniform.conversion.convert`) on Delta logs written here by hand, the way an
IcebergCompatV2 writer writes them (physical column names and Parquet field ids, nested ids, partition values
materialized in the files, stats keyed by physical names): nested types, partitions, Parquet checkpoints, a gap in
the log, statistics as bounds. Each result is read back with pyiceberg from the files it returns."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import EqualTo
from pyiceberg.table import StaticTable

from coordinator.uniform.conversion import Converted, Job, Refused, convert

from .support import actions_bytes, log_name, stats_of


def fid(n: int) -> dict:
    return {b"PARQUET:field_id": str(n).encode()}


# id 1 id long, 2 name string, 3 s struct<4 a long>, 5 tags array<string> (element 6), 7 m map<string,long> (8, 9),
# 10 day date, 11 ts timestamp, 12 part string (the partition column, in the files)
SCHEMA = {"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True,
     "metadata": {"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-id"}},
    {"name": "name", "type": "string", "nullable": True,
     "metadata": {"delta.columnMapping.id": 2, "delta.columnMapping.physicalName": "col-name"}},
    {"name": "s", "type": {"type": "struct", "fields": [
        {"name": "a", "type": "long", "nullable": True,
         "metadata": {"delta.columnMapping.id": 4, "delta.columnMapping.physicalName": "col-a"}}]},
     "nullable": True, "metadata": {"delta.columnMapping.id": 3, "delta.columnMapping.physicalName": "col-s"}},
    {"name": "tags", "type": {"type": "array", "elementType": "string", "containsNull": True}, "nullable": True,
     "metadata": {"delta.columnMapping.id": 5, "delta.columnMapping.physicalName": "col-tags",
                  "parquet.field.nested.ids": {"col-tags.element": 6}}},
    {"name": "m", "type": {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True},
     "nullable": True, "metadata": {"delta.columnMapping.id": 7, "delta.columnMapping.physicalName": "col-m",
                                    "parquet.field.nested.ids": {"col-m.key": 8, "col-m.value": 9}}},
    {"name": "day", "type": "date", "nullable": True,
     "metadata": {"delta.columnMapping.id": 10, "delta.columnMapping.physicalName": "col-day"}},
    {"name": "ts", "type": "timestamp", "nullable": True,
     "metadata": {"delta.columnMapping.id": 11, "delta.columnMapping.physicalName": "col-ts"}},
    {"name": "part", "type": "string", "nullable": True,
     "metadata": {"delta.columnMapping.id": 12, "delta.columnMapping.physicalName": "col-part"}},
]}
ARROW = pa.schema([
    pa.field("col-id", pa.int64(), metadata=fid(1)), pa.field("col-name", pa.string(), metadata=fid(2)),
    pa.field("col-s", pa.struct([pa.field("col-a", pa.int64(), metadata=fid(4))]), metadata=fid(3)),
    pa.field("col-tags", pa.list_(pa.field("element", pa.string(), metadata=fid(6))), metadata=fid(5)),
    pa.field("col-m", pa.map_(pa.field("key", pa.string(), nullable=False, metadata=fid(8)),
                              pa.field("value", pa.int64(), metadata=fid(9))), metadata=fid(7)),
    pa.field("col-day", pa.date32(), metadata=fid(10)),
    pa.field("col-ts", pa.timestamp("us", tz="UTC"), metadata=fid(11)),
    pa.field("col-part", pa.string(), metadata=fid(12)),
])

LOGICAL = pa.schema([f.with_name(d["name"]) for f, d in zip(ARROW, SCHEMA["fields"])])


def rows(ids: list[int], part: str) -> list[dict]:
    return [{"id": i, "name": f"n{i}", "s": {"a": i * 10}, "tags": [f"t{i}"], "m": [("k", i)],
             "day": dt.date(2024, 1, 1) + dt.timedelta(days=i), "ts": dt.datetime(2024, 1, 1, 0, 0, i, 123456,
                                                                                  tzinfo=dt.timezone.utc),
             "part": part} for i in ids]


class DeltaDir:
    """A Delta table written by hand in `root`: each `commit` is `_delta_log/<v>.json`."""

    def __init__(self, root: Path, partitioned: bool = True):
        self.root = root
        self.version = -1
        self.partitioned = partitioned
        (root / "_delta_log").mkdir(parents=True)

    @property
    def location(self) -> str:
        return "file://" + str(self.root)

    def file(self, data: list[dict], part: str) -> dict:
        """A data file of `data` (logical rows), and its add action."""
        logical = pa.Table.from_pylist([{**r, "s": {"col-a": r["s"]["a"]}} for r in data], schema=LOGICAL)
        table = pa.table(logical.columns, schema=ARROW)
        name = (f"part={part}/" if self.partitioned else "") + f"part-{uuid.uuid4()}.parquet"
        (self.root / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, self.root / name)
        stats = stats_of(table.select(["col-id", "col-name", "col-part"]))
        stats["minValues"]["col-s"] = {"col-a": min(r["s"]["a"] for r in data)}
        stats["maxValues"]["col-s"] = {"col-a": max(r["s"]["a"] for r in data)}
        stats["minValues"]["col-day"] = min(r["day"] for r in data).isoformat()
        stats["maxValues"]["col-day"] = max(r["day"] for r in data).isoformat()
        stats["minValues"]["col-ts"] = min(r["ts"] for r in data).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        stats["maxValues"]["col-ts"] = max(r["ts"] for r in data).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        return {"add": {"path": name, "partitionValues": {"col-part": part} if self.partitioned else {},
                        "size": (self.root / name).stat().st_size, "modificationTime": 1, "dataChange": True,
                        "stats": json.dumps(stats)}}

    def commit(self, *actions: dict, first: bool = False) -> int:
        self.version += 1
        head = [{"commitInfo": {"inCommitTimestamp": 1_700_000_000_000 + self.version, "operation": "WRITE"}}]
        if first:
            head += [{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                                   "readerFeatures": ["columnMapping"],
                                   "writerFeatures": ["columnMapping", "icebergCompatV2"]}},
                     {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                                   "schemaString": json.dumps(SCHEMA),
                                   "partitionColumns": ["part"] if self.partitioned else [],
                                   "configuration": {"delta.columnMapping.mode": "name",
                                                     "delta.enableIcebergCompatV2": "true"}}}]
        (self.root / "_delta_log" / log_name(self.version)).write_bytes(actions_bytes([*head, *actions]))
        return self.version


def run(delta: DeltaDir, previous: Converted | None = None, table_id: str = "8f2c1a6e-0000-4000-8000-000000000001",
        **limits):
    job = Job(table_id=table_id, location=delta.location, s3_options={}, target=delta.version, staged={},
              base_version=previous.delta_version if previous else None,
              base_location=previous.metadata_location if previous else None,
              base_metadata=previous.metadata_json if previous else None, **limits)
    outcome = convert(job)
    if isinstance(outcome, Converted):
        for uri, data in outcome.files:
            path = Path(uri.removeprefix("file://"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return outcome


def read(outcome: Converted) -> StaticTable:
    return StaticTable.from_metadata(outcome.metadata_location)


def logical(table) -> list[dict]:
    out = table.scan().to_arrow().to_pylist()
    for r in out:
        r["m"] = sorted(r["m"].items()) if isinstance(r["m"], dict) else r["m"]
    return sorted(out, key=lambda r: r["id"])


def test_nested_types_partitions_and_bounds_keep_the_delta_ids(tmp_path):
    delta = DeltaDir(tmp_path / "t")
    delta.commit(delta.file(rows([1, 2], "x"), "x"), delta.file(rows([3], "y"), "y"), first=True)
    out = run(delta)
    assert isinstance(out, Converted), out
    table = read(out)
    schema = table.schema()
    assert [f.field_id for f in schema.fields] == [1, 2, 3, 5, 7, 10, 11, 12]
    assert schema.find_field("s.a").field_id == 4 and schema.find_field("tags.element").field_id == 6
    assert schema.find_field("m.key").field_id == 8 and schema.find_field("m.value").field_id == 9
    assert [(f.name, f.source_id, str(f.transform)) for f in table.spec().fields] == [("part", 12, "identity")]
    got = logical(table)
    assert [r["id"] for r in got] == [1, 2, 3] and got[0]["s"] == {"a": 10} and got[1]["tags"] == ["t2"]
    assert got[2]["m"] == [("k", 3)] and got[0]["ts"] == dt.datetime(2024, 1, 1, 0, 0, 1, 123456,
                                                                   tzinfo=dt.timezone.utc)
    assert [r["id"] for r in table.scan(row_filter=EqualTo("part", "y")).to_arrow().to_pylist()] == [3]
    files = {task.file.partition[0]: task.file for task in table.scan().plan_files()}
    x = files["x"]
    long_type = schema.find_field(1).field_type
    assert x.record_count == 2 and from_bytes(long_type, x.lower_bounds[1]) == 1
    assert from_bytes(long_type, x.upper_bounds[1]) == 2 and from_bytes(long_type, x.upper_bounds[4]) == 20
    ts = schema.find_field(11).field_type
    # millisecond stats widened so that no value lies above the upper bound
    assert from_bytes(ts, x.upper_bounds[11]) >= int(dt.datetime(2024, 1, 1, 0, 0, 2, 123456,
                                                                 tzinfo=dt.timezone.utc).timestamp() * 1e6)
    mapping = json.loads(table.properties["schema.name-mapping.default"])
    assert mapping[0] == {"field-id": 1, "names": ["id", "col-id"]}


def test_commits_since_the_last_conversion_become_one_snapshot_each_conversion(tmp_path):
    delta = DeltaDir(tmp_path / "t")
    delta.commit(delta.file(rows([1], "x"), "x"), first=True)
    first = run(delta)
    a = delta.file(rows([2], "x"), "x")
    delta.commit(a)
    delta.commit(delta.file(rows([3], "y"), "y"))
    delta.commit({"remove": {"path": a["add"]["path"], "dataChange": True}})
    second = run(delta, first)
    table = read(second)
    assert [r["id"] for r in logical(table)] == [1, 3]
    assert len(table.metadata.snapshots) == 2   # v1..v3 as one append: v1's file added and removed within them
    assert table.current_snapshot().summary.operation.value == "append"
    assert table.properties["delta-version"] == "3" and table.properties["base-delta-version"] == "0"


def test_a_checkpoint_and_a_gap_in_the_log_rebuild_from_the_snapshot(tmp_path):
    delta = DeltaDir(tmp_path / "t", partitioned=False)
    a = delta.file(rows([1], ""), "")
    delta.commit(a, first=True)
    first = run(delta)
    b = delta.file(rows([2], ""), "")
    delta.commit(b)
    c = delta.file(rows([3], ""), "")
    delta.commit(c, *({"remove": {"path": f["add"]["path"], "dataChange": True}} for f in (a, b)))
    # A classic checkpoint at version 2, then versions 0-2 cleaned from the log, as log retention does.
    actions = [json.loads(line) for v in range(3)
               for line in (delta.root / "_delta_log" / log_name(v)).read_text().splitlines()]
    live = {}
    metadata = protocol = None
    for a in actions:
        if "add" in a:
            live[a["add"]["path"]] = a["add"]
        elif "remove" in a:
            live.pop(a["remove"]["path"], None)
        metadata = a.get("metaData", metadata)
        protocol = a.get("protocol", protocol)
    write_checkpoint(delta.root, 2, list(live.values()), metadata, protocol)
    for v in range(3):
        (delta.root / "_delta_log" / log_name(v)).unlink()
    delta.commit(delta.file(rows([4], ""), ""))
    out = run(delta, first)   # versions 1 and 2 are gone: rebuilt from the checkpoint and version 3
    table = read(out)
    assert [r["id"] for r in logical(table)] == [3, 4]
    assert table.current_snapshot().summary.operation.value == "overwrite"
    assert table.metadata.table_uuid == read(first).metadata.table_uuid   # the same Iceberg table, continued


def write_checkpoint(root: Path, version: int, adds: list[dict], metadata: dict, protocol: dict) -> None:
    string_map = pa.map_(pa.string(), pa.string())
    schema = pa.schema([
        pa.field("add", pa.struct([("path", pa.string()), ("partitionValues", string_map), ("size", pa.int64()),
                                   ("modificationTime", pa.int64()), ("dataChange", pa.bool_()),
                                   ("stats", pa.string())])),
        pa.field("metaData", pa.struct([("id", pa.string()), ("schemaString", pa.string()),
                                        ("partitionColumns", pa.list_(pa.string())),
                                        ("configuration", string_map)])),
        pa.field("protocol", pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32())]))])
    records = [{"add": None, "metaData": None, "protocol": {"minReaderVersion": 3, "minWriterVersion": 7}},
               {"add": None, "protocol": None, "metaData": {
                   "id": metadata["id"], "schemaString": metadata["schemaString"],
                   "partitionColumns": metadata["partitionColumns"],
                   "configuration": list(metadata["configuration"].items())}}]
    records += [{"metaData": None, "protocol": None,
                 "add": {**a, "partitionValues": list(a["partitionValues"].items())}} for a in adds]
    pq.write_table(pa.Table.from_pylist(records, schema=schema),
                   root / "_delta_log" / f"{version:020d}.checkpoint.parquet")
    (root / "_delta_log" / "_last_checkpoint").write_text(json.dumps({"version": version, "size": len(records)}))


def test_what_iceberg_cannot_express_is_refused_with_its_version(tmp_path):
    delta = DeltaDir(tmp_path / "t")
    delta.commit(delta.file(rows([1], "x"), "x"), first=True)
    first = run(delta)
    add = delta.file(rows([2], "x"), "x")
    add["add"]["stats"] = json.dumps({"numRecords": 1, "nullCount": {"col-id": 0}})   # its stats lack `part`
    delta.commit(add)
    refused = run(delta, first)
    assert isinstance(refused, Refused) and refused.version == 1
    assert "does not hold partition column(s) part" in refused.reason
    other = DeltaDir(tmp_path / "u")
    no_count = other.file(rows([3], "x"), "x")
    no_count["add"]["stats"] = json.dumps({"minValues": {}})
    other.commit(no_count, first=True)
    refused = run(other)
    assert isinstance(refused, Refused) and refused.version == 0 and "numRecords" in refused.reason


def test_the_metadata_keeps_the_schemas_its_snapshots_use_and_stays_within_its_limit(tmp_path):
    """Each commit a schema of its own: old schemas go with the snapshots that used them; beyond the size limit the
    oldest snapshots expire early; a schema whose metadata alone is beyond it is refused, with the sizes."""
    limit = 64 << 10
    delta = DeltaDir(tmp_path / "t", partitioned=False)
    delta.commit(one_row_file(0), first=True)
    out = run(delta, max_metadata_bytes=limit)

    def evolve(columns: list[dict]) -> Converted | Refused:
        metadata = json.loads((delta.root / "_delta_log" / log_name(0)).read_text().splitlines()[2])["metaData"]
        schema = {"type": "struct", "fields": [*SCHEMA["fields"], *columns]}
        delta.commit({"metaData": {**metadata, "schemaString": json.dumps(schema)}}, one_row_file(delta.version + 1))
        return run(delta, out, max_metadata_bytes=limit)

    def wide(n: int, comment: int = 0, name: int = 4) -> list[dict]:
        first = 100 + 1000 * delta.version
        return [{"name": f"c{i:0{name}d}", "type": "long", "nullable": True,
                 "metadata": {"delta.columnMapping.id": i, "delta.columnMapping.physicalName": f"col-{i}",
                              "comment": "x" * comment}} for i in range(first, first + n)]

    for _ in range(15):   # ~3 KB schemas: ten snapshots, and only their schemas
        out = evolve(wide(1, comment=3000))
        meta = read(out).metadata
        assert {s.schema_id for s in meta.schemas} == {meta.current_schema_id, *(s.schema_id for s in meta.snapshots)}
    assert len(meta.snapshots) == 10 and len(meta.schemas) == 10
    for _ in range(3):    # ~25 KB schemas: as many snapshots as fit
        out = evolve(wide(8, comment=3000))
        assert len(out.metadata_json) <= limit
    meta = read(out).metadata
    assert 1 < len(meta.snapshots) < 10 and len(meta.schemas) == len(meta.snapshots)
    assert len(list(read(out).scan().plan_files())) == delta.version + 1   # every version's file, planned by pyiceberg
    # Long names: the Delta schema fits, its Iceberg schema and name mapping (each name twice) do not.
    columns = wide(40, name=900)
    assert len(json.dumps(columns)) < limit
    refused = evolve(columns)
    assert isinstance(refused, Refused) and refused.version == delta.version, refused
    assert "its Iceberg metadata would take" in refused.reason and f"than the {limit}" in refused.reason
    refused = evolve(wide(30, comment=3000))   # a Delta schema beyond the limit: refused before it is parsed
    assert isinstance(refused, Refused) and "the Delta schema takes" in refused.reason


def one_row_file(version: int) -> dict:
    """An add action of a one-row file (not read: a conversion reads the stats only)."""
    return {"add": {"path": f"part-{version}.parquet", "partitionValues": {}, "size": 1, "modificationTime": 1,
                    "dataChange": True, "stats": json.dumps({"numRecords": 1})}}
