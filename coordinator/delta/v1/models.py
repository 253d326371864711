"""Request bodies of Unity Catalog's Delta API v1.0 (`/delta/v1`, the Managed Tables Specification v1.0 and its
`delta.yaml`), with the spec's hyphenated field names.

Models check shapes and types only (strict: JSON `"5"` is not the integer 5; unknown keys are ignored, as UC's
server ignores them); what values mean is checked by `rules.py`, which names the field and the spec's rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import MalformedRequest

M = TypeVar("M", bound=BaseModel)


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", populate_by_name=True)


class CreateStagingTable(_Body):
    name: str


class Protocol(_Body):
    min_reader_version: int = Field(alias="min-reader-version")
    min_writer_version: int = Field(alias="min-writer-version")
    reader_features: list[str] = Field(default_factory=list, alias="reader-features")
    writer_features: list[str] = Field(default_factory=list, alias="writer-features")

    def to_json(self) -> dict[str, Any]:
        return {"min-reader-version": self.min_reader_version, "min-writer-version": self.min_writer_version,
                "reader-features": sorted(set(self.reader_features)),
                "writer-features": sorted(set(self.writer_features))}


class StructType(_Body):
    """`DeltaStructType`: its fields are checked (names, types, nesting) by `columns.py`, so kept as sent."""

    type: Literal["struct"]
    fields: list[dict[str, Any]]


class UniformIceberg(_Body):
    metadata_location: str = Field(alias="metadata-location")
    converted_delta_version: int = Field(alias="converted-delta-version")
    converted_delta_timestamp: int = Field(alias="converted-delta-timestamp")
    base_converted_delta_version: Optional[int] = Field(default=None, alias="base-converted-delta-version")


class Uniform(_Body):
    iceberg: UniformIceberg


class CreateTable(_Body):
    name: str
    location: str
    table_type: Literal["MANAGED", "EXTERNAL"] = Field(alias="table-type")
    comment: Optional[str] = None
    columns: StructType
    partition_columns: list[str] = Field(default_factory=list, alias="partition-columns")
    protocol: Protocol
    properties: dict[str, str]
    domain_metadata: dict[str, dict[str, Any]] = Field(default_factory=dict, alias="domain-metadata")
    last_commit_timestamp_ms: int = Field(alias="last-commit-timestamp-ms")
    uniform: Optional[Uniform] = None


class RenameTable(_Body):
    new_name: str = Field(alias="new-name")


# -- updateTable ---------------------------------------------------------------------------------------------------


class AssertTableUuid(_Body):
    type: Literal["assert-table-uuid"]
    uuid: str


class AssertEtag(_Body):
    type: Literal["assert-etag"]
    etag: str


Requirement = Union[AssertTableUuid, AssertEtag]


class Commit(_Body):
    """`DeltaCommit`: one staged commit file proposed (or ratified) as `version`."""

    version: int
    timestamp: int
    file_name: str = Field(alias="file-name")
    file_size: int = Field(alias="file-size")
    file_modification_timestamp: int = Field(alias="file-modification-timestamp")


class AddCommit(_Body):
    action: Literal["add-commit"]
    commit: Commit
    uniform: Optional[Uniform] = None


class SetLatestBackfilledVersion(_Body):
    action: Literal["set-latest-backfilled-version"]
    latest_published_version: int = Field(alias="latest-published-version")


class SetProperties(_Body):
    action: Literal["set-properties"]
    updates: dict[str, str]


class RemoveProperties(_Body):
    action: Literal["remove-properties"]
    removals: list[str]


class SetProtocol(_Body):
    action: Literal["set-protocol"]
    protocol: Protocol


class SetColumns(_Body):
    action: Literal["set-columns"]
    columns: StructType


class SetPartitionColumns(_Body):
    action: Literal["set-partition-columns"]
    partition_columns: list[str] = Field(alias="partition-columns")


class SetTableComment(_Body):
    action: Literal["set-table-comment"]
    comment: str


class SetDomainMetadata(_Body):
    action: Literal["set-domain-metadata"]
    updates: dict[str, dict[str, Any]]


class RemoveDomainMetadata(_Body):
    action: Literal["remove-domain-metadata"]
    domains: list[str]


class UpdateSnapshotVersion(_Body):
    """External tables only (the spec leaves it out of scope): parsed so that it is refused by name."""

    action: Literal["update-metadata-snapshot-version"]
    last_commit_version: int = Field(alias="last-commit-version")
    last_commit_timestamp_ms: int = Field(alias="last-commit-timestamp-ms")


Update = Union[AddCommit, SetLatestBackfilledVersion, SetProperties, RemoveProperties, SetProtocol, SetColumns,
               SetPartitionColumns, SetTableComment, SetDomainMetadata, RemoveDomainMetadata, UpdateSnapshotVersion]
REQUIREMENTS = {m.model_fields["type"].annotation.__args__[0]: m for m in (AssertTableUuid, AssertEtag)}
UPDATES = {m.model_fields["action"].annotation.__args__[0]: m for m in Update.__args__}


@dataclass(frozen=True)
class UpdateTable:
    """`DeltaUpdateTableRequest`, by type: each requirement by its `type`, each update by its `action`."""

    requirements: dict[str, Any]
    updates: dict[str, Any]


def update_table(value: Any) -> UpdateTable:
    """The spec's shape rules: `requirements` and `updates` lists of objects, `updates` not empty, at most one of
    each type, every type one the spec names. Raises MalformedRequest naming the first violation."""
    if not isinstance(value, dict):
        raise MalformedRequest("request body must be a JSON object with requirements and updates")
    parsed = []
    for key, tag, known in (("requirements", "type", REQUIREMENTS), ("updates", "action", UPDATES)):
        items = value.get(key)
        if not isinstance(items, list):
            raise MalformedRequest(f"{key} is required: a list of objects")
        by_kind: dict[str, Any] = {}
        for i, item in enumerate(items):
            kind = item.get(tag) if isinstance(item, dict) else None
            if not isinstance(kind, str) or kind not in known:
                raise MalformedRequest(f"{key}[{i}].{tag} must be one of {', '.join(known)}, got {kind!r}")
            if kind in by_kind:
                raise MalformedRequest(f"{key} holds {kind!r} twice: at most one of each {tag} per request")
            by_kind[kind] = model(known[kind], item, f"{key}[{i}]")
        parsed.append(by_kind)
    if not parsed[1]:
        raise MalformedRequest("updates must contain at least one action")
    return UpdateTable(*parsed)


def model(cls: type[M], value: Any, where: str = "request") -> M:
    """`value` as `cls`, or MalformedRequest naming what is wrong (`where` it is in the body)."""
    try:
        return cls.model_validate(value)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
                             for e in exc.errors()[:5])
        raise MalformedRequest(f"invalid {where}: {problems}") from None


# -- metrics -------------------------------------------------------------------------------------------------------


class FileSizeHistogram(_Body):
    sorted_bin_boundaries: list[int] = Field(alias="sorted-bin-boundaries")
    file_counts: list[int] = Field(alias="file-counts")
    total_bytes: list[int] = Field(alias="total-bytes")
    commit_version: Optional[int] = Field(default=None, alias="commit-version")


class CommitReport(_Body):
    num_files_added: Optional[int] = Field(default=None, alias="num-files-added")
    num_bytes_added: Optional[int] = Field(default=None, alias="num-bytes-added")
    num_files_removed: Optional[int] = Field(default=None, alias="num-files-removed")
    num_bytes_removed: Optional[int] = Field(default=None, alias="num-bytes-removed")
    num_rows_inserted: Optional[int] = Field(default=None, alias="num-rows-inserted")
    num_rows_removed: Optional[int] = Field(default=None, alias="num-rows-removed")
    num_rows_updated: Optional[int] = Field(default=None, alias="num-rows-updated")
    file_size_histogram: Optional[FileSizeHistogram] = Field(default=None, alias="file-size-histogram")


class Report(_Body):
    commit_report: Optional[CommitReport] = Field(default=None, alias="commit-report")


class ReportMetrics(_Body):
    table_id: str = Field(alias="table-id")
    report: Optional[Report] = None
