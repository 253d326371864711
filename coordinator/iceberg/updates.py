"""What each spec `TableUpdate` does to table metadata: one function per action, dispatched on the model class.

The semantics are those of Java's `TableMetadata.Builder` (the method each `MetadataUpdate.applyTo` calls),
because that is what Spark, Trino and every Java-based REST server do; pyiceberg's `update_table_metadata`
differs in places (e.g. -1 handling, snapshot-log times, id reuse) and is deliberately not the reference.

Purity: the functions work on a `MetadataBuilder`, which holds a top-level copy of the base metadata and copies
a list or dict only the first time it is changed (`mutable_list`/`mutable_dict`). Objects inside those lists
(snapshots, schemas, refs...) are never edited in place, only replaced, so nothing reachable from `base`
is ever mutated and a commit costs at most a few list copies, however many snapshots the table has.

Errors: `Invalid` is Java's ValidationException/IllegalArgumentException (the request is wrong: 400);
`Stale` is Java's RetryableValidationException (sequence number or first-row-id behind the table), which
Java's REST handler reports as CommitFailedException (409) so that the client refreshes and retries.
"""

from __future__ import annotations

import functools
import threading
import uuid as uuidlib
from collections import OrderedDict
from typing import Any, Callable, Iterator

from pydantic import TypeAdapter

from coordinator.iceberg import models as m

MAIN_BRANCH = "main"
LAST_ADDED = -1
SUPPORTED_FORMAT_VERSION = 3  # the REST spec's TableMetadata allows format-version 1..3
ROW_LINEAGE_FORMAT_VERSION = 3
PARTITION_DATA_ID_START = 1000  # partition field ids start here (Java PartitionSpec.PARTITION_DATA_ID_START)
UNSORTED_ORDER_ID = 0
INITIAL_SORT_ORDER_ID = 1


class Invalid(Exception):
    """The change set is invalid; `field` names the offending field of the update (becomes BadRequest)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class Stale(Exception):
    """The request carries values behind the table's (becomes CommitConflict: refresh and retry)."""


_UPDATES = TypeAdapter(m.Update)


def parse_updates(raw: list) -> list[m.Update]:
    """Parse a request's `updates` array; BadRequest naming the element and field on anything malformed."""
    return m.parse_list(_UPDATES, raw, "updates", "action")


# --------------------------------------------------------------------------------------------------
# Schema helpers (shared with metadata.py's new-table path)
# --------------------------------------------------------------------------------------------------


def iter_nested(type_: Any, path: str = "") -> Iterator[tuple[int, str, Any, dict]]:
    """Yield (id, full name, type, holder) for every field under `type_`, list elements and map keys/values
    included, with Java's `indexByName` names (`a.b`, `a.element`, `a.key`, `a.value`).

    Nested generators are only started for nested types, not for each primitive: a wide schema is walked on
    every commit (metadata.py's `_check_complete`)."""
    if not isinstance(type_, dict):
        return
    kind = type_.get("type")
    prefix = f"{path}." if path else ""
    if kind == "struct":
        for field in type_.get("fields", ()):
            name, child = prefix + field["name"], field["type"]
            yield field["id"], name, child, field
            if isinstance(child, dict):
                yield from iter_nested(child, name)
    elif kind == "list":
        name, child = prefix + "element", type_["element"]
        yield type_["element-id"], name, child, type_
        if isinstance(child, dict):
            yield from iter_nested(child, name)
    elif kind == "map":
        for part in ("key", "value"):
            name, child = prefix + part, type_[part]
            yield type_[f"{part}-id"], name, child, type_
            if isinstance(child, dict):
                yield from iter_nested(child, name)


def highest_field_id(schema: dict) -> int:
    return max((entry[0] for entry in iter_nested(schema)), default=0)


def _primitive_key(type_: Any) -> Any:
    return type_.replace(" ", "").lower() if isinstance(type_, str) else _type_key(type_)


def _type_key(type_: dict) -> tuple:
    """A comparable form of a type: Java's `Type.equals` (ids, names, optionality, doc, defaults)."""
    kind = type_.get("type")
    if kind == "struct":
        return (
            "struct",
            tuple(
                (
                    f["id"],
                    f["name"],
                    bool(f["required"]),
                    _primitive_key(f["type"]),
                    f.get("doc"),
                    repr(f.get("initial-default")),
                    repr(f.get("write-default")),
                )
                for f in type_.get("fields", ())
            ),
        )
    if kind == "list":
        return ("list", type_["element-id"], bool(type_["element-required"]), _primitive_key(type_["element"]))
    return (
        "map",
        type_["key-id"],
        type_["value-id"],
        bool(type_["value-required"]),
        _primitive_key(type_["key"]),
        _primitive_key(type_["value"]),
    )


def same_schema(a: dict, b: dict) -> bool:
    """Java `Schema.sameSchema`: same struct and same identifier fields; the schema id is ignored."""
    return _type_key(a) == _type_key(b) and set(a.get("identifier-field-ids") or ()) == set(
        b.get("identifier-field-ids") or ()
    )


_V3_TYPES = ("timestamp_ns", "timestamptz_ns", "variant", "unknown", "geometry", "geography")


def check_schema(schema: dict, format_version: int, field: str) -> None:
    """Structural checks Java's `Schema` constructor and `Schema.checkCompatibility` make: unique ids and
    names, identifier fields that exist, v3-only types and non-null initial defaults only in v3+."""
    seen_ids: set[int] = set()
    seen_names: set[str] = set()
    for field_id, name, type_, holder in iter_nested(schema):
        if field_id in seen_ids:
            raise Invalid(field, f"duplicate field id {field_id} in schema")
        if name in seen_names:
            raise Invalid(field, f"multiple fields for name {name} in schema")
        seen_ids.add(field_id)
        seen_names.add(name)
        if format_version < 3:
            if isinstance(type_, str) and type_.strip().lower().startswith(_V3_TYPES):
                raise Invalid(field, f"invalid type for {name}: {type_} is not supported until v3")
            if holder.get("id") == field_id and holder.get("initial-default") is not None:
                raise Invalid(field, f"invalid initial default for {name}: non-null default is not supported until v3")
    for identifier in schema.get("identifier-field-ids") or ():
        if identifier not in seen_ids:
            raise Invalid(field, f"cannot find identifier field id {identifier} in schema")


def _field_index(schema: dict) -> tuple[dict[int, Any], dict[str, int]]:
    by_id, by_name = {}, {}
    for field_id, name, type_, _ in iter_nested(schema):
        by_id[field_id] = type_
        by_name[name] = field_id
    return by_id, by_name


_TIMESTAMPS = {"timestamp", "timestamptz", "timestamp_ns", "timestamptz_ns"}
_TRANSFORM_SOURCES = {
    "bucket": {"int", "long", "decimal", "date", "time", "string", "uuid", "fixed", "binary", *_TIMESTAMPS},
    "truncate": {"int", "long", "decimal", "string", "binary"},
    "year": {"date", *_TIMESTAMPS},
    "month": {"date", *_TIMESTAMPS},
    "day": {"date", *_TIMESTAMPS},
    "hour": _TIMESTAMPS,
}


def check_transform(transform: str, source_type: Any, field: str) -> None:
    """Java `Transform.canTransform` for the spec's transforms. Unknown transform names pass, as they do in
    Java (`UnknownTransform`), so a newer client's sort order is not refused; a partition field's transform is
    one of the spec's already (`models.PartitionField`), since pyiceberg cannot load a spec with another."""
    if not isinstance(source_type, str):
        raise Invalid(field, "cannot use a non-primitive source field")
    name = transform.strip().lower().split("[", 1)[0]
    base_type = source_type.strip().lower().split("(", 1)[0].split("[", 1)[0]
    if name == "identity" and base_type in ("variant", "geometry", "geography"):
        raise Invalid(field, f"unsupported type for identity: {source_type}")
    allowed = _TRANSFORM_SOURCES.get(name)
    if allowed is not None and base_type not in allowed:
        raise Invalid(field, f"cannot apply {transform} to a {source_type} column")


def implicit_refs(md: dict) -> dict:
    """Java's parser: metadata without `refs` (older writers) has a main branch at current-snapshot-id, if any."""
    current = md.get("current-snapshot-id")
    return {MAIN_BRANCH: {"snapshot-id": current, "type": "branch"}} if current not in (None, -1) else {}


def strip_trailing_slash(location: str) -> str:
    """Java `LocationUtil.stripTrailingSlash`, applied by the TableMetadata constructor."""
    while location.endswith("/") and not location.endswith("://"):
        location = location[:-1]
    return location


# --------------------------------------------------------------------------------------------------
# The change set being applied
# --------------------------------------------------------------------------------------------------


class SnapshotIndexes:
    """id -> snapshot for recently built `snapshots` lists, so that a commit to a table with 10,000 snapshots
    copies its base's index (~0.15 ms) instead of rebuilding it (~1-2 ms). Keyed by the list object: lists are
    copy-on-write, so a built list's entries never change. Bounded by the total number of entries; shared by
    every table of the process (a lock, as embedded services may run in several threads)."""

    MIN_SNAPSHOTS = 64            # below this, building is as cheap as copying
    MAX_ENTRIES = 1_000_000

    def __init__(self) -> None:
        self._by_list: OrderedDict[int, tuple[list, dict]] = OrderedDict()
        self._entries = 0
        self._lock = threading.Lock()

    def get(self, snapshots: list) -> dict | None:
        with self._lock:
            hit = self._by_list.get(id(snapshots))
            if hit is None or hit[0] is not snapshots:
                return None
            self._by_list.move_to_end(id(snapshots))
            return hit[1]

    def put(self, snapshots: list, index: dict) -> None:
        if len(snapshots) < self.MIN_SNAPSHOTS:
            return
        with self._lock:
            old = self._by_list.pop(id(snapshots), None)
            self._entries += len(index) - (len(old[1]) if old else 0)
            self._by_list[id(snapshots)] = (snapshots, index)
            while self._entries > self.MAX_ENTRIES and self._by_list:
                _, (_, evicted) = self._by_list.popitem(last=False)
                self._entries -= len(evicted)


SNAPSHOT_INDEXES = SnapshotIndexes()


class MetadataBuilder:
    """Java's `TableMetadata.Builder` over a JSON-shaped dict, with copy-on-write instead of defensive copies.

    Besides the metadata it tracks what Java keeps in `Builder.changes`: which schemas/specs/orders and
    snapshots were added in this change set (for -1 = "last added" and for snapshot-log times), which
    snapshots became `main` along the way (intermediate snapshot-log entries), and whether anything changed.
    """

    def __init__(self, base: dict, *, last_updated_ms: int, is_new: bool):
        self.base = base
        self.md: dict[str, Any] = dict(base)
        self.is_new = is_new
        self.last_updated_ms = last_updated_ms
        self.changed = False
        self._owned: set[str] = set()
        self._snapshots_by_id: dict[int, dict] | None = None

        self.added_schema_ids: set[int] = set()
        self.last_added_schema_id: int | None = None
        self.added_spec_ids: set[int] = set()
        self.last_added_spec_id: int | None = None
        self.added_order_ids: set[int] = set()
        self.last_added_order_id: int | None = None
        self.added_snapshot_ids: set[int] = set()
        self.main_set_to_added: list[int] = []  # added snapshots made current, in order
        self.removed_snapshots = False
        self.snapshot_log_appended = 0
        self._fill_defaults()

    def _fill_defaults(self) -> None:
        """Defaults Java's TableMetadataParser applies to metadata written by older writers (v1 without the
        list fields, no refs). Only the top-level copy is touched."""
        md = self.md
        if "schemas" not in md and isinstance(md.get("schema"), dict):
            legacy = md["schema"]
            md["schemas"] = [{**legacy, "schema-id": legacy.get("schema-id", 0)}]
            md.setdefault("current-schema-id", md["schemas"][0]["schema-id"])
        if "partition-specs" not in md and isinstance(md.get("partition-spec"), list):
            md["partition-specs"] = [{"spec-id": 0, "fields": md["partition-spec"]}]
            md.setdefault("default-spec-id", 0)
        if "last-partition-id" not in md:
            ids = [f.get("field-id", 0) for s in md.get("partition-specs", ()) for f in s["fields"]]
            md["last-partition-id"] = max(ids, default=PARTITION_DATA_ID_START - 1)
        if "sort-orders" not in md:
            md["sort-orders"] = [{"order-id": UNSORTED_ORDER_ID, "fields": []}]
            md["default-sort-order-id"] = UNSORTED_ORDER_ID
        for key, empty in (
            ("schemas", list),
            ("partition-specs", list),
            ("properties", dict),
            ("snapshots", list),
            ("snapshot-log", list),
            ("metadata-log", list),
            ("statistics", list),
            ("partition-statistics", list),
        ):
            if md.get(key) is None:
                md[key] = empty()
        md.setdefault("last-sequence-number", 0)
        if md.get("refs") is None:
            md["refs"] = implicit_refs(md)

    # copy-on-write ------------------------------------------------------------------------------

    def mutable_list(self, key: str) -> list:
        if key not in self._owned:
            self.md[key] = list(self.md.get(key) or ())
            self._owned.add(key)
        return self.md[key]

    def mutable_dict(self, key: str) -> dict:
        if key not in self._owned:
            self.md[key] = dict(self.md.get(key) or {})
            self._owned.add(key)
        return self.md[key]

    def set(self, key: str, value: Any) -> None:
        """Change a top-level field (or replace a whole list/dict with a new one the caller built)."""
        self.md[key] = value
        self._owned.add(key)
        self.changed = True
        if key == "snapshots":
            self._snapshots_by_id = None

    # lookups ------------------------------------------------------------------------------------

    @property
    def format_version(self) -> int:
        return self.md["format-version"]

    @property
    def current_snapshot_id(self) -> int:
        value = self.md.get("current-snapshot-id")
        return -1 if value is None else value

    def snapshot(self, snapshot_id: int) -> dict | None:
        if self._snapshots_by_id is None:
            cached = SNAPSHOT_INDEXES.get(self.md["snapshots"])
            self._snapshots_by_id = (dict(cached) if cached is not None
                                     else {s["snapshot-id"]: s for s in self.md["snapshots"]})
        return self._snapshots_by_id.get(snapshot_id)

    def remember_snapshot_index(self) -> None:
        """Called once the metadata is built: the next commit's builder starts from this index."""
        if self._snapshots_by_id is not None:
            SNAPSHOT_INDEXES.put(self.md["snapshots"], self._snapshots_by_id)

    def add_snapshot(self, snapshot: dict) -> None:
        self.mutable_list("snapshots").append(snapshot)
        if self._snapshots_by_id is not None:
            self._snapshots_by_id[snapshot["snapshot-id"]] = snapshot
        self.changed = True

    def schema(self, schema_id: int) -> dict | None:
        return next((s for s in self.md["schemas"] if s.get("schema-id") == schema_id), None)

    def current_schema(self) -> dict | None:
        return self.schema(self.md.get("current-schema-id"))


# --------------------------------------------------------------------------------------------------
# Shared by the add-*/set-* actions
# --------------------------------------------------------------------------------------------------


def _transform_key(transform: str) -> str:
    return transform.replace(" ", "").lower()


def _reuse_or_new_id(existing: list[dict], id_key: str, start: int, same: Callable[[dict], bool]) -> tuple[int, bool]:
    """Java's `reuseOrCreateNew*Id`: (id of the first existing item `same` accepts, True), else (one more than
    the highest id, at least `start`, False)."""
    new_id = start
    for item in existing:
        if same(item):
            return item[id_key], True
        if item[id_key] >= new_id:
            new_id = item[id_key] + 1
    return new_id, False


def _resolve_last_added(requested: int, last_added: int | None, field: str, what: str) -> int:
    """-1 means the schema/spec/sort order added last in this change set."""
    if requested != LAST_ADDED:
        return requested
    if last_added is None:
        raise Invalid(field, f"cannot set last added {what}: no {what} has been added")
    return last_added


def _check_source(field: dict, types_by_id: dict[int, Any], path: str) -> None:
    """A partition or sort field's source column is in the current schema and its transform applies to it."""
    if field["source-id"] not in types_by_id:
        raise Invalid(f"{path}.source-id", f"cannot find source column {field['source-id']}")
    check_transform(field["transform"], types_by_id[field["source-id"]], f"{path}.transform")


# --------------------------------------------------------------------------------------------------
# One function per action
# --------------------------------------------------------------------------------------------------


@functools.singledispatch
def apply_update(update: Any, b: MetadataBuilder) -> None:
    raise Invalid("action", f"cannot apply {type(update).__name__} to a table")


@apply_update.register(m.AssignUUIDUpdate)
def _assign_uuid(u: m.AssignUUIDUpdate, b: MetadataBuilder) -> None:
    """Java `assignUUID(uuid)`, except that an existing table's UUID is never replaced: the spec says
    re-assigning is not safe, and the UUID is what clients use to detect a dropped-and-recreated table."""
    try:
        uuidlib.UUID(u.uuid)
    except ValueError:
        raise Invalid("uuid", f"not a UUID: {u.uuid!r}") from None
    current = b.md.get("table-uuid")
    if current is not None and current.lower() == u.uuid.lower():
        return
    if not b.is_new and current is not None:
        raise Invalid("uuid", f"cannot reassign the UUID of an existing table ({current})")
    b.set("table-uuid", u.uuid)


@apply_update.register(m.UpgradeFormatVersionUpdate)
def _upgrade_format_version(u: m.UpgradeFormatVersionUpdate, b: MetadataBuilder) -> None:
    """Java `upgradeFormatVersion`: no downgrade, no unsupported version, same version is a no-op.
    Reaching v3 starts row lineage at next-row-id 0 (Java's INITIAL_ROW_ID)."""
    new, old = u.format_version, b.format_version
    if new > SUPPORTED_FORMAT_VERSION:
        raise Invalid(
            "format-version", f"cannot upgrade table to unsupported format version v{new} (supported: v3)"
        )
    if new < old:
        raise Invalid("format-version", f"cannot downgrade v{old} table to v{new}")
    if new == old:
        return
    b.set("format-version", new)
    if new >= ROW_LINEAGE_FORMAT_VERSION and b.md.get("next-row-id") is None:
        b.md["next-row-id"] = 0


@apply_update.register(m.AddSchemaUpdate)
def _add_schema(u: m.AddSchemaUpdate, b: MetadataBuilder) -> None:
    """Java `addSchema` -> `addSchemaInternal`.

    The client's schema-id (often -1) is ignored: an identical existing schema (same fields and identifier
    fields, `sameSchema`) keeps its id, otherwise the new id is one more than the highest. last-column-id
    becomes max(last-column-id, highest id in the schema); the deprecated `last-column-id` field is ignored.
    Re-adding a schema that existed before this change set is a no-op that also clears "last added", so a
    following set-current-schema -1 fails, exactly as in Java.
    """
    schema = {"type": "struct", **u.schema_.stored()}
    check_schema(schema, b.format_version, "schema")
    last_column_id = b.md.get("last-column-id", 0)
    new_last_column_id = max(last_column_id, highest_field_id(schema))

    new_id, found = _reuse_or_new_id(
        b.md["schemas"], "schema-id", b.md.get("current-schema-id", 0), lambda s: same_schema(s, schema)
    )
    if found and new_last_column_id == last_column_id:
        added_here = b.last_added_schema_id is not None and new_id in b.added_schema_ids
        b.last_added_schema_id = new_id if added_here else None
        return

    b.set("last-column-id", new_last_column_id)
    if not found:
        schema.pop("schema-id", None)
        b.mutable_list("schemas").append({"type": "struct", "schema-id": new_id, **schema})
    b.added_schema_ids.add(new_id)
    b.last_added_schema_id = new_id


@apply_update.register(m.SetCurrentSchemaUpdate)
def _set_current_schema(u: m.SetCurrentSchemaUpdate, b: MetadataBuilder) -> None:
    """Java `setCurrentSchema(int)`: -1 means the schema added last in this change set."""
    schema_id = _resolve_last_added(u.schema_id, b.last_added_schema_id, "schema-id", "schema")
    if schema_id == b.md.get("current-schema-id"):
        return
    if b.schema(schema_id) is None:
        raise Invalid("schema-id", f"cannot set current schema to unknown schema: {schema_id}")
    b.set("current-schema-id", schema_id)


def _spec_key(fields: list[dict]) -> list[tuple]:
    """Java `PartitionSpec.compatibleWith`: same fields in order by source, transform and name; ids ignored."""
    return [(f["source-id"], _transform_key(f["transform"]), f["name"]) for f in fields]


def _order_key(fields: list[dict]) -> list[tuple]:
    """Java `SortOrder.sameOrder`: same fields in order; the order id is ignored."""
    return [(f["source-id"], _transform_key(f["transform"]), f["direction"], f["null-order"]) for f in fields]


@apply_update.register(m.AddPartitionSpecUpdate)
def _add_spec(u: m.AddPartitionSpecUpdate, b: MetadataBuilder) -> None:
    """Java `addPartitionSpec(UnboundPartitionSpec)`: bind to the current schema, reuse the id of a
    compatible spec, otherwise id = highest + 1; last-partition-id = max(it, the spec's highest field id).

    Field ids the client sent are kept (as Java does). Missing ones are assigned as the Iceberg spec asks
    (reuse the id of an equal source+transform field in any spec, else last-partition-id + 1) rather than
    by Java's bind, which counts from 1000 inside the one spec and could collide with older specs; v1 keeps
    Java's sequential 1000, 1001, ... which v1 requires anyway.
    """
    schema = b.current_schema()
    if schema is None:
        raise Invalid("spec", "cannot add a partition spec before a schema is added")
    types_by_id, ids_by_name = _field_index(schema)
    spec = u.spec.stored()
    fields = [dict(f) for f in spec.get("fields", ())]
    names: set[str] = set()
    for i, field in enumerate(fields):
        if field["transform"].strip().lower() != "void":  # void may keep a dropped column (v1)
            _check_source(field, types_by_id, f"spec.fields[{i}]")
        name = field["name"]
        if not name:
            raise Invalid(f"spec.fields[{i}].name", "cannot use empty partition name")
        if name in names:
            raise Invalid(f"spec.fields[{i}].name", f"cannot use partition name more than once: {name}")
        if name in ids_by_name and ids_by_name[name] != field["source-id"]:
            raise Invalid(f"spec.fields[{i}].name", f"partition name {name} conflicts with a schema field")
        names.add(name)

    key = _spec_key(fields)
    new_id, found = _reuse_or_new_id(b.md["partition-specs"], "spec-id", 0, lambda s: _spec_key(s["fields"]) == key)
    if found:
        added_here = b.last_added_spec_id is not None and b.last_added_spec_id in b.added_spec_ids
        b.last_added_spec_id = new_id if added_here else None
        return

    _assign_partition_field_ids(fields, b)
    if b.format_version == 1 and any(f["field-id"] != PARTITION_DATA_ID_START + i for i, f in enumerate(fields)):
        raise Invalid("spec.fields", "spec does not use sequential ids that are required in v1")
    highest = max((f["field-id"] for f in fields), default=PARTITION_DATA_ID_START - 1)
    b.set("last-partition-id", max(b.md.get("last-partition-id", 0), highest))
    spec.pop("spec-id", None)
    spec.pop("fields", None)
    b.mutable_list("partition-specs").append({"spec-id": new_id, "fields": fields, **spec})
    b.added_spec_ids.add(new_id)
    b.last_added_spec_id = new_id


def _assign_partition_field_ids(fields: list[dict], b: MetadataBuilder) -> None:
    if all(f.get("field-id") is not None for f in fields):
        return
    explicit = [f["field-id"] for f in fields if f.get("field-id") is not None]
    if b.format_version == 1:
        last = PARTITION_DATA_ID_START - 1
        for f in fields:
            if f.get("field-id") is None:
                f["field-id"] = last + 1
            last = max(last, f["field-id"])
        return
    existing = {
        (f["source-id"], _transform_key(f["transform"])): f["field-id"]
        for s in b.md["partition-specs"]
        for f in s["fields"]
    }
    last = max([b.md.get("last-partition-id", 0), PARTITION_DATA_ID_START - 1, *explicit])
    for f in fields:
        if f.get("field-id") is None:
            reuse = existing.get((f["source-id"], _transform_key(f["transform"])))
            if reuse is None or reuse in explicit:
                last += 1
                reuse = last
            f["field-id"] = reuse


@apply_update.register(m.SetDefaultSpecUpdate)
def _set_default_spec(u: m.SetDefaultSpecUpdate, b: MetadataBuilder) -> None:
    """Java `setDefaultPartitionSpec(int)`: -1 means the spec added last in this change set."""
    spec_id = _resolve_last_added(u.spec_id, b.last_added_spec_id, "spec-id", "spec")
    if spec_id == b.md.get("default-spec-id"):
        return
    # Java defers this to build(), where an unknown default spec fails; failing here names the field.
    if not any(s["spec-id"] == spec_id for s in b.md["partition-specs"]):
        raise Invalid("spec-id", f"cannot set default spec to unknown spec: {spec_id}")
    b.set("default-spec-id", spec_id)


@apply_update.register(m.AddSortOrderUpdate)
def _add_sort_order(u: m.AddSortOrderUpdate, b: MetadataBuilder) -> None:
    """Java `addSortOrder(UnboundSortOrder)`: the unsorted order is always id 0; an identical order
    (`sameOrder`: same fields) keeps its id; otherwise id = max(1, highest + 1)."""
    order = u.sort_order.stored()
    fields = order.get("fields", [])
    schema = b.current_schema()
    if schema is None:
        raise Invalid("sort-order", "cannot add a sort order before a schema is added")
    types_by_id, _ = _field_index(schema)
    for i, field in enumerate(fields):
        _check_source(field, types_by_id, f"sort-order.fields[{i}]")

    if not fields:
        new_id = UNSORTED_ORDER_ID
        found = any(o["order-id"] == UNSORTED_ORDER_ID for o in b.md["sort-orders"])
    else:
        key = _order_key(fields)
        new_id, found = _reuse_or_new_id(
            b.md["sort-orders"], "order-id", INITIAL_SORT_ORDER_ID, lambda o: _order_key(o["fields"]) == key
        )
    if found:
        added_here = b.last_added_order_id is not None and b.last_added_order_id in b.added_order_ids
        b.last_added_order_id = new_id if added_here else None
        return

    order.pop("order-id", None)
    order.pop("fields", None)
    b.mutable_list("sort-orders").append({"order-id": new_id, "fields": fields, **order})
    b.changed = True
    b.added_order_ids.add(new_id)
    b.last_added_order_id = new_id


@apply_update.register(m.SetDefaultSortOrderUpdate)
def _set_default_sort_order(u: m.SetDefaultSortOrderUpdate, b: MetadataBuilder) -> None:
    """Java `setDefaultSortOrder(int)`: -1 means the order added last in this change set."""
    order_id = _resolve_last_added(u.sort_order_id, b.last_added_order_id, "sort-order-id", "sort order")
    if order_id == b.md.get("default-sort-order-id"):
        return
    if not any(o["order-id"] == order_id for o in b.md["sort-orders"]):
        raise Invalid("sort-order-id", f"cannot set default sort order to unknown order: {order_id}")
    b.set("default-sort-order-id", order_id)


@apply_update.register(m.AddSnapshotUpdate)
def _add_snapshot(u: m.AddSnapshotUpdate, b: MetadataBuilder) -> None:
    """Java `addSnapshot`.

    * The snapshot id must be new.
    * v2+: sequence-number must be greater than last-sequence-number unless the snapshot has no parent;
      a stale one is retryable (409), not malformed. last-sequence-number becomes the snapshot's number,
      and (Java's constructor) no snapshot may have a larger one.
    * v3 row lineage: first-row-id is required and must be >= next-row-id (stale -> 409); next-row-id then
      advances by added-rows.
    """
    snap = u.snapshot
    md = b.md
    if not md["schemas"]:
        raise Invalid("snapshot", "attempting to add a snapshot before a schema is added")
    if not md["partition-specs"]:
        raise Invalid("snapshot", "attempting to add a snapshot before a partition spec is added")
    if not md["sort-orders"]:
        raise Invalid("snapshot", "attempting to add a snapshot before a sort order is added")
    if b.snapshot(snap.snapshot_id) is not None:
        raise Invalid("snapshot.snapshot-id", f"snapshot already exists for id: {snap.snapshot_id}")

    sequence_number = snap.sequence_number or 0
    last = md["last-sequence-number"]
    if b.format_version == 1 and sequence_number != 0:
        raise Invalid("snapshot.sequence-number", f"sequence number must be 0 in v1: {sequence_number}")
    if b.format_version > 1 and sequence_number <= last and snap.parent_snapshot_id is not None:
        raise Stale(
            f"cannot add snapshot with sequence number {sequence_number} "
            f"older than last sequence number {last}"
        )
    if sequence_number < last:
        newer = max((s.get("sequence-number", 0) for s in md["snapshots"]), default=0)
        if newer > sequence_number:
            raise Invalid(
                "snapshot.sequence-number",
                f"invalid snapshot with sequence number {newer} greater than last sequence number {sequence_number}",
            )

    if b.format_version >= ROW_LINEAGE_FORMAT_VERSION:
        next_row_id = md.get("next-row-id") or 0
        if snap.first_row_id is None:
            raise Invalid("snapshot.first-row-id", "cannot add a snapshot: first-row-id is null")
        if snap.first_row_id < next_row_id:
            raise Stale(
                f"cannot add a snapshot, first-row-id is behind table next-row-id: "
                f"{snap.first_row_id} < {next_row_id}"
            )
        if snap.added_rows is None or snap.added_rows < 0:
            raise Invalid("snapshot.added-rows", "cannot add a snapshot: added-rows is required in v3 and >= 0")
        md["next-row-id"] = next_row_id + snap.added_rows

    b.set("last-sequence-number", sequence_number)
    b.add_snapshot(snap.stored())
    b.added_snapshot_ids.add(snap.snapshot_id)


def _same_ref(a: dict, b: dict) -> bool:
    """Java `SnapshotRef.equals`: id, type and the three retention settings (absent == null)."""
    keys = ("snapshot-id", "type", "min-snapshots-to-keep", "max-snapshot-age-ms", "max-ref-age-ms")
    return all(a.get(k) == b.get(k) for k in keys)


@apply_update.register(m.SetSnapshotRefUpdate)
def _set_snapshot_ref(u: m.SetSnapshotRefUpdate, b: MetadataBuilder) -> None:
    """Java `setRef`: an identical ref is a no-op; the snapshot must exist; main must be a branch.

    Setting main also sets current-snapshot-id and appends to snapshot-log. The entry's time is the
    snapshot's own timestamp if it was added in this change set, otherwise (a rollback to an older
    snapshot) the commit time, so that history shows when the table actually changed.
    """
    ref = u.ref()
    existing = b.md["refs"].get(u.ref_name)
    if existing is not None and _same_ref(existing, ref):
        return
    snapshot = b.snapshot(u.snapshot_id)
    if snapshot is None:
        raise Invalid("snapshot-id", f"cannot set {u.ref_name} to unknown snapshot: {u.snapshot_id}")
    if u.ref_name == MAIN_BRANCH and u.type != "branch":
        raise Invalid("type", "cannot set main to a tag, it must be a branch")
    if u.ref_name == MAIN_BRANCH:
        b.set("current-snapshot-id", u.snapshot_id)
        is_added = u.snapshot_id in b.added_snapshot_ids
        when = snapshot["timestamp-ms"] if is_added else b.last_updated_ms
        b.mutable_list("snapshot-log").append({"timestamp-ms": when, "snapshot-id": u.snapshot_id})
        b.snapshot_log_appended += 1
        if is_added:
            b.main_set_to_added.append(u.snapshot_id)
    b.mutable_dict("refs")[u.ref_name] = ref
    b.changed = True


def _remove_ref(b: MetadataBuilder, name: str) -> None:
    """Java `removeRef`: removing main also clears the current snapshot (-1)."""
    if name == MAIN_BRANCH:
        b.md["current-snapshot-id"] = -1
    if name in b.md["refs"]:
        del b.mutable_dict("refs")[name]
        b.changed = True


@apply_update.register(m.RemoveSnapshotRefUpdate)
def _remove_snapshot_ref(u: m.RemoveSnapshotRefUpdate, b: MetadataBuilder) -> None:
    _remove_ref(b, u.ref_name)


@apply_update.register(m.RemoveSnapshotsUpdate)
def _remove_snapshots(u: m.RemoveSnapshotsUpdate, b: MetadataBuilder) -> None:
    """Java `removeSnapshots`: unknown ids are ignored; the removed snapshots' statistics and partition
    statistics go with them, and so does every ref left pointing at a removed snapshot (main included,
    which clears the current snapshot). The snapshot-log is corrected when the change set is built."""
    to_remove = set(u.snapshot_ids)
    removed = {s["snapshot-id"] for s in b.md["snapshots"] if s["snapshot-id"] in to_remove}
    if not removed:
        return
    b.set("snapshots", [s for s in b.md["snapshots"] if s["snapshot-id"] not in removed])
    _remove_per_snapshot(b, "statistics", removed)
    _remove_per_snapshot(b, "partition-statistics", removed)
    for name in [n for n, ref in b.md["refs"].items() if ref["snapshot-id"] in removed]:
        _remove_ref(b, name)
    b.removed_snapshots = True
    b.changed = True


@apply_update.register(m.SetLocationUpdate)
def _set_location(u: m.SetLocationUpdate, b: MetadataBuilder) -> None:
    location = strip_trailing_slash(u.location)
    if not location:
        raise Invalid("location", "location must not be empty")
    if location != b.md.get("location"):
        b.set("location", location)


@apply_update.register(m.SetPropertiesUpdate)
def _set_properties(u: m.SetPropertiesUpdate, b: MetadataBuilder) -> None:
    """Java `setProperties`: stored as given (reserved keys are only filtered when creating a table)."""
    if u.updates:
        b.mutable_dict("properties").update(u.updates)
        b.changed = True


@apply_update.register(m.RemovePropertiesUpdate)
def _remove_properties(u: m.RemovePropertiesUpdate, b: MetadataBuilder) -> None:
    if u.removals:
        properties = b.mutable_dict("properties")
        for key in u.removals:
            properties.pop(key, None)
        b.changed = True


def _replace_per_snapshot(b: MetadataBuilder, key: str, item: dict) -> None:
    """Java keeps one statistics file per snapshot: a new one replaces the old one in place."""
    files = b.mutable_list(key)
    for i, existing in enumerate(files):
        if existing["snapshot-id"] == item["snapshot-id"]:
            files[i] = item
            break
    else:
        files.append(item)
    b.changed = True


def _remove_per_snapshot(b: MetadataBuilder, key: str, snapshot_ids: set[int]) -> None:
    if any(f["snapshot-id"] in snapshot_ids for f in b.md[key]):
        b.set(key, [f for f in b.md[key] if f["snapshot-id"] not in snapshot_ids])


@apply_update.register(m.SetStatisticsUpdate)
def _set_statistics(u: m.SetStatisticsUpdate, b: MetadataBuilder) -> None:
    _replace_per_snapshot(b, "statistics", u.statistics.stored())


@apply_update.register(m.RemoveStatisticsUpdate)
def _remove_statistics(u: m.RemoveStatisticsUpdate, b: MetadataBuilder) -> None:
    _remove_per_snapshot(b, "statistics", {u.snapshot_id})


@apply_update.register(m.SetPartitionStatisticsUpdate)
def _set_partition_statistics(u: m.SetPartitionStatisticsUpdate, b: MetadataBuilder) -> None:
    _replace_per_snapshot(b, "partition-statistics", u.partition_statistics.stored())


@apply_update.register(m.RemovePartitionStatisticsUpdate)
def _remove_partition_statistics(u: m.RemovePartitionStatisticsUpdate, b: MetadataBuilder) -> None:
    _remove_per_snapshot(b, "partition-statistics", {u.snapshot_id})


@apply_update.register(m.AddEncryptionKeyUpdate)
def _add_encryption_key(u: m.AddEncryptionKeyUpdate, b: MetadataBuilder) -> None:
    """Java `addEncryptionKey`: a key id that already exists is a no-op."""
    key = u.encryption_key.stored()
    if any(k["key-id"] == key["key-id"] for k in b.md.get("encryption-keys") or ()):
        return
    b.mutable_list("encryption-keys").append(key)
    b.changed = True


@apply_update.register(m.RemoveEncryptionKeyUpdate)
def _remove_encryption_key(u: m.RemoveEncryptionKeyUpdate, b: MetadataBuilder) -> None:
    keys = b.md.get("encryption-keys") or ()
    if any(k["key-id"] == u.key_id for k in keys):
        remaining = [k for k in keys if k["key-id"] != u.key_id]
        b.set("encryption-keys", remaining)
        if not remaining:
            del b.md["encryption-keys"]  # Java writes the field only when there are keys


@apply_update.register(m.RemoveSchemasUpdate)
def _remove_schemas(u: m.RemoveSchemasUpdate, b: MetadataBuilder) -> None:
    """Java `removeSchemas`: the current schema cannot be removed; unknown ids are ignored."""
    ids = set(u.schema_ids)
    if b.md.get("current-schema-id") in ids:
        raise Invalid("schema-ids", "cannot remove the current schema")
    if ids:
        b.set("schemas", [s for s in b.md["schemas"] if s["schema-id"] not in ids])


@apply_update.register(m.RemovePartitionSpecsUpdate)
def _remove_partition_specs(u: m.RemovePartitionSpecsUpdate, b: MetadataBuilder) -> None:
    """Java `removeSpecs`: the default spec cannot be removed; unknown ids are ignored."""
    ids = set(u.spec_ids)
    if b.md.get("default-spec-id") in ids:
        raise Invalid("spec-ids", "cannot remove the default partition spec")
    if ids:
        b.set("partition-specs", [s for s in b.md["partition-specs"] if s["spec-id"] not in ids])
