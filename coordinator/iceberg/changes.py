"""Pydantic models for the Iceberg REST spec's `TableRequirement` and `TableUpdate` objects, and how a request's
list of them is parsed.

One class per spec object, spec field names via aliases, unions discriminated on `type` (requirements) and
`action` (updates). Unknown keys are ignored, like Java's parsers do. The objects an update carries into metadata
(schema, spec, sort order, snapshot, statistics, keys) are `models.py`'s. The models only check shape; the rules
live in `rules/`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from coordinator.errors import BadRequest

from .models import (EncryptedKey, PartitionSpec, PartitionStatisticsFile, Schema, Snapshot, SortOrder,
                     StatisticsFile)


class _Message(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


# --------------------------------------------------------------------------------------------------
# TableRequirement (spec: discriminator `type`)
# --------------------------------------------------------------------------------------------------


class AssertCreate(_Message):
    """The table must not exist yet (create transactions)."""

    type: Literal["assert-create"] = "assert-create"


class AssertTableUUID(_Message):
    type: Literal["assert-table-uuid"] = "assert-table-uuid"
    uuid: str


class AssertRefSnapshotId(_Message):
    """`snapshot-id` null means the ref must not exist. Java's parser reads a missing key as null too."""

    type: Literal["assert-ref-snapshot-id"] = "assert-ref-snapshot-id"
    ref: str
    snapshot_id: int | None = Field(default=None, alias="snapshot-id")


class AssertLastAssignedFieldId(_Message):
    type: Literal["assert-last-assigned-field-id"] = "assert-last-assigned-field-id"
    last_assigned_field_id: int = Field(alias="last-assigned-field-id")


class AssertCurrentSchemaId(_Message):
    type: Literal["assert-current-schema-id"] = "assert-current-schema-id"
    current_schema_id: int = Field(alias="current-schema-id")


class AssertLastAssignedPartitionId(_Message):
    type: Literal["assert-last-assigned-partition-id"] = "assert-last-assigned-partition-id"
    last_assigned_partition_id: int = Field(alias="last-assigned-partition-id")


class AssertDefaultSpecId(_Message):
    type: Literal["assert-default-spec-id"] = "assert-default-spec-id"
    default_spec_id: int = Field(alias="default-spec-id")


class AssertDefaultSortOrderId(_Message):
    type: Literal["assert-default-sort-order-id"] = "assert-default-sort-order-id"
    default_sort_order_id: int = Field(alias="default-sort-order-id")


Requirement = Annotated[
    Union[
        AssertCreate,
        AssertTableUUID,
        AssertRefSnapshotId,
        AssertLastAssignedFieldId,
        AssertCurrentSchemaId,
        AssertLastAssignedPartitionId,
        AssertDefaultSpecId,
        AssertDefaultSortOrderId,
    ],
    Field(discriminator="type"),
]


# --------------------------------------------------------------------------------------------------
# TableUpdate (spec: discriminator `action`)
# --------------------------------------------------------------------------------------------------


class AssignUUIDUpdate(_Message):
    action: Literal["assign-uuid"] = "assign-uuid"
    uuid: str


class UpgradeFormatVersionUpdate(_Message):
    action: Literal["upgrade-format-version"] = "upgrade-format-version"
    format_version: int = Field(alias="format-version")


class AddSchemaUpdate(_Message):
    action: Literal["add-schema"] = "add-schema"
    schema_: Schema = Field(alias="schema")
    # Deprecated in the spec; Java ignores it and derives last-column-id from the schema. So do we.
    last_column_id: int | None = Field(default=None, alias="last-column-id")


class SetCurrentSchemaUpdate(_Message):
    action: Literal["set-current-schema"] = "set-current-schema"
    schema_id: int = Field(alias="schema-id")  # -1: the schema added last in this change set


class AddPartitionSpecUpdate(_Message):
    action: Literal["add-spec"] = "add-spec"
    spec: PartitionSpec


class SetDefaultSpecUpdate(_Message):
    action: Literal["set-default-spec"] = "set-default-spec"
    spec_id: int = Field(alias="spec-id")  # -1: the spec added last in this change set


class AddSortOrderUpdate(_Message):
    action: Literal["add-sort-order"] = "add-sort-order"
    sort_order: SortOrder = Field(alias="sort-order")


class SetDefaultSortOrderUpdate(_Message):
    action: Literal["set-default-sort-order"] = "set-default-sort-order"
    sort_order_id: int = Field(alias="sort-order-id")  # -1: the order added last in this change set


class AddSnapshotUpdate(_Message):
    action: Literal["add-snapshot"] = "add-snapshot"
    snapshot: Snapshot


class SetSnapshotRefUpdate(_Message):
    """Spec: BaseUpdate + SnapshotReference. Retention checks are Java's `SnapshotRef.Builder` preconditions."""

    action: Literal["set-snapshot-ref"] = "set-snapshot-ref"
    ref_name: str = Field(alias="ref-name")
    type: Literal["branch", "tag"]
    snapshot_id: int = Field(alias="snapshot-id")
    max_ref_age_ms: int | None = Field(default=None, alias="max-ref-age-ms")
    max_snapshot_age_ms: int | None = Field(default=None, alias="max-snapshot-age-ms")
    min_snapshots_to_keep: int | None = Field(default=None, alias="min-snapshots-to-keep")

    @model_validator(mode="after")
    def _retention(self) -> SetSnapshotRefUpdate:
        if self.type == "tag" and self.min_snapshots_to_keep is not None:
            raise ValueError("tags do not support min-snapshots-to-keep")
        if self.type == "tag" and self.max_snapshot_age_ms is not None:
            raise ValueError("tags do not support max-snapshot-age-ms")
        for name in ("max_ref_age_ms", "max_snapshot_age_ms", "min_snapshots_to_keep"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name.replace('_', '-')} must be greater than 0")
        return self

    def ref(self) -> dict[str, Any]:
        """The `SnapshotReference` JSON stored under `refs[ref-name]` (null retention fields omitted, as Java)."""
        ref: dict[str, Any] = {"snapshot-id": self.snapshot_id, "type": self.type}
        for key, value in (
            ("min-snapshots-to-keep", self.min_snapshots_to_keep),
            ("max-snapshot-age-ms", self.max_snapshot_age_ms),
            ("max-ref-age-ms", self.max_ref_age_ms),
        ):
            if value is not None:
                ref[key] = value
        return ref


class RemoveSnapshotsUpdate(_Message):
    action: Literal["remove-snapshots"] = "remove-snapshots"
    snapshot_ids: list[int] = Field(alias="snapshot-ids")


class RemoveSnapshotRefUpdate(_Message):
    action: Literal["remove-snapshot-ref"] = "remove-snapshot-ref"
    ref_name: str = Field(alias="ref-name")


class SetLocationUpdate(_Message):
    action: Literal["set-location"] = "set-location"
    location: str


class SetPropertiesUpdate(_Message):
    action: Literal["set-properties"] = "set-properties"
    updates: dict[str, str]


class RemovePropertiesUpdate(_Message):
    action: Literal["remove-properties"] = "remove-properties"
    removals: list[str]


class SetStatisticsUpdate(_Message):
    action: Literal["set-statistics"] = "set-statistics"
    # Deprecated in the spec (redundant with statistics.snapshot-id); accepted and ignored, as Java does.
    snapshot_id: int | None = Field(default=None, alias="snapshot-id")
    statistics: StatisticsFile


class RemoveStatisticsUpdate(_Message):
    action: Literal["remove-statistics"] = "remove-statistics"
    snapshot_id: int = Field(alias="snapshot-id")


class SetPartitionStatisticsUpdate(_Message):
    action: Literal["set-partition-statistics"] = "set-partition-statistics"
    partition_statistics: PartitionStatisticsFile = Field(alias="partition-statistics")


class RemovePartitionStatisticsUpdate(_Message):
    action: Literal["remove-partition-statistics"] = "remove-partition-statistics"
    snapshot_id: int = Field(alias="snapshot-id")


class RemovePartitionSpecsUpdate(_Message):
    action: Literal["remove-partition-specs"] = "remove-partition-specs"
    spec_ids: list[int] = Field(alias="spec-ids")


class RemoveSchemasUpdate(_Message):
    action: Literal["remove-schemas"] = "remove-schemas"
    schema_ids: list[int] = Field(alias="schema-ids")


class AddEncryptionKeyUpdate(_Message):
    action: Literal["add-encryption-key"] = "add-encryption-key"
    encryption_key: EncryptedKey = Field(alias="encryption-key")


class RemoveEncryptionKeyUpdate(_Message):
    action: Literal["remove-encryption-key"] = "remove-encryption-key"
    key_id: str = Field(alias="key-id")


# View-only actions (add-view-version, set-current-view-version) are not TableUpdates and are rejected.
Update = Annotated[
    Union[
        AssignUUIDUpdate,
        UpgradeFormatVersionUpdate,
        AddSchemaUpdate,
        SetCurrentSchemaUpdate,
        AddPartitionSpecUpdate,
        SetDefaultSpecUpdate,
        AddSortOrderUpdate,
        SetDefaultSortOrderUpdate,
        AddSnapshotUpdate,
        SetSnapshotRefUpdate,
        RemoveSnapshotsUpdate,
        RemoveSnapshotRefUpdate,
        SetLocationUpdate,
        SetPropertiesUpdate,
        RemovePropertiesUpdate,
        SetStatisticsUpdate,
        RemoveStatisticsUpdate,
        SetPartitionStatisticsUpdate,
        RemovePartitionStatisticsUpdate,
        RemovePartitionSpecsUpdate,
        RemoveSchemasUpdate,
        AddEncryptionKeyUpdate,
        RemoveEncryptionKeyUpdate,
    ],
    Field(discriminator="action"),
]


# --------------------------------------------------------------------------------------------------
# Error messages
# --------------------------------------------------------------------------------------------------

_TYPE_TAGS = {"primitive", "struct", "list", "map"}


def parse_list(adapter: TypeAdapter, raw: Any, field: str, discriminator: str) -> list:
    """Parse a request's `field` array (requirements, updates); BadRequest naming the element and field on
    anything malformed."""
    if not isinstance(raw, list):
        raise BadRequest(f"{field}: expected a list")
    parsed = []
    for i, item in enumerate(raw):
        try:
            parsed.append(adapter.validate_python(item))
        except ValidationError as exc:
            raise BadRequest(validation_message(f"{field}[{i}]", discriminator, exc, item)) from None
    return parsed


def validation_message(prefix: str, discriminator: str, exc: ValidationError, item: Any) -> str:
    """One line naming the first bad field in spec terms, e.g. `updates[2].schema-id: Input should be ...`.

    pydantic puts the union's tag first in `loc` (and a type tag after each nested Iceberg type); neither is
    part of the JSON path, so both are dropped.
    """
    error = exc.errors(include_url=False)[0]
    kind, loc = error["type"], list(error["loc"])
    if kind == "union_tag_invalid":
        return f"{prefix}.{discriminator}: unknown {discriminator} {error['ctx']['tag']!r}"
    if kind == "union_tag_not_found":
        return f"{prefix}.{discriminator}: missing"
    if loc and isinstance(item, dict) and loc[0] == item.get(discriminator):
        loc = loc[1:]
    path = prefix
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in _TYPE_TAGS and i > 0 and loc[i - 1] in {"type", "element", "key", "value"}:
            continue
        else:
            path += f".{part}"
    return f"{path}: {error['msg']}"

