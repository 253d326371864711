"""Commit rules for Iceberg tables: requirements, updates, new-table metadata (Java TableMetadata semantics)."""

from __future__ import annotations

import copy
import json

import pytest
from pyiceberg.table.metadata import TableMetadataUtil

import coordinator.iceberg as iceberg
from coordinator.errors import BadRequest, CommitConflict, NotFound
from coordinator.iceberg import apply_commit, check_requirements, new_table_metadata, parse_requirements, parse_updates

UUID = "9c12d441-03fe-4693-9a96-a0705ddf69c1"
T0 = 1_700_000_000_000

SCHEMA = {
    "type": "struct",
    "fields": [
        {"id": 1, "name": "id", "type": "long", "required": True},
        {"id": 2, "name": "data", "type": "string", "required": False},
        {"id": 3, "name": "ts", "type": "timestamptz", "required": False},
    ],
}


def new_table(format_version: int = 2, **kw) -> dict:
    args = dict(
        location="s3://bucket/db/t",
        schema=SCHEMA,
        partition_spec={"fields": [{"source-id": 3, "name": "ts_day", "transform": "day"}]},
        sort_order=None,
        properties={"owner": "me"},
        format_version=format_version,
        table_uuid=UUID,
        now_ms=T0,
    )
    args.update(kw)
    return new_table_metadata(**args)


def commit(base, updates, requirements=(), *, location="s3://bucket/db/t/metadata/v1.metadata.json", now=T0 + 1000):
    return apply_commit(
        base,
        parse_requirements(list(requirements)),
        parse_updates(list(updates)),
        base_location=location,
        now_ms=now,
    )


def snapshot(snapshot_id, *, parent=None, seq=1, ts=T0 + 500, **extra):
    snap = {
        "snapshot-id": snapshot_id,
        "sequence-number": seq,
        "timestamp-ms": ts,
        "manifest-list": f"s3://bucket/db/t/metadata/snap-{snapshot_id}.avro",
        "summary": {"operation": "append"},
        "schema-id": 0,
        **extra,
    }
    if parent is not None:
        snap["parent-snapshot-id"] = parent
    return snap


def add_and_set_main(snap):
    return [
        {"action": "add-snapshot", "snapshot": snap},
        {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": snap["snapshot-id"]},
    ]


def with_snapshots(n: int, base=None) -> dict:
    """A v2 table with snapshots 1..n committed one per commit, main at n."""
    md = base or new_table()
    for i in range(1, n + 1):
        md = commit(md, add_and_set_main(snapshot(i, parent=i - 1 or None, seq=i, ts=T0 + i)), now=T0 + i)
    return md


def add_schema(fields, schema_id=-1):
    return {"action": "add-schema", "schema": {"type": "struct", "schema-id": schema_id, "fields": fields}}


EXTRA_COLUMN = {"id": 4, "name": "extra", "type": "int", "required": False}
SET_LAST_SCHEMA = {"action": "set-current-schema", "schema-id": -1}


def set_ref(name, snapshot_id, kind="branch", **retention):
    return {"action": "set-snapshot-ref", "ref-name": name, "type": kind, "snapshot-id": snapshot_id, **retention}


def add_spec(*fields):
    return {"action": "add-spec", "spec": {"fields": list(fields)}}


def part(source_id, name, transform, **extra):
    return {"source-id": source_id, "name": name, "transform": transform, **extra}


def sort_field(source_id, direction="asc", null_order="nulls-first"):
    return {"source-id": source_id, "transform": "identity", "direction": direction, "null-order": null_order}


# --------------------------------------------------------------------------------------------------
# Public surface
# --------------------------------------------------------------------------------------------------


def test_exports():
    assert sorted(iceberg.__all__) == [
        "Requirement",
        "Update",
        "apply_commit",
        "check_requirements",
        "new_table_metadata",
        "parse_requirements",
        "parse_updates",
    ]


# --------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------


def test_parse_unknown_requirement_type():
    with pytest.raises(BadRequest, match=r"requirements\[1\]\.type: unknown type 'assert-nothing'"):
        parse_requirements([{"type": "assert-create"}, {"type": "assert-nothing"}])


def test_parse_unknown_action_and_view_actions():
    with pytest.raises(BadRequest, match=r"updates\[0\]\.action: unknown action 'frobnicate'"):
        parse_updates([{"action": "frobnicate"}])
    with pytest.raises(BadRequest, match=r"updates\[0\]\.action: unknown action 'add-view-version'"):
        parse_updates([{"action": "add-view-version", "view-version": {}}])
    with pytest.raises(BadRequest, match=r"updates\[0\]\.action: missing"):
        parse_updates([{"schema-id": 1}])


def test_parse_names_the_bad_field():
    with pytest.raises(BadRequest, match=r"^updates\[1\]\.schema-id: "):
        parse_updates([{"action": "remove-properties", "removals": []}, {**SET_LAST_SCHEMA, "schema-id": "x"}])
    snap = snapshot(1)
    del snap["manifest-list"]
    with pytest.raises(BadRequest, match=r"^updates\[0\]\.snapshot\.manifest-list: Field required"):
        parse_updates([{"action": "add-snapshot", "snapshot": snap}])
    bad_type = add_schema([{"id": 1, "name": "a", "type": {"type": "list", "element": "int"}, "required": True}])
    with pytest.raises(BadRequest, match=r"^updates\[0\]\.schema\.fields\[0\]\.type\.element-id: Field required"):
        parse_updates([bad_type])
    with pytest.raises(BadRequest, match=r"unknown primitive type 'integer'"):
        parse_updates([add_schema([{"id": 1, "name": "a", "type": "integer", "required": True}])])
    with pytest.raises(BadRequest, match=r"^requirements\[0\]\.current-schema-id: Field required"):
        parse_requirements([{"type": "assert-current-schema-id"}])


def test_parse_ref_retention_rules():
    ref = {"action": "set-snapshot-ref", "ref-name": "t", "type": "tag", "snapshot-id": 1}
    assert parse_updates([ref])[0].ref() == {"snapshot-id": 1, "type": "tag"}
    with pytest.raises(BadRequest, match="tags do not support min-snapshots-to-keep"):
        parse_updates([{**ref, "min-snapshots-to-keep": 2}])
    with pytest.raises(BadRequest, match="max-ref-age-ms must be greater than 0"):
        parse_updates([{**ref, "max-ref-age-ms": 0}])


def test_models_accept_python_names():
    from coordinator.iceberg import changes as models

    update = models.SetSnapshotRefUpdate(ref_name="main", type="branch", snapshot_id=5)
    assert update.model_dump(by_alias=True, exclude_none=True) == {
        "action": "set-snapshot-ref",
        "ref-name": "main",
        "type": "branch",
        "snapshot-id": 5,
    }


# --------------------------------------------------------------------------------------------------
# Requirements: one pass and one fail each
# --------------------------------------------------------------------------------------------------


def test_assert_create():
    check_requirements(None, parse_requirements([{"type": "assert-create"}]))
    with pytest.raises(CommitConflict, match="Requirement failed: table already exists"):
        check_requirements(new_table(), parse_requirements([{"type": "assert-create"}]))


def test_assert_table_uuid():
    md = new_table()
    check_requirements(md, parse_requirements([{"type": "assert-table-uuid", "uuid": UUID.upper()}]))
    other = "00000000-0000-0000-0000-000000000000"
    with pytest.raises(CommitConflict, match=f"UUID does not match: expected {other}, found {UUID}"):
        check_requirements(md, parse_requirements([{"type": "assert-table-uuid", "uuid": other}]))


def test_assert_ref_snapshot_id():
    md = with_snapshots(2)
    ok = [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": 2}]
    check_requirements(md, parse_requirements(ok))
    check_requirements(md, parse_requirements([{"type": "assert-ref-snapshot-id", "ref": "b", "snapshot-id": None}]))

    stale = [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": 1}]
    with pytest.raises(CommitConflict, match="Requirement failed: branch main has changed: expected id 1, found 2"):
        check_requirements(md, parse_requirements(stale))
    must_not_exist = [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": None}]
    with pytest.raises(CommitConflict, match="branch main was created concurrently"):
        check_requirements(md, parse_requirements(must_not_exist))
    missing = [{"type": "assert-ref-snapshot-id", "ref": "dev", "snapshot-id": 1}]
    with pytest.raises(CommitConflict, match="branch or tag dev is missing, expected id 1"):
        check_requirements(md, parse_requirements(missing))


@pytest.mark.parametrize(
    ("requirement", "field", "message"),
    [
        ("assert-last-assigned-field-id", "last-assigned-field-id", "last assigned field id changed"),
        ("assert-current-schema-id", "current-schema-id", "current schema changed"),
        ("assert-last-assigned-partition-id", "last-assigned-partition-id", "last assigned partition id changed"),
        ("assert-default-spec-id", "default-spec-id", "default partition spec changed"),
        ("assert-default-sort-order-id", "default-sort-order-id", "default sort order changed"),
    ],
)
def test_assert_metadata_ids(requirement, field, message):
    md = new_table()  # last-column-id 3, schema 0, last-partition-id 1000, spec 0, order 0
    actual = {
        "last-assigned-field-id": 3,
        "current-schema-id": 0,
        "last-assigned-partition-id": 1000,
        "default-spec-id": 0,
        "default-sort-order-id": 0,
    }[field]
    check_requirements(md, parse_requirements([{"type": requirement, field: actual}]))
    expected = f"Requirement failed: {message}: expected id {actual + 7}, found {actual}"
    with pytest.raises(CommitConflict, match=expected):
        check_requirements(md, parse_requirements([{"type": requirement, field: actual + 7}]))


def test_requirements_against_missing_table():
    # Java skips the last-assigned-id checks when there is no table (old create transactions send them).
    field_id = {"type": "assert-last-assigned-field-id", "last-assigned-field-id": 9}
    check_requirements(None, parse_requirements([field_id]))
    with pytest.raises(CommitConflict, match="table does not exist"):
        check_requirements(None, parse_requirements([{"type": "assert-current-schema-id", "current-schema-id": 0}]))


def test_failed_requirement_applies_nothing():
    md = new_table()
    before = copy.deepcopy(md)
    with pytest.raises(CommitConflict):
        commit(
            md,
            [{"action": "set-properties", "updates": {"a": "b"}}],
            [{"type": "assert-current-schema-id", "current-schema-id": 5}],
        )
    assert md == before


# --------------------------------------------------------------------------------------------------
# New tables
# --------------------------------------------------------------------------------------------------


def test_new_table_reassigns_ids_like_java():
    schema = {
        "type": "struct",
        "schema-id": 7,
        "identifier-field-ids": [10],
        "fields": [
            {"id": 10, "name": "id", "type": "long", "required": True},
            {
                "id": 20,
                "name": "point",
                "required": False,
                "type": {
                    "type": "struct",
                    "fields": [
                        {"id": 21, "name": "x", "type": "double", "required": True},
                        {"id": 22, "name": "y", "type": "double", "required": True},
                    ],
                },
            },
            {
                "id": 30,
                "name": "tags",
                "required": False,
                "type": {
                    "type": "map",
                    "key-id": 31,
                    "key": "string",
                    "value-id": 32,
                    "value": {"type": "list", "element-id": 33, "element": "int", "element-required": False},
                    "value-required": False,
                },
            },
            {"id": 40, "name": "ts", "type": "timestamp", "required": False},
        ],
    }
    md = new_table_metadata(
        location="s3://b/t/",
        schema=schema,
        partition_spec={"spec-id": 5, "fields": [part(40, "ts_hour", "hour", **{"field-id": 77})]},
        sort_order={"order-id": 9, "fields": [sort_field(22, "desc", "nulls-last")]},
        properties={"format-version": "1", "current-schema": "x", "k": "v"},
        format_version=None,
        table_uuid=UUID,
        now_ms=T0,
    )
    fresh = md["schemas"][0]
    # Java AssignFreshIds: a struct's own fields first (1-4), then each nested type in order.
    assert [f["id"] for f in fresh["fields"]] == [1, 2, 3, 4]
    assert [f["id"] for f in fresh["fields"][1]["type"]["fields"]] == [5, 6]
    tags = fresh["fields"][2]["type"]
    assert (tags["key-id"], tags["value-id"], tags["value"]["element-id"]) == (7, 8, 9)
    assert fresh["identifier-field-ids"] == [1]
    assert fresh["schema-id"] == 0 and md["current-schema-id"] == 0
    assert md["last-column-id"] == 9
    assert md["partition-specs"] == [
        {"spec-id": 0, "fields": [{"field-id": 1000, "source-id": 4, "name": "ts_hour", "transform": "hour"}]}
    ]
    assert md["last-partition-id"] == 1000
    assert md["sort-orders"][0]["order-id"] == 1 and md["default-sort-order-id"] == 1
    assert md["sort-orders"][0]["fields"][0]["source-id"] == 6
    assert md["format-version"] == 1  # from the property, which is reserved and not kept
    assert md["properties"] == {"write.parquet.compression-codec": "zstd", "k": "v"}
    assert md["location"] == "s3://b/t"
    assert md["current-snapshot-id"] == -1 and md["last-sequence-number"] == 0
    assert md["refs"] == {} and md["snapshots"] == [] and md["metadata-log"] == []
    assert md["schema"] == fresh and md["partition-spec"] == md["partition-specs"][0]["fields"]  # v1 legacy


def test_new_table_unsorted_and_v3():
    md = new_table(3, partition_spec=None)
    assert md["sort-orders"] == [{"order-id": 0, "fields": []}] and md["default-sort-order-id"] == 0
    assert md["partition-specs"] == [{"spec-id": 0, "fields": []}] and md["last-partition-id"] == 999
    assert md["next-row-id"] == 0
    assert md["current-snapshot-id"] is None  # Java writes null from v3 on


def test_new_table_rejects_bad_input():
    with pytest.raises(BadRequest, match=r"partition-spec\.fields\[0\]\.source-id: cannot find source column 99"):
        new_table(partition_spec={"fields": [{"source-id": 99, "name": "p", "transform": "identity"}]})
    with pytest.raises(BadRequest, match="format-version: unsupported format version v4"):
        new_table(4)
    with pytest.raises(BadRequest, match="timestamp_ns is not supported until v3"):
        nanos = {"id": 1, "name": "t", "type": "timestamp_ns", "required": False}
        new_table(schema={"type": "struct", "fields": [nanos]}, partition_spec=None)
    with pytest.raises(BadRequest, match=r"^schema\.fields\[0\]\.required: Field required"):
        new_table(schema={"type": "struct", "fields": [{"id": 1, "name": "t", "type": "int"}]})


# --------------------------------------------------------------------------------------------------
# Create transactions (base=None)
# --------------------------------------------------------------------------------------------------


def spark_create_updates(format_version=2):
    """What Java's RESTSessionCatalog sends for a create transaction (TableMetadata changes, in order)."""
    return [
        {"action": "assign-uuid", "uuid": "5e8f1f9e-6b5c-4d54-9a43-3d0b7f1bb0c1"},
        {"action": "upgrade-format-version", "format-version": format_version},
        {"action": "add-schema", "schema": {**SCHEMA, "schema-id": 0}, "last-column-id": 3},
        {"action": "set-current-schema", "schema-id": -1},
        {"action": "add-spec", "spec": {"spec-id": 0, "fields": [part(3, "ts_day", "day", **{"field-id": 1000})]}},
        {"action": "set-default-spec", "spec-id": -1},
        {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
        {"action": "set-default-sort-order", "sort-order-id": -1},
        {"action": "set-location", "location": "s3://bucket/db/t"},
        {"action": "set-properties", "updates": {"write.parquet.compression-codec": "zstd"}},
    ]


def test_create_transaction():
    extra = add_and_set_main(snapshot(11, seq=1, ts=T0 + 10))
    md = apply_commit(
        None,
        parse_requirements([{"type": "assert-create"}]),
        parse_updates(spark_create_updates() + extra),
        base_location=None,
        now_ms=T0 + 20,
        table_uuid=UUID,
    )
    assert md["table-uuid"] == "5e8f1f9e-6b5c-4d54-9a43-3d0b7f1bb0c1"  # the client's assign-uuid wins, as in Java
    assert md["format-version"] == 2
    assert md["schemas"][0]["schema-id"] == 0 and md["current-schema-id"] == 0 and md["last-column-id"] == 3
    assert md["last-partition-id"] == 1000 and md["default-sort-order-id"] == 0
    assert md["current-snapshot-id"] == 11 and md["refs"]["main"] == {"snapshot-id": 11, "type": "branch"}
    assert md["snapshot-log"] == [{"timestamp-ms": T0 + 10, "snapshot-id": 11}]
    assert md["metadata-log"] == [] and md["last-updated-ms"] == T0 + 20


def test_create_transaction_v3_and_v1():
    v3 = apply_commit(None, parse_requirements([{"type": "assert-create"}]), parse_updates(spark_create_updates(3)),
                      base_location=None, now_ms=T0, table_uuid=UUID)
    assert v3["format-version"] == 3 and v3["next-row-id"] == 0
    # buildFromEmpty(1): the first upgrade-format-version picks the starting version, so v1 is no downgrade.
    v1 = apply_commit(None, parse_requirements([{"type": "assert-create"}]), parse_updates(spark_create_updates(1)),
                      base_location=None, now_ms=T0, table_uuid=UUID)
    assert v1["format-version"] == 1


def test_create_transaction_needs_assert_create_and_a_schema():
    with pytest.raises(NotFound):
        apply_commit(None, [], parse_updates(spark_create_updates()), base_location=None, now_ms=T0, table_uuid=UUID)
    with pytest.raises(BadRequest, match="current-schema-id"):
        apply_commit(None, parse_requirements([{"type": "assert-create"}]),
                     parse_updates([{"action": "set-location", "location": "s3://x"}]),
                     base_location=None, now_ms=T0, table_uuid=UUID)


# --------------------------------------------------------------------------------------------------
# Updates: one test per action
# --------------------------------------------------------------------------------------------------


def test_assign_uuid():
    md = new_table()
    assert commit(md, [{"action": "assign-uuid", "uuid": UUID.upper()}]) is md  # same UUID: no change
    with pytest.raises(BadRequest, match=r"updates\[0\]\.uuid: cannot reassign the UUID of an existing table"):
        commit(md, [{"action": "assign-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}])


def test_upgrade_format_version():
    md = new_table(2)
    v3 = commit(md, [{"action": "upgrade-format-version", "format-version": 3}])
    assert v3["format-version"] == 3 and v3["next-row-id"] == 0 and v3["current-snapshot-id"] is None
    assert commit(md, [{"action": "upgrade-format-version", "format-version": 2}]) is md
    with pytest.raises(BadRequest, match=r"updates\[0\]\.format-version: cannot downgrade v2 table to v1"):
        commit(md, [{"action": "upgrade-format-version", "format-version": 1}])
    with pytest.raises(BadRequest, match="unsupported format version v4"):
        commit(md, [{"action": "upgrade-format-version", "format-version": 4}])
    v2 = commit(new_table(1), [{"action": "upgrade-format-version", "format-version": 2}])
    assert v2["format-version"] == 2 and "schema" not in v2 and "partition-spec" not in v2


def test_add_schema_assigns_next_id_and_last_column_id():
    md = new_table()
    out = commit(md, [add_schema(SCHEMA["fields"] + [EXTRA_COLUMN], schema_id=42)])
    assert [s["schema-id"] for s in out["schemas"]] == [0, 1]  # the client's schema-id is ignored
    assert out["last-column-id"] == 4 and out["current-schema-id"] == 0
    with pytest.raises(BadRequest, match=r"updates\[0\]\.schema: invalid type for v: variant is not supported until"):
        commit(md, [add_schema(SCHEMA["fields"] + [{"id": 4, "name": "v", "type": "variant", "required": False}])])
    with pytest.raises(BadRequest, match="duplicate field id 3"):
        commit(md, [add_schema(SCHEMA["fields"] + [{**EXTRA_COLUMN, "id": 3}])])


def test_add_identical_schema_reuses_its_id():
    md = commit(new_table(), [add_schema(SCHEMA["fields"] + [EXTRA_COLUMN]), SET_LAST_SCHEMA])
    assert md["current-schema-id"] == 1
    # Re-adding schema 0 (identical fields, any schema-id) adds nothing: the change set is a no-op.
    assert commit(md, [add_schema(SCHEMA["fields"], schema_id=5)]) is md
    # Two identical adds in one change set: one schema, and -1 still means it.
    other = SCHEMA["fields"] + [{"id": 5, "name": "other", "type": "date", "required": False}]
    out = commit(md, [add_schema(other), add_schema(other), SET_LAST_SCHEMA])
    assert [s["schema-id"] for s in out["schemas"]] == [0, 1, 2] and out["current-schema-id"] == 2


def test_set_current_schema():
    md = commit(new_table(), [add_schema(SCHEMA["fields"] + [EXTRA_COLUMN])])
    assert commit(md, [{"action": "set-current-schema", "schema-id": 1}])["current-schema-id"] == 1
    with pytest.raises(BadRequest, match=r"updates\[0\]\.schema-id: cannot set last added schema: no schema has"):
        commit(md, [SET_LAST_SCHEMA])
    with pytest.raises(BadRequest, match="unknown schema: 9"):
        commit(md, [{"action": "set-current-schema", "schema-id": 9}])
    # Java: re-adding a schema that existed before this change set is not "added", so -1 fails.
    with pytest.raises(BadRequest, match=r"updates\[1\]\.schema-id: cannot set last added schema"):
        commit(md, [add_schema(SCHEMA["fields"] + [EXTRA_COLUMN]), SET_LAST_SCHEMA])


def test_current_schema_must_keep_partition_source():
    dropped_ts = add_schema(SCHEMA["fields"][:2])
    with pytest.raises(BadRequest, match="partition-specs: default spec field ts_day references missing column 3"):
        commit(new_table(), [dropped_ts, SET_LAST_SCHEMA])


def test_add_spec():
    md = new_table()
    spec = {"action": "add-spec", "spec": {"spec-id": 3, "fields": [
        {"field-id": 1000, "source-id": 3, "name": "ts_day", "transform": "day"},
        {"source-id": 1, "name": "id_bucket", "transform": "bucket[16]"},
    ]}}
    out = commit(md, [spec, {"action": "set-default-spec", "spec-id": -1}])
    assert out["partition-specs"][1]["spec-id"] == 1 and out["default-spec-id"] == 1
    assert [f["field-id"] for f in out["partition-specs"][1]["fields"]] == [1000, 1001]  # missing id: last + 1
    assert out["last-partition-id"] == 1001
    with pytest.raises(BadRequest, match=r"updates\[0\]\.spec\.fields\[0\]\.source-id: cannot find source column 9"):
        commit(md, [add_spec(part(9, "p", "identity"))])
    with pytest.raises(BadRequest, match=r"updates\[0\]\.spec\.fields\[0\]\.transform: cannot apply day to a string"):
        commit(md, [add_spec(part(2, "p", "day"))])
    with pytest.raises(BadRequest, match="cannot use partition name more than once"):
        commit(md, [add_spec(part(1, "p", "identity"), part(2, "p", "identity"))])


def test_add_identical_spec_reuses_its_id():
    md = new_table()
    same = add_spec(part(3, "ts_day", "day", **{"field-id": 1005}))
    assert commit(md, [same]) is md  # compatibleWith ignores field ids
    unpartitioned = {"action": "add-spec", "spec": {"fields": []}}
    out = commit(md, [unpartitioned, unpartitioned, {"action": "set-default-spec", "spec-id": -1}])
    assert [s["spec-id"] for s in out["partition-specs"]] == [0, 1] and out["default-spec-id"] == 1
    assert out["last-partition-id"] == 1000  # never decreases


def test_set_default_spec():
    md = commit(new_table(), [{"action": "add-spec", "spec": {"fields": []}}])
    assert commit(md, [{"action": "set-default-spec", "spec-id": 1}])["default-spec-id"] == 1
    assert commit(md, [{"action": "set-default-spec", "spec-id": 0}]) is md
    with pytest.raises(BadRequest, match="cannot set last added spec: no spec has been added"):
        commit(md, [{"action": "set-default-spec", "spec-id": -1}])
    with pytest.raises(BadRequest, match=r"updates\[0\]\.spec-id: cannot set default spec to unknown spec: 4"):
        commit(md, [{"action": "set-default-spec", "spec-id": 4}])


def test_add_sort_order():
    md = new_table()  # unsorted, id 0
    by_id = {"action": "add-sort-order", "sort-order": {"order-id": 7, "fields": [sort_field(1)]}}
    out = commit(md, [by_id, {"action": "set-default-sort-order", "sort-order-id": -1}])
    assert out["sort-orders"][1] == {"order-id": 1, "fields": [sort_field(1)]} and out["default-sort-order-id"] == 1
    # identical order: same id; a different one: highest + 1; unsorted is always 0
    assert commit(out, [by_id]) is out
    out2 = commit(out, [{"action": "add-sort-order", "sort-order": {"order-id": 1, "fields": [sort_field(1, "desc")]}}])
    assert [o["order-id"] for o in out2["sort-orders"]] == [0, 1, 2]
    back = commit(out2, [{"action": "add-sort-order", "sort-order": {"order-id": 5, "fields": []}},
                         {"action": "set-default-sort-order", "sort-order-id": 0}])
    assert back["default-sort-order-id"] == 0 and len(back["sort-orders"]) == 3
    with pytest.raises(BadRequest, match=r"sort-order\.fields\[0\]\.source-id: cannot find source column 8"):
        commit(md, [{"action": "add-sort-order", "sort-order": {"fields": [sort_field(8)]}}])


def test_set_default_sort_order():
    md = commit(new_table(), [{"action": "add-sort-order", "sort-order": {"fields": [sort_field(2)]}}])
    assert commit(md, [{"action": "set-default-sort-order", "sort-order-id": 1}])["default-sort-order-id"] == 1
    with pytest.raises(BadRequest, match="no sort order has been added"):
        commit(md, [{"action": "set-default-sort-order", "sort-order-id": -1}])
    with pytest.raises(BadRequest, match="unknown order: 3"):
        commit(md, [{"action": "set-default-sort-order", "sort-order-id": 3}])


def test_add_snapshot():
    md = with_snapshots(1)
    out = commit(md, [{"action": "add-snapshot", "snapshot": snapshot(2, parent=1, seq=2)}])
    assert [s["snapshot-id"] for s in out["snapshots"]] == [1, 2]
    assert out["last-sequence-number"] == 2
    assert out["current-snapshot-id"] == 1  # adding alone does not move main
    with pytest.raises(BadRequest, match=r"updates\[0\]\.snapshot\.snapshot-id: snapshot already exists for id: 1"):
        commit(md, [{"action": "add-snapshot", "snapshot": snapshot(1, seq=5)}])


def test_sequence_number_must_advance():
    md = with_snapshots(2)  # last-sequence-number 2
    stale = {"action": "add-snapshot", "snapshot": snapshot(3, parent=2, seq=2)}
    with pytest.raises(CommitConflict, match="sequence number 2 older than last sequence number 2"):
        commit(md, [stale])
    # Java: a snapshot without a parent is exempt, but no snapshot may then carry a larger number.
    with pytest.raises(BadRequest, match="sequence number 2 greater than last sequence number 1"):
        commit(md, [{"action": "add-snapshot", "snapshot": snapshot(3, seq=1)}])
    # v1 has no sequence numbers
    v1 = commit(new_table(1), [{"action": "add-snapshot", "snapshot": snapshot(1, seq=0)}])
    assert v1["last-sequence-number"] == 0


def test_set_snapshot_ref_main_updates_current_and_log():
    md = with_snapshots(2)
    assert md["current-snapshot-id"] == 2
    assert md["snapshot-log"] == [
        {"timestamp-ms": T0 + 1, "snapshot-id": 1},
        {"timestamp-ms": T0 + 2, "snapshot-id": 2},
    ]
    # Rolling back to an existing snapshot logs the commit time, not the snapshot's time (Java setRef).
    rollback = commit(md, [set_ref("main", 1)], now=T0 + 9000)
    assert rollback["current-snapshot-id"] == 1
    assert rollback["snapshot-log"][-1] == {"timestamp-ms": T0 + 9000, "snapshot-id": 1}
    # An identical ref is a no-op; a tag does not touch current-snapshot-id or the log.
    assert commit(md, [{"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": 2}]) is md
    tagged = commit(md, [set_ref("v1", 1, "tag", **{"max-ref-age-ms": 10})])
    assert tagged["refs"]["v1"] == {"snapshot-id": 1, "type": "tag", "max-ref-age-ms": 10}
    assert tagged["current-snapshot-id"] == 2 and tagged["snapshot-log"] == md["snapshot-log"]
    with pytest.raises(BadRequest, match=r"updates\[0\]\.snapshot-id: cannot set dev to unknown snapshot: 99"):
        commit(md, [{"action": "set-snapshot-ref", "ref-name": "dev", "type": "branch", "snapshot-id": 99}])
    with pytest.raises(BadRequest, match="cannot set main to a tag"):
        commit(md, [{"action": "set-snapshot-ref", "ref-name": "main", "type": "tag", "snapshot-id": 1}])


def test_intermediate_snapshots_leave_the_log():
    md = with_snapshots(1)
    updates = [
        *add_and_set_main(snapshot(2, parent=1, seq=2, ts=T0 + 10)),
        *add_and_set_main(snapshot(3, parent=2, seq=3, ts=T0 + 20)),
    ]
    out = commit(md, updates)
    assert [e["snapshot-id"] for e in out["snapshot-log"]] == [1, 3]


def test_snapshot_from_the_future_is_refused():
    md = with_snapshots(1)
    with pytest.raises(BadRequest, match="before last snapshot log entry"):
        commit(md, add_and_set_main(snapshot(2, parent=1, seq=2, ts=T0 + 10 * 60_000)), now=T0 + 1000)


def test_remove_snapshot_ref():
    md = commit(with_snapshots(2), [{"action": "set-snapshot-ref", "ref-name": "t", "type": "tag", "snapshot-id": 1}])
    out = commit(md, [{"action": "remove-snapshot-ref", "ref-name": "t"}])
    assert "t" not in out["refs"] and out["current-snapshot-id"] == 2
    no_main = commit(md, [{"action": "remove-snapshot-ref", "ref-name": "main"}])
    assert "main" not in no_main["refs"] and no_main["current-snapshot-id"] == -1
    assert commit(md, [{"action": "remove-snapshot-ref", "ref-name": "nope"}]) is md
    v3 = commit(md, [
        {"action": "upgrade-format-version", "format-version": 3},
        {"action": "remove-snapshot-ref", "ref-name": "main"},
    ])
    assert v3["current-snapshot-id"] is None


def stats(snapshot_id, path="a"):
    return {"snapshot-id": snapshot_id, "statistics-path": f"s3://s/{path}.puffin", "file-size-in-bytes": 10,
            "file-footer-size-in-bytes": 2, "blob-metadata": []}


def pstats(snapshot_id, path="a"):
    return {"snapshot-id": snapshot_id, "statistics-path": f"s3://s/{path}.parquet", "file-size-in-bytes": 10}


def test_remove_snapshots_drops_refs_and_statistics():
    md = commit(with_snapshots(3), [
        {"action": "set-snapshot-ref", "ref-name": "old", "type": "tag", "snapshot-id": 1},
        {"action": "set-snapshot-ref", "ref-name": "keep", "type": "tag", "snapshot-id": 2},
        {"action": "set-statistics", "statistics": stats(1)},
        {"action": "set-statistics", "statistics": stats(3)},
        {"action": "set-partition-statistics", "partition-statistics": pstats(1)},
    ])
    out = commit(md, [{"action": "remove-snapshots", "snapshot-ids": [1, 42]}])
    assert [s["snapshot-id"] for s in out["snapshots"]] == [2, 3]
    assert set(out["refs"]) == {"main", "keep"}
    assert [s["snapshot-id"] for s in out["statistics"]] == [3] and out["partition-statistics"] == []
    assert [e["snapshot-id"] for e in out["snapshot-log"]] == [2, 3]
    # Removing a snapshot in the middle of the log drops all history before it (Java updateSnapshotLog).
    middle = commit(with_snapshots(3), [{"action": "remove-snapshots", "snapshot-ids": [2]}])
    assert [e["snapshot-id"] for e in middle["snapshot-log"]] == [3]
    # Removing the current snapshot removes main and clears the current snapshot.
    gone = commit(with_snapshots(2), [{"action": "remove-snapshots", "snapshot-ids": [2]}])
    assert "main" not in gone["refs"] and gone["current-snapshot-id"] == -1
    assert commit(md, [{"action": "remove-snapshots", "snapshot-ids": [99]}]) is md


def test_set_and_remove_properties():
    md = new_table()
    out = commit(md, [{"action": "set-properties", "updates": {"a": "1", "owner": "you"}},
                      {"action": "remove-properties", "removals": ["a", "missing"]}])
    assert out["properties"] == {"write.parquet.compression-codec": "zstd", "owner": "you"}
    assert md["properties"]["owner"] == "me"


def test_set_location():
    md = new_table()
    assert commit(md, [{"action": "set-location", "location": "s3://other/t/"}])["location"] == "s3://other/t"
    assert commit(md, [{"action": "set-location", "location": "s3://bucket/db/t/"}]) is md


def test_statistics():
    md = with_snapshots(2)
    out = commit(md, [{"action": "set-statistics", "snapshot-id": 1, "statistics": stats(1)},
                      {"action": "set-statistics", "statistics": stats(2)},
                      {"action": "set-statistics", "statistics": stats(1, "b")}])
    assert out["statistics"] == [stats(1, "b"), stats(2)]  # replaced in place, one file per snapshot
    removed = commit(out, [{"action": "remove-statistics", "snapshot-id": 1}])
    assert [s["snapshot-id"] for s in removed["statistics"]] == [2]
    assert commit(removed, [{"action": "remove-statistics", "snapshot-id": 1}]) is removed


def test_partition_statistics():
    md = with_snapshots(2)
    out = commit(md, [{"action": "set-partition-statistics", "partition-statistics": pstats(2)},
                      {"action": "set-partition-statistics", "partition-statistics": pstats(2, "b")}])
    assert out["partition-statistics"] == [pstats(2, "b")]
    assert commit(out, [{"action": "remove-partition-statistics", "snapshot-id": 2}])["partition-statistics"] == []


def test_encryption_keys():
    md = new_table(3)
    key = {"key-id": "k1", "encrypted-key-metadata": "AAEC", "properties": {"a": "b"}}
    out = commit(md, [{"action": "add-encryption-key", "encryption-key": key}])
    assert out["encryption-keys"] == [key]
    same_id = {**key, "encrypted-key-metadata": "ZZ"}
    assert commit(out, [{"action": "add-encryption-key", "encryption-key": same_id}]) is out
    removed = commit(out, [{"action": "remove-encryption-key", "key-id": "k1"}])
    assert "encryption-keys" not in removed


def test_remove_schemas():
    md = commit(new_table(), [add_schema(SCHEMA["fields"] + [EXTRA_COLUMN]), SET_LAST_SCHEMA])
    out = commit(md, [{"action": "remove-schemas", "schema-ids": [0]}])
    assert [s["schema-id"] for s in out["schemas"]] == [1]
    with pytest.raises(BadRequest, match=r"updates\[0\]\.schema-ids: cannot remove the current schema"):
        commit(md, [{"action": "remove-schemas", "schema-ids": [1]}])


def test_remove_partition_specs():
    md = commit(new_table(), [add_spec(), {"action": "set-default-spec", "spec-id": -1}])
    out = commit(md, [{"action": "remove-partition-specs", "spec-ids": [0]}])
    assert [s["spec-id"] for s in out["partition-specs"]] == [1]
    with pytest.raises(BadRequest, match="cannot remove the default partition spec"):
        commit(md, [{"action": "remove-partition-specs", "spec-ids": [1]}])


# --------------------------------------------------------------------------------------------------
# Metadata log, timestamps, row lineage, purity
# --------------------------------------------------------------------------------------------------


def test_metadata_log_appends_base_and_trims():
    md = new_table()
    a = commit(md, [{"action": "set-properties", "updates": {"write.metadata.previous-versions-max": "2"}}],
               location="m/v1.json", now=T0 + 10)
    assert a["metadata-log"] == [{"timestamp-ms": T0, "metadata-file": "m/v1.json"}]
    b = commit(a, [{"action": "set-properties", "updates": {"x": "1"}}], location="m/v2.json", now=T0 + 20)
    c = commit(b, [{"action": "set-properties", "updates": {"x": "2"}}], location="m/v3.json", now=T0 + 30)
    assert c["metadata-log"] == [
        {"timestamp-ms": T0 + 10, "metadata-file": "m/v2.json"},
        {"timestamp-ms": T0 + 20, "metadata-file": "m/v3.json"},
    ]
    assert commit(c, [], location="m/v4.json") is c  # nothing changed: nothing to write or log


def test_last_updated_ms_never_goes_backwards():
    md = new_table()
    out = commit(md, [{"action": "set-properties", "updates": {"a": "b"}}], now=T0 - 5000)
    assert out["last-updated-ms"] == T0


def test_v3_row_lineage():
    md = commit(new_table(), [{"action": "upgrade-format-version", "format-version": 3}])
    one = commit(md, add_and_set_main(snapshot(1, seq=1, **{"first-row-id": 0, "added-rows": 100})))
    assert one["next-row-id"] == 100
    two = commit(one, add_and_set_main(snapshot(2, parent=1, seq=2, **{"first-row-id": 100, "added-rows": 5})))
    assert two["next-row-id"] == 105
    behind = snapshot(3, parent=2, seq=3, **{"first-row-id": 50, "added-rows": 1})
    with pytest.raises(CommitConflict, match="first-row-id is behind table next-row-id: 50 < 105"):
        commit(two, [{"action": "add-snapshot", "snapshot": behind}])
    with pytest.raises(BadRequest, match=r"updates\[0\]\.snapshot\.first-row-id: cannot add a snapshot: first-row-id"):
        commit(two, [{"action": "add-snapshot", "snapshot": snapshot(3, parent=2, seq=3)}])


def test_apply_commit_is_pure_and_copies_only_what_changes():
    md = commit(with_snapshots(3), [{"action": "set-statistics", "statistics": stats(3)}])
    before = copy.deepcopy(md)
    out = commit(md, [{"action": "set-properties", "updates": {"a": "b"}},
                      {"action": "set-snapshot-ref", "ref-name": "t", "type": "tag", "snapshot-id": 1},
                      {"action": "remove-snapshots", "snapshot-ids": [1]}])
    assert md == before
    assert out is not md and out["properties"] is not md["properties"]
    # untouched lists are shared, not copied: commit cost does not grow with metadata size
    assert out["schemas"] is md["schemas"] and out["statistics"] is md["statistics"]
    assert all(any(s is t for t in md["snapshots"]) for s in out["snapshots"])

    # a rejected change set leaves base untouched too, even after earlier updates in it applied
    failing = add_and_set_main(snapshot(4, parent=3, seq=4)) + [
        {"action": "set-properties", "updates": {"z": "z"}},
        {"action": "remove-schemas", "schema-ids": [0]},
    ]
    with pytest.raises(BadRequest):
        commit(md, failing)
    assert md == before


# --------------------------------------------------------------------------------------------------
# A real client reads the output
# --------------------------------------------------------------------------------------------------


def test_unknown_fields_are_kept():
    md = {**new_table(), "x-future-table-field": {"a": 1}}
    out = commit(md, [{"action": "add-snapshot", "snapshot": snapshot(1, **{"x-future-snapshot-field": "v"})}])
    assert out["x-future-table-field"] == {"a": 1}
    assert out["snapshots"][0]["x-future-snapshot-field"] == "v"


def test_create_transaction_may_leave_location_to_the_catalog():
    updates = [u for u in spark_create_updates() if u["action"] != "set-location"]
    md = apply_commit(None, parse_requirements([{"type": "assert-create"}]), parse_updates(updates),
                      base_location=None, now_ms=T0, table_uuid=UUID)
    assert "location" not in md


@pytest.mark.parametrize("format_version", [1, 2, 3])
def test_pyiceberg_parses_output(format_version):
    md = new_table(format_version)
    fresh = TableMetadataUtil.parse_raw(json.dumps(md))
    assert fresh.current_snapshot_id is None and fresh.refs == {} and fresh.last_column_id == 3
    lineage = {"first-row-id": 0, "added-rows": 10} if format_version == 3 else {}
    seq = 0 if format_version == 1 else 1
    md = commit(md, add_and_set_main(snapshot(1, seq=seq, **lineage)) + [
        {"action": "set-snapshot-ref", "ref-name": "tag1", "type": "tag", "snapshot-id": 1},
        add_schema(SCHEMA["fields"] + [EXTRA_COLUMN]),
        {"action": "set-current-schema", "schema-id": -1},
        {"action": "set-statistics", "statistics": stats(1)},
    ])
    v2_file = "s3://bucket/db/t/metadata/v2.metadata.json"
    md = commit(md, [{"action": "set-properties", "updates": {"k": "v"}}], location=v2_file)

    parsed = TableMetadataUtil.parse_raw(json.dumps(md))
    again = TableMetadataUtil.parse_obj(copy.deepcopy(md))
    assert parsed == again
    assert parsed.format_version == format_version
    assert str(parsed.table_uuid) == UUID
    assert parsed.current_snapshot_id == 1 and parsed.refs["main"].snapshot_id == 1
    assert parsed.current_schema_id == 1 and parsed.schema().find_field("extra").field_id == 4
    assert parsed.last_partition_id == 1000 and parsed.spec().fields[0].field_id == 1000
    assert parsed.metadata_log[-1].metadata_file == v2_file
    assert len(parsed.statistics) == 1
    if format_version == 3:
        assert parsed.next_row_id == 10


def test_incremental_serialization_equals_a_full_one():
    """A commit's metadata file is joined from the previous file's bytes plus the new entries; through appends,
    removals in the middle, a rollback and replaced lists it must always equal serializing the whole metadata."""
    import orjson

    from coordinator.iceberg.state import IcebergTable, TableIdent, serialize_metadata

    ident = TableIdent("", ("db",), "t")
    md = new_table()
    data, lists = serialize_metadata(md, None)
    state = IcebergTable(ident, md, "s3://bucket/db/t/metadata/v0.metadata.json", data, lists)
    steps = [add_and_set_main(snapshot(i, parent=i - 1 or None, seq=i, ts=T0 + i)) for i in range(1, 6)]
    steps += [[{"action": "remove-snapshots", "snapshot-ids": [3]}],            # from the middle
              add_and_set_main(snapshot(6, parent=5, seq=6, ts=T0 + 6)),
              [set_ref("main", 4)],                                            # rollback: log entry only
              [{"action": "remove-snapshots", "snapshot-ids": [1, 2]}],         # from the front
              add_and_set_main(snapshot(7, parent=4, seq=7, ts=T0 + 7)),
              [{"action": "set-properties", "updates": {"k": "v"}}]]           # lists untouched
    for i, updates in enumerate(steps):
        md = commit(state.metadata, updates, now=T0 + 100 + i)
        data, lists = serialize_metadata(md, state)
        assert orjson.loads(data) == md, f"step {i}"  # key order aside, the same JSON
        for key, (value, view) in lists.items():
            assert value is md[key] and bytes(view) == orjson.dumps(md[key]), (i, key)
        state = IcebergTable(ident, md, f"s3://bucket/db/t/metadata/v{i + 1}.metadata.json", data, lists)
    assert [s["snapshot-id"] for s in md["snapshots"]] == [4, 5, 6, 7]
