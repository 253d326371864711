"""Lance Namespace request bodies, named as in the spec (`lance-namespace-rest-open-api.yaml`, components/schemas).

Only the operations this server implements are modelled. Unknown fields are ignored (newer clients send more);
fields we do model are validated strictly, so a wrong type is a 400 naming the field, never a silent coercion.
The `identity` and `context` members every request may carry are accepted and ignored here: the HTTP layer
takes identity from the headers, which the spec says win over the body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import BadRequest

Version = Annotated[int, Field(strict=True, ge=0)]
Long = Annotated[int, Field(strict=True)]
Size = Annotated[int, Field(strict=True, ge=0)]


@dataclass
class Page:
    """One page of a listing as the service answers it (the route makes the spec's response of it)."""

    items: list[Any]
    next_token: str | None


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    identity: Optional[dict[str, Any]] = None
    context: Optional[dict[str, Any]] = None


class CreateNamespaceRequest(_Body):
    id: Optional[list[str]] = None
    mode: Optional[str] = None
    properties: Optional[dict[str, str]] = None


class DescribeNamespaceRequest(_Body):
    id: Optional[list[str]] = None


class DropNamespaceRequest(_Body):
    id: Optional[list[str]] = None
    mode: Optional[str] = None
    behavior: Optional[str] = None


class DeclareTableRequest(_Body):
    id: Optional[list[str]] = None
    location: Optional[str] = None
    vend_credentials: Optional[bool] = None
    properties: Optional[dict[str, str]] = None


class DescribeTableRequest(_Body):
    id: Optional[list[str]] = None
    version: Optional[Version] = None
    tag: Optional[str] = None
    branch: Optional[str] = None
    with_table_uri: Optional[bool] = None
    load_detailed_metadata: Optional[bool] = None
    check_declared: Optional[bool] = None
    vend_credentials: Optional[bool] = None


class TableExistsRequest(_Body):
    id: Optional[list[str]] = None
    version: Optional[Version] = None


class RegisterTableRequest(_Body):
    id: Optional[list[str]] = None
    location: str
    mode: Optional[str] = None
    properties: Optional[dict[str, str]] = None


class DeregisterTableRequest(_Body):
    id: Optional[list[str]] = None


class DropTableRequest(_Body):
    id: Optional[list[str]] = None


class CreateTableVersionRequest(_Body):
    id: Optional[list[str]] = None
    version: Version
    branch: Optional[str] = None
    manifest_path: str
    manifest_size: Optional[Size] = None
    e_tag: Optional[str] = None
    metadata: Optional[dict[str, str]] = None
    naming_scheme: Optional[str] = None


class DescribeTableVersionRequest(_Body):
    id: Optional[list[str]] = None
    version: Optional[Version] = None
    branch: Optional[str] = None


class VersionRange(BaseModel):
    """[start_version, end_version): start inclusive, end exclusive; end -1 means "through the latest"."""

    model_config = ConfigDict(extra="ignore")

    start_version: Long
    end_version: Long

    @model_validator(mode="after")
    def _check(self) -> "VersionRange":
        if self.start_version < 0:
            raise ValueError(f"start_version must be >= 0, got {self.start_version}")
        if self.end_version < -1:
            raise ValueError(f"end_version must be >= 0 or -1 (through the latest), got {self.end_version}")
        if self.end_version != -1 and self.end_version < self.start_version:
            raise ValueError(f"end_version {self.end_version} is before start_version {self.start_version}")
        return self


class BatchDeleteTableVersionsRequest(_Body):
    id: Optional[list[str]] = None
    branch: Optional[str] = None
    ranges: list[VersionRange]


class CreateTableVersionEntry(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: list[str]
    version: Version
    branch: Optional[str] = None
    manifest_path: str
    manifest_size: Optional[Size] = None
    e_tag: Optional[str] = None
    metadata: Optional[dict[str, str]] = None
    naming_scheme: Optional[str] = None


class BatchCreateTableVersionsRequest(_Body):
    entries: list[CreateTableVersionEntry]


class CommitTableOperation(BaseModel):
    """Exactly one of the four members names the operation."""

    model_config = ConfigDict(extra="ignore")

    declare_table: Optional[DeclareTableRequest] = None
    create_table_version: Optional[CreateTableVersionRequest] = None
    delete_table_versions: Optional[BatchDeleteTableVersionsRequest] = None
    deregister_table: Optional[DeregisterTableRequest] = None

    @model_validator(mode="after")
    def _exactly_one(self) -> "CommitTableOperation":
        set_ = [k for k in OPERATION_KINDS if getattr(self, k) is not None]
        if len(set_) != 1:
            raise ValueError(f"an operation must set exactly one of {', '.join(OPERATION_KINDS)}; "
                             f"got {', '.join(set_) or 'none'}")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in OPERATION_KINDS if getattr(self, k) is not None)

    @property
    def request(self) -> Any:
        return getattr(self, self.kind)


OPERATION_KINDS = ("declare_table", "create_table_version", "delete_table_versions", "deregister_table")


class BatchCommitTablesRequest(_Body):
    operations: list[CommitTableOperation]


# -- modes: "Case insensitive, supports both PascalCase and snake_case" ------------------------------------------


def parse_mode(value: str | None, allowed: tuple[str, ...], default: str, field: str) -> str:
    """Normalise `ExistOk` / `exist_ok` / `EXIST_OK` to `existok`; 400 for anything not in `allowed`."""
    if value is None:
        return default
    norm = value.replace("_", "").lower()
    if norm not in allowed:
        raise BadRequest(f"{field} must be one of {', '.join(allowed)} (case-insensitive), got {value!r}")
    return norm
