"""Pydantic models for the Iceberg REST spec's `TableRequirement` and `TableUpdate` objects.

One class per spec object (`components/schemas/...` in rest-catalog-open-api.yaml), spec field names via
aliases, unions discriminated on `type` (requirements) and `action` (updates). The models only check shape;
the rules (what an update does to metadata, when a requirement fails) live in `requirements.py`/`updates.py`.

Two kinds of models:

* `_Message` (requirements, updates): unknown keys are ignored, like Java's parsers do.
* `_Stored` (schema, spec, sort order, snapshot, statistics, keys): these end up inside table metadata, so
  unknown keys are kept (`extra="allow"`) and `stored()` returns exactly the keys the client sent. A newer
  client's field therefore survives a round trip through this server.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from coordinator.errors import BadRequest


class _Message(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class _Stored(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow", frozen=True)

    def stored(self) -> dict[str, Any]:
        """The JSON object to keep in metadata: spec names, only the keys that were set, unknown keys kept."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")


# --------------------------------------------------------------------------------------------------
# Types and schemas (spec: Type, StructField, StructType, ListType, MapType, Schema)
# --------------------------------------------------------------------------------------------------

# Java's Types.fromPrimitiveString accepts these; anything else is a 400 there too.
_PRIMITIVE = re.compile(
    r"^(boolean|int|long|float|double|date|time|timestamp|timestamptz|timestamp_ns|timestamptz_ns|string|uuid"
    r"|binary|variant|unknown|fixed\[\s*\d+\s*\]|decimal\(\s*\d+\s*,\s*\d+\s*\)"
    r"|geometry(\(.*\))?|geography(\(.*\))?)$",
    re.IGNORECASE,
)


_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$", re.IGNORECASE)
MAX_DECIMAL_PRECISION = 38  # Java's `DecimalType.of` and pyiceberg refuse more: such a table could not be loaded


def _check_primitive(value: str) -> str:
    if not _PRIMITIVE.match(value.strip()):
        raise ValueError(f"unknown primitive type {value!r}")
    decimal = _DECIMAL.match(value.strip())
    if decimal:
        precision, scale = int(decimal[1]), int(decimal[2])
        if not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise ValueError(f"{value!r}: decimal precision must be 1..{MAX_DECIMAL_PRECISION}")
        if scale > precision:
            raise ValueError(f"{value!r}: decimal scale must be 0..precision")
    return value


PrimitiveType = Annotated[str, AfterValidator(_check_primitive)]


def _type_tag(value: Any) -> str | None:
    if isinstance(value, str):
        return "primitive"
    if isinstance(value, dict):
        return value.get("type")
    if isinstance(value, BaseModel):
        return getattr(value, "type", None)
    return None


IcebergType = Annotated[
    Union[
        Annotated[PrimitiveType, Tag("primitive")],
        Annotated["StructType", Tag("struct")],
        Annotated["ListType", Tag("list")],
        Annotated["MapType", Tag("map")],
    ],
    Discriminator(_type_tag, custom_error_type="invalid_type", custom_error_message="not a valid Iceberg type"),
]


class StructField(_Stored):
    id: int
    name: str
    type: IcebergType
    required: bool
    doc: str | None = None
    initial_default: Any = Field(default=None, alias="initial-default")
    write_default: Any = Field(default=None, alias="write-default")


class StructType(_Stored):
    type: Literal["struct"] = "struct"
    fields: list[StructField]


class ListType(_Stored):
    type: Literal["list"]
    element_id: int = Field(alias="element-id")
    element: IcebergType
    element_required: bool = Field(alias="element-required")


class MapType(_Stored):
    type: Literal["map"]
    key_id: int = Field(alias="key-id")
    key: IcebergType
    value_id: int = Field(alias="value-id")
    value: IcebergType
    value_required: bool = Field(alias="value-required")


class Schema(StructType):
    schema_id: int | None = Field(default=None, alias="schema-id")
    identifier_field_ids: list[int] | None = Field(default=None, alias="identifier-field-ids")


# --------------------------------------------------------------------------------------------------
# Partition specs and sort orders
# --------------------------------------------------------------------------------------------------


# The spec's transforms (`Transform`), spelled exactly so. Java would keep anything else as an unknown transform,
# but pyiceberg cannot load a table whose partition spec holds one, so it is refused here instead.
_TRANSFORM = re.compile(r"identity|year|month|day|hour|void|(?:bucket|truncate)\[([0-9]{1,10})\]")
MAX_INT = 2**31 - 1
Int = Annotated[int, Field(ge=-(2**31), le=MAX_INT)]     # the spec's `integer` (Java's int)
Long = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]  # `format: int64` (Java's long)


def _check_transform(value: str) -> str:
    match = _TRANSFORM.fullmatch(value)
    if match is None or (match[1] is not None and not 1 <= int(match[1]) <= MAX_INT):
        raise ValueError(f"unknown transform {value!r}: expected identity, year, month, day, hour, void, "
                         f"bucket[N] or truncate[N] with N in 1..{MAX_INT}")
    return value


class PartitionField(_Stored):
    field_id: int | None = Field(default=None, alias="field-id")
    source_id: int = Field(alias="source-id")
    name: str
    transform: Annotated[str, AfterValidator(_check_transform)]


class PartitionSpec(_Stored):
    spec_id: int | None = Field(default=None, alias="spec-id")
    fields: list[PartitionField]


class SortField(_Stored):
    source_id: int = Field(alias="source-id")
    transform: str
    direction: Literal["asc", "desc"]
    null_order: Literal["nulls-first", "nulls-last"] = Field(alias="null-order")


class SortOrder(_Stored):
    # The spec marks order-id required but readOnly: the server assigns it, so a missing one is accepted.
    order_id: int | None = Field(default=None, alias="order-id")
    fields: list[SortField]


# --------------------------------------------------------------------------------------------------
# Snapshots, refs, statistics, encryption keys
# --------------------------------------------------------------------------------------------------


class Snapshot(_Stored):
    snapshot_id: int = Field(alias="snapshot-id")
    parent_snapshot_id: int | None = Field(default=None, alias="parent-snapshot-id")
    sequence_number: int | None = Field(default=None, alias="sequence-number")
    timestamp_ms: Long = Field(alias="timestamp-ms")
    manifest_list: str = Field(alias="manifest-list")
    first_row_id: int | None = Field(default=None, alias="first-row-id")
    added_rows: int | None = Field(default=None, alias="added-rows")
    summary: dict[str, str]
    schema_id: int | None = Field(default=None, alias="schema-id")

    @field_validator("summary")
    @classmethod
    def _operation(cls, summary: dict[str, str]) -> dict[str, str]:
        if summary.get("operation") not in ("append", "replace", "overwrite", "delete"):
            raise ValueError("summary.operation must be one of append, replace, overwrite, delete")
        return summary


class BlobMetadata(_Stored):
    type: str
    snapshot_id: int = Field(alias="snapshot-id")
    sequence_number: int = Field(alias="sequence-number")
    fields: list[int]
    properties: dict[str, str] | None = None


class StatisticsFile(_Stored):
    snapshot_id: int = Field(alias="snapshot-id")
    statistics_path: str = Field(alias="statistics-path")
    file_size_in_bytes: int = Field(alias="file-size-in-bytes")
    file_footer_size_in_bytes: int = Field(alias="file-footer-size-in-bytes")
    blob_metadata: list[BlobMetadata] = Field(alias="blob-metadata")


class PartitionStatisticsFile(_Stored):
    snapshot_id: int = Field(alias="snapshot-id")
    statistics_path: str = Field(alias="statistics-path")
    file_size_in_bytes: int = Field(alias="file-size-in-bytes")


class EncryptedKey(_Stored):
    key_id: str = Field(alias="key-id")
    encrypted_key_metadata: str = Field(alias="encrypted-key-metadata")
    encrypted_by_id: str | None = Field(default=None, alias="encrypted-by-id")
    properties: dict[str, str] | None = None


# --------------------------------------------------------------------------------------------------
# Views (spec: ViewVersion, SQLViewRepresentation)
# --------------------------------------------------------------------------------------------------


class ViewRepresentation(_Stored):
    """The spec's only representation is `SQLViewRepresentation`; all three keys are required."""

    type: str
    sql: str
    dialect: str


class ViewVersion(_Stored):
    version_id: Int = Field(alias="version-id")
    timestamp_ms: Long = Field(alias="timestamp-ms")
    schema_id: Int = Field(alias="schema-id")  # -1: the schema added last in this change set
    summary: dict[str, str]
    representations: list[ViewRepresentation]
    default_catalog: str | None = Field(default=None, alias="default-catalog")
    default_namespace: list[str] = Field(alias="default-namespace")


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

for _model in (StructField, StructType, ListType, MapType, Schema):
    _model.model_rebuild()


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
