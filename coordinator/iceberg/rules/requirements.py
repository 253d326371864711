"""When each spec `TableRequirement` holds: one function per type, Java's `UpdateRequirement.validate`.

A failed requirement means the table changed under the client (or, for assert-create, exists already): a
`CommitConflict` (409) whose message says what was expected and what was found, so the client refreshes
and retries. `base is None` means the table does not exist yet; like Java, the last-assigned-field-id and
last-assigned-partition-id checks then pass (older clients send them with create transactions).
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import TypeAdapter

from coordinator.errors import BadRequest, CommitConflict
from .. import changes as m
from .builder import implicit_refs

_REQUIREMENTS = TypeAdapter(m.Requirement)


def parse_requirements(raw: list) -> list[m.Requirement]:
    """Parse a request's `requirements` array; BadRequest naming the element and field on anything malformed."""
    return m.parse_list(_REQUIREMENTS, raw, "requirements", "type")


def check_requirements(base: dict | None, requirements: list[m.Requirement]) -> None:
    """Raise CommitConflict for the first requirement that does not hold against `base`."""
    for requirement in requirements:
        check_requirement(requirement, base)


def _fail(message: str) -> CommitConflict:
    return CommitConflict(f"Requirement failed: {message}")


def _existing(base: dict | None, requirement: Any) -> dict:
    if base is None:
        raise _fail(f"table does not exist ({requirement.type})")
    return base


def _expect_id(what: str, expected: int, found: Any) -> None:
    if found != expected:
        raise _fail(f"{what} changed: expected id {expected}, found {found}")


@functools.singledispatch
def check_requirement(requirement: Any, base: dict | None) -> None:
    raise BadRequest(f"unsupported requirement {type(requirement).__name__}")


@check_requirement.register(m.AssertCreate)
def _assert_create(r: m.AssertCreate, base: dict | None) -> None:
    if base is not None:
        raise _fail("table already exists")


@check_requirement.register(m.AssertTableUUID)
def _assert_table_uuid(r: m.AssertTableUUID, base: dict | None) -> None:
    """UUIDs compare case-insensitively, as in Java."""
    found = _existing(base, r).get("table-uuid")
    if found is None or found.lower() != r.uuid.lower():
        raise _fail(f"UUID does not match: expected {r.uuid}, found {found}")


@check_requirement.register(m.AssertRefSnapshotId)
def _assert_ref_snapshot_id(r: m.AssertRefSnapshotId, base: dict | None) -> None:
    """The ref must point at `snapshot-id`; a null `snapshot-id` means the ref must not exist.

    Metadata without a `refs` object (old writers) has an implicit main branch at current-snapshot-id,
    which is how Java's parser reads it.
    """
    md = _existing(base, r)
    refs = md.get("refs")
    if refs is None:
        refs = implicit_refs(md)
    ref = refs.get(r.ref)
    if ref is not None:
        kind = ref.get("type", "branch")
        if r.snapshot_id is None:
            raise _fail(f"{kind} {r.ref} was created concurrently")
        if ref["snapshot-id"] != r.snapshot_id:
            raise _fail(f"{kind} {r.ref} has changed: expected id {r.snapshot_id}, found {ref['snapshot-id']}")
    elif r.snapshot_id is not None:
        raise _fail(f"branch or tag {r.ref} is missing, expected id {r.snapshot_id}")


@check_requirement.register(m.AssertLastAssignedFieldId)
def _assert_last_assigned_field_id(r: m.AssertLastAssignedFieldId, base: dict | None) -> None:
    if base is not None:
        _expect_id("last assigned field id", r.last_assigned_field_id, base.get("last-column-id"))


@check_requirement.register(m.AssertCurrentSchemaId)
def _assert_current_schema_id(r: m.AssertCurrentSchemaId, base: dict | None) -> None:
    _expect_id("current schema", r.current_schema_id, _existing(base, r).get("current-schema-id"))


@check_requirement.register(m.AssertLastAssignedPartitionId)
def _assert_last_assigned_partition_id(r: m.AssertLastAssignedPartitionId, base: dict | None) -> None:
    if base is not None:
        _expect_id("last assigned partition id", r.last_assigned_partition_id, base.get("last-partition-id"))


@check_requirement.register(m.AssertDefaultSpecId)
def _assert_default_spec_id(r: m.AssertDefaultSpecId, base: dict | None) -> None:
    _expect_id("default partition spec", r.default_spec_id, _existing(base, r).get("default-spec-id"))


@check_requirement.register(m.AssertDefaultSortOrderId)
def _assert_default_sort_order_id(r: m.AssertDefaultSortOrderId, base: dict | None) -> None:
    _expect_id("default sort order", r.default_sort_order_id, _existing(base, r).get("default-sort-order-id"))
