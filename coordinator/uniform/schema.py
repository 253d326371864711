"""Delta's schema, partitions and file statistics in Iceberg's terms, as Delta's converter maps them
(delta-io/delta `IcebergSchemaUtils`, `IcebergTransactionUtils`, `IcebergStatsConverter`; PROTOCOL.md "Column
Mapping", "Iceberg Compatibility V2", "Per-file Statistics", "Partition Value Serialization").

- Field ids are the column-mapping ids (`delta.columnMapping.id`), and an array's element or a map's key and value
  take the ids IcebergCompatV2 stores in the nearest struct field's `parquet.field.nested.ids` (Delta's own code
  also writes them as `delta.columnMapping.nested.ids`), keyed by that field's physical name: the Parquet files
  carry the same ids, so a reader finds each column by id, whatever it is named.
- `schema.name-mapping.default` names each id by its logical and its physical name, for files without ids.
- Types are IcebergCompatV2's allow-list; anything else is refused (`Refusal`), never dropped or approximated.
  So is what Iceberg readers cannot take: ids that are not unique positive 32-bit integers, a decimal's
  precision beyond 38, types nested more than MAX_NESTING deep (pyiceberg cannot parse a schema nested ~60 deep,
  and pydantic, which writes it, fails before 100).
- Partitions are identity partitions of Delta's partition columns; values come from `partitionValues`.
- A data file's record count and bounds come from `add.stats` (no Parquet footer is read).

Pure functions over the JSON of Delta's actions; pyiceberg's own models (`Schema`, `PartitionSpec`, `DataFile`,
`NameMapping`) are what they build.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import orjson
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.name_mapping import MappedField, NameMapping
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (BinaryType, BooleanType, DateType, DecimalType, DoubleType, FloatType, IcebergType,
                             IntegerType, ListType, LongType, MapType, NestedField, PrimitiveType, StringType,
                             StructType, TimestampType, TimestamptzType)

COLUMN_ID = "delta.columnMapping.id"
PHYSICAL_NAME = "delta.columnMapping.physicalName"
NESTED_IDS = ("parquet.field.nested.ids", "delta.columnMapping.nested.ids")   # the spec's key, then Delta's code's
FIRST_PARTITION_FIELD_ID = 1000   # Iceberg's: partition field ids start above any column's
MAX_NESTING = 32                  # structs, arrays and maps inside one another, counting the outermost
MAX_FIELD_ID = 2**31 - 1          # Iceberg's field ids are ints

_PRIMITIVES: dict[str, PrimitiveType] = {
    "byte": IntegerType(), "short": IntegerType(), "integer": IntegerType(), "long": LongType(),
    "float": FloatType(), "double": DoubleType(), "string": StringType(), "binary": BinaryType(),
    "boolean": BooleanType(), "date": DateType(), "timestamp": TimestamptzType(), "timestamp_ntz": TimestampType(),
}
_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class Refusal(Exception):
    """What Iceberg cannot express (or the log does not tell): the conversion is refused, with this reason and,
    when it is known, the Delta version that brought it."""

    def __init__(self, reason: str, version: int | None = None):
        super().__init__(reason)
        self.version = version


@dataclass(frozen=True)
class Column:
    """A leaf or struct column as files and stats name it: its Iceberg field and its physical name."""

    field: NestedField
    physical: str


@dataclass(frozen=True)
class Layout:
    """What a data file's conversion needs of the table: the Iceberg schema, its partition spec, and for each
    physical name path the column it is (stats are keyed by physical names, nested as the schema is)."""

    schema: Schema
    spec: PartitionSpec
    partition_physical: tuple[str, ...]   # the partition columns' physical names, in spec order
    by_physical: dict[tuple[str, ...], NestedField]
    last_column_id: int


# -- schema ----------------------------------------------------------------------------------------------------


def iceberg_schema(schema_string: str, schema_id: int = 0) -> tuple[Schema, dict[tuple[str, ...], NestedField]]:
    """The Iceberg schema of a Delta `schemaString` (column mapping on), and its fields by physical-name path."""
    try:
        delta = orjson.loads(schema_string)
    except orjson.JSONDecodeError as exc:
        raise Refusal(f"the schema in the Delta log is not JSON: {exc}") from None
    if not isinstance(delta, dict):
        raise Refusal("the schema in the Delta log is not a struct")
    by_physical: dict[tuple[str, ...], NestedField] = {}
    struct = _struct(delta, (), by_physical, _Ids(), 0)
    return SharedSchema(*struct.fields, schema_id=schema_id), by_physical


class SharedSchema(Schema):
    """A schema that copies share. pyiceberg's metadata updates and its transaction deep-copy the whole table
    metadata each time (a dozen times a snapshot), and the schemas are most of it: a table of 10,000 columns spent
    ~20 s a conversion copying them. pyiceberg's models are frozen, so a copy can be the schema itself."""

    def __deepcopy__(self, memo: dict) -> "SharedSchema":
        return self

    @classmethod
    def of(cls, schema: Schema) -> "SharedSchema":
        if isinstance(schema, cls):
            return schema
        return cls(*schema.fields, schema_id=schema.schema_id, identifier_field_ids=schema.identifier_field_ids)


class _Ids:
    """The field ids a schema has given out so far: each must be a distinct positive int32."""

    def __init__(self):
        self.seen: set[int] = set()

    def take(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_FIELD_ID:
            raise Refusal(f"{where} has the id {_short(value)}: Iceberg's field ids are integers from 1 to "
                          f"{MAX_FIELD_ID}")
        if value in self.seen:
            raise Refusal(f"{where} has the id {value}, which another field of the schema has too: each field "
                          f"needs an id of its own")
        self.seen.add(value)
        return value


def _short(value: Any, limit: int = 200) -> str:
    """A value of the log as a reason quotes it: a writer's value may be of any size."""
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return text if len(text) <= limit else text[:limit] + "..."


def _struct(delta: dict, path: tuple[str, ...], by_physical: dict, ids: _Ids, depth: int) -> StructType:
    fields = []
    raw = delta.get("fields")
    for f in raw if isinstance(raw, list) else []:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
            raise Refusal(f"a field of {_short('.'.join(path)) or 'the schema'} is not a Delta struct field "
                          f"(name, type, nullable, metadata): {_short(f)}")
        meta = f.get("metadata") if isinstance(f.get("metadata"), dict) else {}
        name = f["name"]
        field_id = meta.get(COLUMN_ID)
        if field_id is None:
            raise Refusal(f"column {_short('.'.join([*path, name]))} has no column-mapping id ({COLUMN_ID}): "
                          f"UniForm needs column mapping name or id, whose ids are Iceberg's field ids")
        field_id = ids.take(field_id, f"column {_short('.'.join([*path, name]))}")
        physical = meta.get(PHYSICAL_NAME) if isinstance(meta.get(PHYSICAL_NAME), str) else name
        nested_ids = next((meta[k] for k in NESTED_IDS if isinstance(meta.get(k), dict)), {})
        here = (*path, physical)
        kind = _type(f["type"], ".".join([*path, name]), physical, nested_ids, here, by_physical, ids, depth)
        comment = meta.get("comment") if isinstance(meta.get("comment"), str) else None
        field = NestedField(field_id, name, kind, required=not f.get("nullable", True), doc=comment)
        by_physical[here] = field
        fields.append(field)
    return StructType(*fields)


def _type(delta: Any, where: str, key: str, nested_ids: dict, path: tuple[str, ...],
          by_physical: dict, ids: _Ids, depth: int) -> IcebergType:
    """`key` is the nested-ids key of this type's position: `<physical>`, `<physical>.element`, ...; `depth` the
    nested types around it."""
    if isinstance(delta, str):
        if delta in _PRIMITIVES:
            return _PRIMITIVES[delta]
        m = _DECIMAL.match(delta)
        if m and 1 <= int(m.group(1)) <= 38 and int(m.group(2)) <= int(m.group(1)):
            return DecimalType(int(m.group(1)), int(m.group(2)))
        if m:
            raise Refusal(f"column {_short(where)} has type {_short(delta)}: Iceberg's decimals have a precision "
                          f"from 1 to 38 and a scale of at most the precision")
        raise Refusal(f"column {_short(where)} has type {_short(delta)}, which IcebergCompatV2 does not allow (byte, "
                      f"short, integer, long, float, double, decimal, string, binary, boolean, date, timestamp, "
                      f"timestamp_ntz, array, map, struct)")
    kind = delta.get("type") if isinstance(delta, dict) else None
    if kind in ("struct", "array", "map") and depth + 1 >= MAX_NESTING:
        raise Refusal(f"column {_short(where, 120)} has types nested more than {MAX_NESTING} deep (structs, arrays "
                      f"and maps inside one another), which Iceberg readers cannot parse (pyiceberg stops at about 60)")
    if kind == "struct":
        return _struct(delta, path, by_physical, ids, depth + 1)
    if kind == "array" and "elementType" in delta:
        element = _nested_id(nested_ids, f"{key}.element", where, ids)
        inner = _type(delta["elementType"], f"{where}.element", f"{key}.element", nested_ids, path, by_physical,
                      ids, depth + 1)
        return ListType(element, inner, element_required=not delta.get("containsNull", True))
    if kind == "map" and "keyType" in delta and "valueType" in delta:
        k, v = _nested_id(nested_ids, f"{key}.key", where, ids), _nested_id(nested_ids, f"{key}.value", where, ids)
        return MapType(k, _type(delta["keyType"], f"{where}.key", f"{key}.key", nested_ids, path, by_physical, ids,
                                depth + 1),
                       v, _type(delta["valueType"], f"{where}.value", f"{key}.value", nested_ids, path, by_physical,
                                ids, depth + 1),
                       value_required=not delta.get("valueContainsNull", True))
    raise Refusal(f"column {_short(where)} has type {_short(delta)}, which IcebergCompatV2 does not allow")


def _nested_id(nested_ids: dict, key: str, where: str, ids: _Ids) -> int:
    value = nested_ids.get(key)
    if value is None:
        raise Refusal(f"column {_short(where)} has no id for {key.split('.', 1)[-1]} in {NESTED_IDS[0]}: "
                      f"IcebergCompatV2 writers give arrays' elements and maps' keys and values ids of their own")
    return ids.take(value, f"column {_short(where)}'s {key.split('.', 1)[-1]}")


def name_mapping(schema: Schema, by_physical: dict[tuple[str, ...], NestedField]) -> NameMapping:
    """Each field id named by its logical name and, where it differs, its physical one (the files' column name)."""
    physical = {field.field_id: path[-1] for path, field in by_physical.items()}

    def mapped(field: NestedField) -> MappedField:
        names = [field.name] + ([physical[field.field_id]] if physical.get(field.field_id, field.name) != field.name
                                else [])
        return MappedField(field_id=field.field_id, names=names, fields=_children(field.field_type))

    def element(field_id: int, name: str, kind: IcebergType) -> MappedField:
        return MappedField(field_id=field_id, names=[name], fields=_children(kind))

    def _children(kind: IcebergType) -> list[MappedField]:
        if isinstance(kind, StructType):
            return [mapped(f) for f in kind.fields]
        if isinstance(kind, ListType):
            return [element(kind.element_id, "element", kind.element_type)]
        if isinstance(kind, MapType):
            return [element(kind.key_id, "key", kind.key_type), element(kind.value_id, "value", kind.value_type)]
        return []

    return NameMapping([mapped(f) for f in schema.fields])


def highest_id(schema: Schema) -> int:
    return max([schema.highest_field_id, 0])


# -- partitions --------------------------------------------------------------------------------------------------


def layout(schema_string: str, partition_columns: list[str], schema_id: int = 0,
           spec_id: int = 0) -> Layout:
    """The table's schema and identity partition spec (partition columns are top-level, by logical name)."""
    schema, by_physical = iceberg_schema(schema_string, schema_id)
    top = {f.name: (path[0], f) for path, f in by_physical.items() if len(path) == 1}
    fields, physical = [], []
    for i, name in enumerate(partition_columns):
        if name not in top:
            raise Refusal(f"partition column {name} is not a column of the table's schema")
        phys, field = top[name]
        if not isinstance(field.field_type, PrimitiveType):
            raise Refusal(f"partition column {name} is a {field.field_type}: only primitive columns partition")
        fields.append(PartitionField(source_id=field.field_id, field_id=FIRST_PARTITION_FIELD_ID + i,
                                     transform=IdentityTransform(), name=name))
        physical.append(phys)
    spec = PartitionSpec(*fields, spec_id=spec_id)
    return Layout(schema, spec, tuple(physical), by_physical, highest_id(schema))


def layout_of(schema: Schema, spec: PartitionSpec, mapping: NameMapping | None) -> Layout:
    """The layout of a converted table, from its Iceberg metadata: the name mapping gives each field id its
    physical name (the last of its names), so a later conversion reads stats without the Delta schema at hand."""
    by_physical: dict[tuple[str, ...], NestedField] = {}

    def walk(fields, path: tuple[str, ...]) -> None:
        for mapped in fields:
            if mapped.field_id is None or not mapped.names:
                continue
            try:
                field = schema.find_field(mapped.field_id)
            except ValueError:
                continue
            if isinstance(field.field_type, (ListType, MapType)):
                by_physical[(*path, mapped.names[-1])] = field
                continue
            by_physical[(*path, mapped.names[-1])] = field
            walk(mapped.fields, (*path, mapped.names[-1]))

    walk(mapping.root if mapping is not None else [], ())
    top = {f.field_id: path[0] for path, f in by_physical.items() if len(path) == 1}
    physical = tuple(top.get(f.source_id, f.name) for f in spec.fields)
    return Layout(schema, spec, physical, by_physical, highest_id(schema))


def partition_value(kind: PrimitiveType, raw: str | None) -> Any:
    """A Delta partition value (PROTOCOL.md "Partition Value Serialization") as Iceberg's identity value."""
    if raw is None or raw == "":
        return None
    try:
        if isinstance(kind, (IntegerType, LongType)):
            return int(raw)
        if isinstance(kind, (FloatType, DoubleType)):
            return float(raw)
        if isinstance(kind, BooleanType):
            return raw.lower() == "true"
        if isinstance(kind, DecimalType):
            return decimal.Decimal(raw)
        if isinstance(kind, DateType):
            return (dt.date.fromisoformat(raw) - dt.date(1970, 1, 1)).days
        if isinstance(kind, (TimestampType, TimestamptzType)):
            return _micros(raw, utc=isinstance(kind, TimestamptzType))
        if isinstance(kind, BinaryType):
            return raw.encode()
        return raw
    except (ValueError, decimal.InvalidOperation):
        raise Refusal(f"partition value {raw!r} is not a {kind}") from None


def _micros(raw: str, utc: bool) -> int:
    """Microseconds since the epoch of a Delta timestamp (`2024-01-01 00:00:00`, ISO with or without offset)."""
    value = dt.datetime.fromisoformat(raw.replace(" ", "T").replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    delta = value - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


# -- data files ------------------------------------------------------------------------------------------------


def file_path(location: str, path: str) -> str:
    """A data file's location: Delta's `path` is a URI, relative to the table or (shallow clones) absolute."""
    if urlparse(path).scheme:
        return path
    return location.rstrip("/") + "/" + unquote(path)


def data_file(add: dict, location: str, lay: Layout, version: int) -> DataFile:
    """An `add` action as the Iceberg data file it is, with the record count and bounds of its stats. Refused: a
    deletion vector (Iceberg v2 cannot express one), no record count (IcebergCompatV2 writers always give it),
    a partition column absent from the file (IcebergCompatV2 materializes partition values in the files)."""
    path = add.get("path")
    if not isinstance(path, str) or not path:
        raise Refusal("an add action has no path", version)
    if add.get("deletionVector"):
        raise Refusal(f"data file {path} has a deletion vector, which Iceberg v2 cannot express (IcebergCompatV2 "
                      f"tables keep deletion vectors off: delta.enableDeletionVectors = false, then REORG TABLE ... "
                      f"APPLY (PURGE))", version)
    stats = _stats(add, path, version)
    if "numRecords" not in stats:
        raise Refusal(f"data file {path} has no numRecords statistic, which Iceberg needs for every file "
                      f"(IcebergCompatV2 writers always give it)", version)
    counts = stats.get("nullCount") if isinstance(stats.get("nullCount"), dict) else {}
    if counts:
        missing = [p for p in lay.partition_physical if p not in counts]
        if missing:
            raise Refusal(f"data file {path} does not hold partition column(s) "
                          f"{', '.join(_logical(lay, m) for m in missing)} (its statistics cover its columns, and not "
                          f"those): Iceberg readers take partition values from the files, and IcebergCompatV2 "
                          f"writers materialize them there", version)
    values = add.get("partitionValues") or {}
    partition = Record(*[partition_value(lay.schema.find_field(f.source_id).field_type,
                                         values.get(phys, values.get(f.name)))
                         for f, phys in zip(lay.spec.fields, lay.partition_physical)])
    nulls, lower, upper = {}, {}, {}
    _bounds(stats.get("nullCount"), (), lay, nulls, None)
    _bounds(stats.get("minValues"), (), lay, lower, "min")
    _bounds(stats.get("maxValues"), (), lay, upper, "max")
    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=file_path(location, path), file_format=FileFormat.PARQUET,
        partition=partition, record_count=int(stats["numRecords"]), file_size_in_bytes=int(add.get("size") or 0),
        null_value_counts=nulls or None, lower_bounds=lower or None, upper_bounds=upper or None,
        spec_id=lay.spec.spec_id)


def _logical(lay: Layout, physical: str) -> str:
    field = lay.by_physical.get((physical,))
    return field.name if field is not None else physical


def _stats(add: dict, path: str, version: int) -> dict:
    raw = add.get("stats")
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    try:
        stats = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise Refusal(f"data file {path} has statistics that are not JSON", version) from None
    return stats if isinstance(stats, dict) else {}


def _bounds(values: Any, path: tuple[str, ...], lay: Layout, out: dict[int, Any], which: str | None) -> None:
    """Stats are nested as the schema, keyed by physical names; Iceberg keys them by field id. A value whose type
    does not fit (Delta truncates long strings; writers differ) is left out: a bound missing only makes a reader
    read the file, a wrong one would make it skip rows."""
    if not isinstance(values, dict):
        return
    for name, value in values.items():
        here = (*path, name)
        field = lay.by_physical.get(here)
        if field is None:
            continue
        if isinstance(value, dict):
            if isinstance(field.field_type, StructType):
                _bounds(value, here, lay, out, which)
            continue
        if which is None:
            if isinstance(value, int) and isinstance(field.field_type, PrimitiveType):
                out[field.field_id] = value
            continue
        bound = _bound(field.field_type, value, which)
        if bound is not None:
            out[field.field_id] = bound


def _bound(kind: IcebergType, value: Any, which: str) -> bytes | None:
    try:
        if value is None or not isinstance(kind, PrimitiveType):
            return None
        if isinstance(kind, (IntegerType, LongType)) and isinstance(value, int) and not isinstance(value, bool):
            return to_bytes(kind, value)
        if isinstance(kind, (FloatType, DoubleType)) and isinstance(value, (int, float)) \
                and not isinstance(value, bool) and value == value:
            return to_bytes(kind, float(value))
        if isinstance(kind, StringType) and isinstance(value, str):
            return to_bytes(kind, value)
        if isinstance(kind, DecimalType) and isinstance(value, (int, float, str)):
            return to_bytes(kind, decimal.Decimal(str(value)).quantize(decimal.Decimal(1).scaleb(-kind.scale)))
        if isinstance(kind, DateType) and isinstance(value, str):
            return to_bytes(kind, (dt.date.fromisoformat(value) - dt.date(1970, 1, 1)).days)
        if isinstance(kind, (TimestampType, TimestamptzType)) and isinstance(value, str):
            micros = _micros(value, utc=isinstance(kind, TimestamptzType))
            # Delta keeps timestamps in stats to the millisecond, truncated: the true maximum may lie up to 999 us
            # above the one written, and an upper bound must not lie below any value.
            return to_bytes(kind, micros + 999 if which == "max" else micros)
    except (ValueError, TypeError, decimal.InvalidOperation, OverflowError):
        return None
    return None
