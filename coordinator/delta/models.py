"""Request bodies of the Unity Catalog managed-tables API, named as the spec names them.

Seed: `shared/specs/seeds/003_4bd097b12e79fdf1.txt` (UC Managed Tables spec 0.1.0: `/delta/commits`,
`/delta/commit`, `/delta/metrics`), and UC OSS `api/all.yaml` (`/delta/preview/commits`, catalogs, schemas).
Models check types only (strict: JSON `"5"` is not the integer 5); what values mean is checked by the rules
in `rules.py`, so every rejection there can name the field and the spec's constraint.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# UC OSS `ColumnTypeName`.
ColumnTypeName = Literal[
    "BOOLEAN", "BYTE", "SHORT", "INT", "LONG", "FLOAT", "DOUBLE", "DATE", "TIMESTAMP", "TIMESTAMP_NTZ", "STRING",
    "BINARY", "DECIMAL", "INTERVAL", "ARRAY", "STRUCT", "MAP", "VARIANT", "CHAR", "NULL", "USER_DEFINED_TYPE",
    "TABLE_TYPE"]
TableType = Literal["MANAGED", "EXTERNAL", "STREAMING_TABLE", "MATERIALIZED_VIEW", "METRIC_VIEW", "VIEW"]
DataSourceFormat = Literal["DELTA", "CSV", "JSON", "AVRO", "PARQUET", "ORC", "TEXT"]

_DIGITS = re.compile(r"^-?[0-9]{1,19}$")   # a Java long, spelled by Long.toString


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class ColumnInfo(BaseModel):
    """`ColumnInfo`. Other keys are let through to `columns.column_infos`: the seed's own commit sample sends
    Delta StructFields (`{"name", "type", "nullable"}`), which it converts."""

    model_config = ConfigDict(strict=True, extra="allow")

    name: Optional[str] = None
    type_text: Optional[str] = None
    type_json: Optional[str] = None
    type_name: Optional[ColumnTypeName] = None
    type_precision: Optional[int] = None
    type_scale: Optional[int] = None
    type_interval_type: Optional[str] = None
    position: Optional[int] = None
    comment: Optional[str] = None
    nullable: Optional[bool] = None
    partition_index: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


# -- catalogs, schemas, tables --------------------------------------------------------------------------------


class CreateCatalog(_Body):
    name: str
    comment: Optional[str] = None
    properties: dict[str, str] = Field(default_factory=dict)
    storage_root: Optional[str] = None


class CreateSchema(_Body):
    name: str
    catalog_name: str
    comment: Optional[str] = None
    properties: dict[str, str] = Field(default_factory=dict)
    storage_root: Optional[str] = None


class UpdateCatalogOrSchema(_Body):
    """UC OSS `UpdateCatalog` / `UpdateSchema` (the same three fields)."""

    comment: Optional[str] = None
    properties: Optional[dict[str, str]] = None
    new_name: Optional[str] = None


class CreateStagingTable(_Body):
    name: str
    catalog_name: str
    schema_name: str


class CreateTable(_Body):
    name: str
    catalog_name: str
    schema_name: str
    table_type: TableType
    data_source_format: Optional[DataSourceFormat] = None
    columns: list[ColumnInfo] = Field(default_factory=list)
    storage_location: Optional[str] = None
    comment: Optional[str] = None
    properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("columns", mode="before")
    @classmethod
    def _null_is_no_columns(cls, value: Any) -> Any:
        # Clients that leave the schema to the Delta log (daft's EXTERNAL tables) send `"columns": null`.
        return [] if value is None else value


# -- commits ---------------------------------------------------------------------------------------------------


class CommitInfo(_Body):
    """`commit_info` / `DeltaCommitInfo`: one staged commit file proposed (or ratified) as `version`."""

    version: int
    timestamp: int
    file_name: str
    file_size: int
    file_modification_timestamp: int

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "timestamp": self.timestamp, "file_name": self.file_name,
                "file_size": self.file_size, "file_modification_timestamp": self.file_modification_timestamp}


class Metadata(_Body):
    """`metadata`, the desired final state of the table's catalog entry.

    Two shapes are in use and both are accepted: the seed's (`schema` a list of ColumnInfo, `properties` a
    map) and UC OSS `DeltaMetadata` as sent by unitycatalog-client (`schema: {"columns": [...]}`,
    `properties: {"properties": {...}}`). The validator folds the second into the first.
    """

    id: Optional[str] = None
    name: Optional[str] = None
    description: Optional[str] = None
    provider: Optional[str] = None
    format: Optional[dict[str, Any]] = None
    options: Optional[dict[str, str]] = None
    schema_: Optional[list[ColumnInfo]] = Field(default=None, alias="schema")
    partition_columns: Optional[list[str]] = None
    properties: Optional[dict[str, str]] = None
    created_time: Optional[int] = None

    @model_validator(mode="before")
    @classmethod
    def _fold_uc_oss_shape(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        value = dict(value)
        created = value.get("created_time")
        if isinstance(created, str) and _DIGITS.match(created):
            value["created_time"] = int(created)   # Delta 4.0's UC client sends it as a string (Long.toString)
        schema = value.get("schema")
        if isinstance(schema, dict) and set(schema) <= {"columns"}:
            value["schema"] = schema.get("columns") or []
        props = value.get("properties")
        # A seed-shaped map has string values only, so a dict under "properties" can only be the OSS wrapper.
        if isinstance(props, dict) and set(props) == {"properties"} and isinstance(props["properties"], dict):
            value["properties"] = props["properties"]
        elif isinstance(props, dict) and not props:
            value["properties"] = {}
        return value


class UniformIceberg(_Body):
    metadata_location: str
    converted_delta_version: int
    converted_delta_timestamp: str
    base_converted_delta_version: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class Uniform(_Body):
    iceberg: UniformIceberg


class CommitRequest(_Body):
    """`POST /delta/commit` (seed) and `POST /delta/preview/commits` (UC OSS `DeltaCommit`). The two spell the
    backfill report differently: `latest_published_version` / `latest_backfilled_version`."""

    table_id: str
    table_uri: str
    commit_info: Optional[CommitInfo] = None
    latest_published_version: Optional[int] = None
    latest_backfilled_version: Optional[int] = None
    metadata: Optional[Metadata] = None
    uniform: Optional[Uniform] = None

    @property
    def published_version(self) -> int | None:
        if self.latest_published_version is not None:
            return self.latest_published_version
        return self.latest_backfilled_version


class GetCommitsRequest(_Body):
    table_id: str
    table_uri: str
    start_version: int = 0
    end_version: Optional[int] = None


# -- metrics ---------------------------------------------------------------------------------------------------


class FileSizeHistogram(_Body):
    sorted_bin_boundaries: Optional[list[int]] = None
    file_counts: Optional[list[int]] = None
    total_bytes: Optional[list[int]] = None


class CommitReport(_Body):
    commit_version: Optional[int] = None   # required by the seed; the rule says so by name, not pydantic
    num_files_added: Optional[int] = None
    num_bytes_added: Optional[int] = None
    num_clustered_bytes_added: Optional[int] = None
    num_files_removed: Optional[int] = None
    num_bytes_removed: Optional[int] = None
    num_clustered_bytes_removed: Optional[int] = None
    file_size_histogram: Optional[FileSizeHistogram] = None
    num_rows_inserted: Optional[int] = None
    num_rows_removed: Optional[int] = None
    num_rows_updated: Optional[int] = None


class Report(_Body):
    commit_report: Optional[CommitReport] = None


class MetricsRequest(_Body):
    table_id: str
    table_uri: str
    report: Optional[Report] = None


# -- temporary credentials (UC OSS `TemporaryCredentials`) -------------------------------------------------------


class GenerateTemporaryTableCredential(_Body):
    table_id: str
    operation: Literal["UNKNOWN_TABLE_OPERATION", "READ", "READ_WRITE"]


class GenerateTemporaryPathCredential(_Body):
    url: str
    operation: Literal["UNKNOWN_PATH_OPERATION", "PATH_READ", "PATH_READ_WRITE", "PATH_CREATE_TABLE"]
