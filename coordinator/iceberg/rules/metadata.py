"""Table metadata: creating it (Java `TableMetadata.newTableMetadata`) and applying a commit's change set
(Java `CatalogHandlers.commit`/`create`: validate requirements, apply updates to a `Builder`, `build()`).

Metadata is the plain JSON object of the spec's `TableMetadata` (what `GET table` returns as `metadata`),
written the way Java's `TableMetadataParser.toJson` writes it so that both Java and pyiceberg read it:
current-snapshot-id is -1 when unset before v3 and null from v3; v3 carries next-row-id; v1 also carries
the legacy `schema` and `partition-spec` fields (pyiceberg's v1 model requires `schema`).
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from pydantic import ValidationError

from coordinator.errors import BadRequest, CommitConflict, NoSuchTable
from .. import changes as m
from .. import models
from .builder import PARTITION_DATA_ID_START, SUPPORTED_FORMAT_VERSION, Invalid, MetadataBuilder, Stale
from .requirements import check_requirements
from .schema_updates import iter_nested
from .updates import apply_update

DEFAULT_FORMAT_VERSION = 2
ONE_MINUTE_MS = 60_000
PREVIOUS_VERSIONS_MAX = "write.metadata.previous-versions-max"
PREVIOUS_VERSIONS_MAX_DEFAULT = 100

# Java TableProperties.RESERVED_PROPERTIES: derived from metadata, never stored as properties.
RESERVED_PROPERTIES = frozenset(
    {
        "format-version",
        "uuid",
        "snapshot-count",
        "current-snapshot-id",
        "current-snapshot-summary",
        "current-snapshot-timestamp-ms",
        "current-schema",
        "default-partition-spec",
        "default-sort-order",
    }
)


def _empty_metadata(format_version: int, table_uuid: str, now_ms: int) -> dict[str, Any]:
    """Java's `Builder(formatVersion)` state: nothing added yet, ids at their Java defaults (0)."""
    return {
        "format-version": format_version,
        "table-uuid": table_uuid,
        "last-sequence-number": 0,
        "last-updated-ms": now_ms,
        "last-column-id": 0,
        "current-schema-id": 0,
        "schemas": [],
        "default-spec-id": 0,
        "partition-specs": [],
        "last-partition-id": 0,
        "default-sort-order-id": 0,
        "sort-orders": [],
        "properties": {},
        "current-snapshot-id": -1,
        "refs": {},
        "snapshots": [],
        "statistics": [],
        "partition-statistics": [],
        "snapshot-log": [],
        "metadata-log": [],
        **({"next-row-id": 0} if format_version >= 3 else {}),
    }


def _check_format_version(value: Any, field: str) -> int:
    try:
        version = int(value)
    except (TypeError, ValueError):
        raise BadRequest(f"{field}: not an integer: {value!r}") from None
    if not 1 <= version <= SUPPORTED_FORMAT_VERSION:
        raise BadRequest(f"{field}: unsupported format version v{version} (supported: v1 to v3)")
    return version


# --------------------------------------------------------------------------------------------------
# New tables
# --------------------------------------------------------------------------------------------------


def _fresh_type(type_: Any, next_id, id_map: dict[int, int]) -> Any:
    """Java `AssignFreshIds`: a struct's own fields get ids first, then each field's type is visited in
    order; a list's element and a map's key and value likewise get their ids before their types."""
    if not isinstance(type_, dict):
        return type_
    kind = type_["type"]
    if kind == "struct":
        new_ids = [next_id() for _ in type_["fields"]]
        for field, new_id in zip(type_["fields"], new_ids):
            id_map[field["id"]] = new_id
        fields = [
            {**field, "id": new_id, "type": _fresh_type(field["type"], next_id, id_map)}
            for field, new_id in zip(type_["fields"], new_ids)
        ]
        return {**type_, "fields": fields}
    if kind == "list":
        element_id = next_id()
        id_map[type_["element-id"]] = element_id
        return {**type_, "element-id": element_id, "element": _fresh_type(type_["element"], next_id, id_map)}
    key_id, value_id = next_id(), next_id()
    id_map[type_["key-id"]] = key_id
    id_map[type_["value-id"]] = value_id
    return {
        **type_,
        "key-id": key_id,
        "value-id": value_id,
        "key": _fresh_type(type_["key"], next_id, id_map),
        "value": _fresh_type(type_["value"], next_id, id_map),
    }


def _fresh_sources(fields: list[dict], id_map: dict[int, int], label: str) -> list[dict]:
    """Partition or sort fields with their source columns renumbered as the schema's columns were."""
    fresh = []
    for i, field in enumerate(fields):
        if field["source-id"] not in id_map:
            raise BadRequest(f"{label}.fields[{i}].source-id: cannot find source column {field['source-id']}")
        fresh.append({**field, "source-id": id_map[field["source-id"]]})
    return fresh


def _parse(model: type[models._Stored], raw: Any, field: str) -> dict:
    try:
        return model.model_validate(raw).stored()
    except ValidationError as exc:
        raise BadRequest(m.validation_message(field, "", exc, None)) from None


def new_table_metadata(
    *,
    location: str,
    schema: dict,
    partition_spec: dict | None,
    sort_order: dict | None,
    properties: dict[str, str] | None,
    format_version: int | None,
    table_uuid: str,
    now_ms: int,
) -> dict:
    """Metadata for a CreateTableRequest, as Java's `TableMetadata.newTableMetadata` builds it.

    * Column ids are reassigned from 1 (`AssignFreshIds` order) so that every table starts consistent no
      matter what ids the client sent; identifier fields, partition and sort sources follow the new ids.
    * The partition spec gets id 0 and field ids 1000, 1001, ...; the sort order gets id 1 (0 if unsorted).
    * format-version comes from the argument, else the `format-version` property, else 2. Reserved
      properties are dropped; `write.parquet.compression-codec=zstd` is pinned, as Java does for new tables.
    * The result is then built by the same rules as a create transaction (add-schema, set-current-schema -1,
      add-spec, ...), so both ways of creating a table validate identically.
    """
    properties = dict(properties or {})
    if format_version is None:
        format_version = properties.get("format-version", DEFAULT_FORMAT_VERSION)
        version = _check_format_version(format_version, "properties.format-version")
    else:
        version = _check_format_version(format_version, "format-version")

    raw_schema = _parse(models.Schema, schema, "schema")
    struct = {**raw_schema, "type": "struct"}
    ids = [entry[0] for entry in iter_nested(struct)]
    if len(set(ids)) != len(ids):
        raise BadRequest("schema: duplicate field ids")

    counter = iter(range(1, 1 << 31))
    id_map: dict[int, int] = {}
    fresh = _fresh_type(struct, lambda: next(counter), id_map)
    fresh["schema-id"] = 0
    if raw_schema.get("identifier-field-ids"):
        try:
            fresh["identifier-field-ids"] = [id_map[i] for i in raw_schema["identifier-field-ids"]]
        except KeyError as exc:
            raise BadRequest(f"schema.identifier-field-ids: cannot find field id {exc.args[0]}") from None

    spec = _parse(models.PartitionSpec, partition_spec or {"fields": []}, "partition-spec")
    spec_fields = [
        {**field, "field-id": PARTITION_DATA_ID_START + i}
        for i, field in enumerate(_fresh_sources(spec["fields"], id_map, "partition-spec"))
    ]
    order = _parse(models.SortOrder, sort_order or {"fields": []}, "write-order")
    order_fields = _fresh_sources(order["fields"], id_map, "write-order")

    persisted = {"write.parquet.compression-codec": "zstd"}
    persisted.update((k, v) for k, v in properties.items() if k not in RESERVED_PROPERTIES)

    steps: list[tuple[str, m.Update]] = [
        ("schema", m.AddSchemaUpdate(schema=models.Schema.model_validate(fresh))),
        ("schema", m.SetCurrentSchemaUpdate(schema_id=-1)),
        ("partition-spec", m.AddPartitionSpecUpdate(spec={"spec-id": 0, "fields": spec_fields})),
        ("partition-spec", m.SetDefaultSpecUpdate(spec_id=-1)),
        ("write-order", m.AddSortOrderUpdate(sort_order={"order-id": 1, "fields": order_fields})),
        ("write-order", m.SetDefaultSortOrderUpdate(sort_order_id=-1)),
        ("location", m.SetLocationUpdate(location=location)),
        ("properties", m.SetPropertiesUpdate(updates=persisted)),
    ]
    builder = MetadataBuilder(_empty_metadata(version, table_uuid, now_ms), last_updated_ms=now_ms, is_new=True)
    for label, update in steps:
        try:
            apply_update(update, builder)
        except Invalid as exc:
            # The builder names fields relative to the update (`spec.fields[0].name`); say it in
            # CreateTableRequest terms instead.
            field = exc.field.split(".", 1)[1] if "." in exc.field else ""
            raise BadRequest(f"{label}{'.' + field if field else ''}: {exc}") from None
    return _build(builder, base_location=None)


# --------------------------------------------------------------------------------------------------
# Commits
# --------------------------------------------------------------------------------------------------


def apply_commit(
    base: dict | None,
    requirements: list[m.Requirement],
    updates: list[m.Update],
    *,
    base_location: str | None,
    now_ms: int,
    table_uuid: str | None = None,
) -> dict:
    """Check `requirements` against `base`, apply `updates`, and return the new metadata.

    Pure: `base` and everything reachable from it are left untouched (also when this raises), and only the
    top-level dict and the lists/dicts an update changes are copied. If nothing changes (every update a
    no-op), `base` itself is returned, as Java's `Builder.build()` does; callers may skip the write then.

    `base=None` is the create-transaction path (requires assert-create, else NoSuchTable): the format version
    is the first upgrade-format-version's (Java `buildFromEmpty`), the UUID `table_uuid` unless the updates
    assign one, and a missing location is left for the caller to fill in. `base_location` is the metadata file
    `base` was read from; it is appended to metadata-log.

    Raises CommitConflict when a requirement fails or the updates are stale (sequence number or first-row-id
    behind the table), BadRequest when the updates are invalid.
    """
    check_requirements(base, requirements)
    if base is None:
        if not any(isinstance(r, m.AssertCreate) for r in requirements):
            raise NoSuchTable("table does not exist")
        version = DEFAULT_FORMAT_VERSION
        for i, update in enumerate(updates):
            if isinstance(update, m.UpgradeFormatVersionUpdate):
                version = _check_format_version(update.format_version, f"updates[{i}].format-version")
                break
        start = _empty_metadata(version, table_uuid or str(uuidlib.uuid4()), now_ms)
        builder = MetadataBuilder(start, last_updated_ms=now_ms, is_new=True)
    else:
        # last-updated-ms never goes backwards, even if this node's clock is behind the last writer's.
        last_updated_ms = max(now_ms, base.get("last-updated-ms") or 0)
        builder = MetadataBuilder(base, last_updated_ms=last_updated_ms, is_new=False)

    for i, update in enumerate(updates):
        try:
            apply_update(update, builder)
        except Invalid as exc:
            raise BadRequest(f"updates[{i}].{exc.field}: {exc}") from None
        except Stale as exc:
            raise CommitConflict(f"Validation failed, please retry: updates[{i}]: {exc}") from None

    if base is None:
        # The catalog may assign its default location to a create transaction that did not set one.
        return _build(builder, base_location=None, require_location=False)
    if not builder.changed:
        return base
    return _build(builder, base_location=base_location)


def _build(b: MetadataBuilder, *, base_location: str | None, require_location: bool = True) -> dict:
    """Java `Builder.build()` plus the `TableMetadata` constructor's checks."""
    md = b.md
    md["last-updated-ms"] = b.last_updated_ms
    _check_complete(b, require_location)
    _reconcile_snapshot_log(b)
    _check_snapshot_log_times(b)
    if base_location is not None:
        _append_metadata_log(b, base_location)

    version = md["format-version"]
    if b.current_snapshot_id == -1:
        md["current-snapshot-id"] = None if version >= 3 else -1
    if version >= 3 and md.get("next-row-id") is None:
        md["next-row-id"] = 0
    if version == 1:
        md["schema"] = b.current_schema()
        md["partition-spec"] = next(
            s["fields"] for s in md["partition-specs"] if s["spec-id"] == md["default-spec-id"]
        )
    else:
        md.pop("schema", None)
        md.pop("partition-spec", None)
    b.remember_snapshot_index()
    return md


def _check_complete(b: MetadataBuilder, require_location: bool) -> None:
    """What Java's constructor and build() insist on: a current schema, a default spec and sort order
    that exist, a location and UUID, and a default spec/sort order whose source columns are in the
    current schema (so dropping a partition column without changing the spec fails)."""
    md = b.md
    schema = b.current_schema()
    if schema is None:
        raise BadRequest(f"current-schema-id: no schema with id {md.get('current-schema-id')} (add a schema first)")
    spec = next((s for s in md["partition-specs"] if s["spec-id"] == md.get("default-spec-id")), None)
    if spec is None:
        raise BadRequest(f"default-spec-id: no partition spec with id {md.get('default-spec-id')}")
    order = next((o for o in md["sort-orders"] if o["order-id"] == md.get("default-sort-order-id")), None)
    if order is None:
        raise BadRequest(f"default-sort-order-id: no sort order with id {md.get('default-sort-order-id')}")
    if require_location and not md.get("location"):
        raise BadRequest("location: table location is required")
    if md["format-version"] > 1 and not md.get("table-uuid"):
        raise BadRequest(f"table-uuid: required in format v{md['format-version']}")
    spec_fields = [f for f in spec["fields"] if f["transform"].strip().lower() != "void"]
    missing = _missing_columns(schema, [f["source-id"] for f in (*spec_fields, *order["fields"])])
    for field in spec_fields:
        if field["source-id"] in missing:
            raise BadRequest(
                f"partition-specs: default spec field {field['name']} references missing column {field['source-id']}"
            )
    for field in order["fields"]:
        if field["source-id"] in missing:
            raise BadRequest(f"sort-orders: default sort order references missing column {field['source-id']}")


def _missing_columns(schema: dict, column_ids: list[int]) -> set[int]:
    """Which of `column_ids` are not in `schema`. This runs on every commit: a table that is neither
    partitioned nor sorted is not walked at all, and the walk stops once every column is found."""
    missing = set(column_ids)
    if missing:
        for entry in iter_nested(schema):
            missing.discard(entry[0])
            if not missing:
                break
    return missing


def _reconcile_snapshot_log(b: MetadataBuilder) -> None:
    """Java `updateSnapshotLog`.

    Intermediate snapshots (added and made main in this change set, then replaced as main by a later
    update in the same set) were never visible, so their entries go. After remove-snapshots, an entry for a
    removed snapshot drops all history before it: keeping [(t1, s1), (t3, s3)] after removing s2 would claim
    s1 was current until t3, and time travel to t2 would read the wrong snapshot.
    """
    current = b.current_snapshot_id
    intermediate = {sid for sid in b.main_set_to_added if sid != current}
    if not intermediate and not b.removed_snapshots:
        return
    log: list[dict] = []
    for entry in b.md["snapshot-log"]:
        if b.snapshot(entry["snapshot-id"]) is not None:
            if entry["snapshot-id"] not in intermediate:
                log.append(entry)
        elif b.removed_snapshots:
            log.clear()
    if b.snapshot(current) is not None and (not log or log[-1]["snapshot-id"] != current):
        raise BadRequest("snapshot-log: cannot set invalid snapshot log: latest entry is not the current snapshot")
    b.md["snapshot-log"] = log
    b.snapshot_log_appended = min(b.snapshot_log_appended, len(log))


def _check_snapshot_log_times(b: MetadataBuilder) -> None:
    """The TableMetadata constructor's clock-skew rules, checked for the entries this commit appended:
    the log is ordered and not after last-updated-ms, each with one minute of tolerance. A snapshot whose
    timestamp is far in this server's future (client clock ahead) is refused, as Java refuses it."""
    log = b.md["snapshot-log"]
    start = len(log) - b.snapshot_log_appended
    for i in range(max(start, 1), len(log)):
        if log[i]["timestamp-ms"] - log[i - 1]["timestamp-ms"] < -ONE_MINUTE_MS:
            raise BadRequest(
                f"snapshot-log: snapshot {log[i]['snapshot-id']} at {log[i]['timestamp-ms']} is older than "
                f"the previous log entry at {log[i - 1]['timestamp-ms']}"
            )
    if b.snapshot_log_appended and b.last_updated_ms - log[-1]["timestamp-ms"] < -ONE_MINUTE_MS:
        raise BadRequest(
            f"snapshot-log: invalid update timestamp {b.last_updated_ms}: "
            f"before last snapshot log entry at {log[-1]['timestamp-ms']}"
        )


def _append_metadata_log(b: MetadataBuilder, base_location: str) -> None:
    """Java `addPreviousFile`: the file the base was read from, with the base's last-updated-ms, keeping at
    most `write.metadata.previous-versions-max` entries (at least 1; read from the new properties)."""
    raw = b.md["properties"].get(PREVIOUS_VERSIONS_MAX, PREVIOUS_VERSIONS_MAX_DEFAULT)
    try:
        max_size = max(1, int(raw))
    except (TypeError, ValueError):
        raise BadRequest(f"properties.{PREVIOUS_VERSIONS_MAX}: not an integer: {raw!r}") from None
    previous = b.md["metadata-log"]
    kept = previous[len(previous) - max_size + 1 :] if len(previous) >= max_size else list(previous)
    kept.append({"timestamp-ms": b.base.get("last-updated-ms", 0), "metadata-file": base_location})
    b.md["metadata-log"] = kept
