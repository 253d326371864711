"""The updates that change a table's structure: its UUID and format version, schemas, partition specs and sort
orders (Java `TableMetadata.Builder`'s methods of the same names), and the schema helpers they and new-table
metadata share. Each registers with `builder.apply_update`; `updates.py` holds the others.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any, Callable, Iterator

from .. import changes as m
from .builder import (INITIAL_SORT_ORDER_ID, LAST_ADDED, PARTITION_DATA_ID_START, ROW_LINEAGE_FORMAT_VERSION,
                      SUPPORTED_FORMAT_VERSION, UNSORTED_ORDER_ID, Invalid, MetadataBuilder, apply_update)


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

