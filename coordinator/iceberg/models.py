"""The Iceberg REST spec's models (`components/schemas/...` in rest-catalog-open-api.yaml), spec field names via
aliases: the objects kept inside table metadata (schemas, specs, sort orders, snapshots, statistics, keys, view
versions), the request bodies, and the response bodies assembled around a table's serialized metadata. A commit's
requirements and updates (TableRequirement, TableUpdate) are in `changes.py`. The models only check shape; the
rules (what an update does to metadata, when a requirement fails) live in `rules/`.

Objects kept in metadata are `_Stored`: unknown keys are kept (`extra="allow"`) and `stored()` returns exactly the
keys the client sent, so a newer client's field survives a round trip through this server. Request bodies ignore
unknown keys, like Java's parsers do.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional, Union

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator


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


_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)\Z", re.IGNORECASE)
_FIXED = re.compile(r"^fixed\[\s*(\d+)\s*\]\Z", re.IGNORECASE)
_GEO = re.compile(r"^(geometry|geography)(.*)$", re.IGNORECASE | re.DOTALL)
MAX_DECIMAL_PRECISION = 38  # Java's `DecimalType.of` and pyiceberg refuse more: such a table could not be loaded


def _check_primitive(value: str) -> str:
    """The type as Java writes it (`Type.toString()`: lower case, `decimal(P, S)`, `fixed[N]`), whatever spelling
    Java's `Types.fromPrimitiveString` accepted: a Java catalog stores the type it parsed, and other readers
    parse only that spelling (pyiceberg reads neither `DECIMAL(10,2)` nor `decimal( 10 , 2 )`). Java matches the
    whole string: spaces or a newline around the name are refused there, so here too."""
    text = value
    if not _PRIMITIVE.fullmatch(text):
        raise ValueError(f"unknown primitive type {value!r}")
    decimal = _DECIMAL.match(text)
    if decimal:
        precision, scale = int(decimal[1]), int(decimal[2])
        if not 1 <= precision <= MAX_DECIMAL_PRECISION:
            raise ValueError(f"{value!r}: decimal precision must be 1..{MAX_DECIMAL_PRECISION}")
        if scale > precision:
            raise ValueError(f"{value!r}: decimal scale must be 0..precision")
        return f"decimal({precision}, {scale})"
    fixed = _FIXED.match(text)
    if fixed:
        return f"fixed[{int(fixed[1])}]"
    geo = _GEO.match(text)
    if geo:
        return geo[1].lower() + geo[2]   # its parameters (a CRS, an algorithm) are names, kept as given
    return text.lower()


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



for _model in (StructField, StructType, ListType, MapType, Schema):
    _model.model_rebuild()


# --------------------------------------------------------------------------------------------------
# Request bodies
# --------------------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class CreateNamespaceRequest(_Body):
    namespace: list[str]
    properties: dict[str, str] = Field(default_factory=dict)


class UpdateNamespacePropertiesRequest(_Body):
    removals: list[str] = Field(default_factory=list)
    updates: dict[str, str] = Field(default_factory=dict)


class CreateTableRequest(_Body):
    name: str
    location: Optional[str] = None
    schema_: dict[str, Any] = Field(alias="schema")
    partition_spec: Optional[dict[str, Any]] = Field(default=None, alias="partition-spec")
    write_order: Optional[dict[str, Any]] = Field(default=None, alias="write-order")
    stage_create: bool = Field(default=False, alias="stage-create")
    properties: dict[str, str] = Field(default_factory=dict)


class RegisterTableRequest(_Body):
    name: str
    metadata_location: str = Field(alias="metadata-location")
    overwrite: bool = False


class TableIdentifier(_Body):
    namespace: list[str]
    name: str


class RenameTableRequest(_Body):
    source: TableIdentifier
    destination: TableIdentifier


class CommitTableRequest(_Body):
    identifier: Optional[TableIdentifier] = None
    requirements: list[Any]
    updates: list[Any]


class CommitTransactionRequest(_Body):
    table_changes: list[CommitTableRequest] = Field(alias="table-changes")


class ReportMetricsRequest(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    report_type: Literal["scan-report", "commit-report"] = Field(alias="report-type")
    table_name: str = Field(alias="table-name")
    snapshot_id: int = Field(alias="snapshot-id")
    metrics: dict[str, Any]


class CreateViewRequest(_Body):
    name: str
    location: Optional[str] = None
    schema_: dict[str, Any] = Field(alias="schema")
    view_version: dict[str, Any] = Field(alias="view-version")
    properties: dict[str, str]


class CommitViewRequest(_Body):
    identifier: Optional[TableIdentifier] = None
    requirements: list[Any] = Field(default_factory=list)
    updates: list[Any]


# --------------------------------------------------------------------------------------------------
# Response bodies around a table's or view's metadata (LoadTableResult, LoadViewResult, CommitTableResponse)
# --------------------------------------------------------------------------------------------------

COMMIT_TABLE_ROUTE = "commit-table"  # the one route answered with CommitTableResponse, not LoadResult
_LOAD_TAIL, _COMMIT_TAIL = b',"config":{}}', b"}"


def _result_json(metadata_location: str, metadata_json: bytes, tail: bytes) -> list[bytes]:
    """A result's JSON as parts, not joined: the metadata is megabytes at 10,000 snapshots, and the HTTP layer
    sends a large answer part by part (`api.common.json_response`) rather than copy it once more. The metadata's
    bytes are the ones kept with the table's state (never serialized again)."""
    return [b'{"metadata-location":' + orjson.dumps(metadata_location) + b',"metadata":', metadata_json, tail]


def load_result(metadata_location: str, metadata_json: bytes) -> list[bytes]:
    """`LoadTableResult` (and `LoadViewResult`) as JSON parts."""
    return _result_json(metadata_location, metadata_json, _LOAD_TAIL)


def commit_result(metadata_location: str, metadata_json: bytes) -> list[bytes]:
    """`CommitTableResponse`: the same without `config`."""
    return _result_json(metadata_location, metadata_json, _COMMIT_TAIL)


def staged_result(metadata_json: bytes) -> bytes:
    """A stage-create's `LoadTableResult`: the metadata, which no file holds yet."""
    return b"".join([b'{"metadata":', metadata_json, b',"config":{}}'])


def answer_json(route: str, metadata_location: str, metadata_json: bytes) -> list[bytes]:
    """What a table or view route answers: a table commit CommitTableResponse, the others LoadResult."""
    return (commit_result if route == COMMIT_TABLE_ROUTE else load_result)(metadata_location, metadata_json)
