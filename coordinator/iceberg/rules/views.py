"""Iceberg view metadata: create and replace, with the semantics of Java's `ViewMetadata.Builder`.

Pure functions over JSON-shaped view metadata, like the table rules. A view's commits are sequenced by its
own actor exactly like a table's (same proposals for load, drop and rename).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from coordinator.errors import BadRequest, CommitConflict
from .. import changes as m
from .. import models
from .schema_updates import same_schema

VERSION_HISTORY_PROP = "version.history.num-entries"
DEFAULT_VERSION_HISTORY = 10


class _Message(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


class AssertViewUUID(_Message):
    type: Literal["assert-view-uuid"]
    uuid: str


class AddViewVersionUpdate(_Message):
    action: Literal["add-view-version"]
    view_version: models.ViewVersion = Field(alias="view-version")


class SetCurrentViewVersionUpdate(_Message):
    action: Literal["set-current-view-version"]
    view_version_id: int = Field(alias="view-version-id")


ViewUpdate = Annotated[
    Union[m.AssignUUIDUpdate, m.UpgradeFormatVersionUpdate, m.AddSchemaUpdate, m.SetLocationUpdate,
          m.SetPropertiesUpdate, m.RemovePropertiesUpdate, AddViewVersionUpdate, SetCurrentViewVersionUpdate],
    Field(discriminator="action"),
]
_UPDATES = TypeAdapter(ViewUpdate)
_REQUIREMENTS = TypeAdapter(AssertViewUUID)


def parse_view_requirements(raw: list) -> list[AssertViewUUID]:
    return m.parse_list(_REQUIREMENTS, raw, "requirements", "type")


def parse_view_updates(raw: list) -> list:
    return m.parse_list(_UPDATES, raw, "updates", "action")


def _parse(model: type[models._Stored], raw: Any, field: str) -> dict[str, Any]:
    """A create request's schema or view version, checked against its spec model (as updates are)."""
    try:
        return model.model_validate(raw).stored()
    except ValidationError as exc:
        raise BadRequest(m.validation_message(field, "", exc, None)) from None


def _check_version(version: dict[str, Any], field: str) -> None:
    """Java `ViewMetadata.Builder.addVersion`: one query per dialect. The shape was checked by `models.ViewVersion`."""
    dialects = [r["dialect"].lower() for r in version["representations"] if r["type"] == "sql"]
    if len(dialects) != len(set(dialects)):
        raise BadRequest(f"{field}.representations: cannot add multiple queries for one dialect")


def _same_version(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Java `sameViewVersion`: equal except for id, timestamp and summary."""
    keys = ("representations", "schema-id", "default-catalog", "default-namespace")
    return all(a.get(k) == b.get(k) for k in keys)


class _Builder:
    def __init__(self, base: dict[str, Any], now_ms: int):
        self.md = dict(base)
        self.now_ms = now_ms
        self.last_schema_id: int | None = None
        self.last_version_id: int | None = None
        self.changed = False

    def add_schema(self, schema: dict[str, Any]) -> None:
        schemas = self.md.get("schemas", [])
        for existing in schemas:
            if same_schema(existing, schema):
                self.last_schema_id = existing["schema-id"]
                return
        new_id = max((s["schema-id"] for s in schemas), default=-1) + 1
        self.md["schemas"] = [*schemas, {**schema, "schema-id": new_id}]
        self.last_schema_id = new_id
        self.changed = True

    def add_version(self, version: dict[str, Any], field: str) -> None:
        _check_version(version, field)
        version = dict(version)
        if version["schema-id"] == -1:
            if self.last_schema_id is None:
                raise BadRequest(f"{field}.schema-id: -1 (last added schema) but no schema was added")
            version["schema-id"] = self.last_schema_id
        if not any(s["schema-id"] == version["schema-id"] for s in self.md.get("schemas", [])):
            raise BadRequest(f"{field}.schema-id: unknown schema {version['schema-id']}")
        versions = self.md.get("versions", [])
        for existing in versions:
            if _same_version(existing, version):
                self.last_version_id = existing["version-id"]
                return
        version["version-id"] = max((v["version-id"] for v in versions), default=0) + 1
        self.md["versions"] = [*versions, version]
        self.last_version_id = version["version-id"]
        self.changed = True

    def set_current_version(self, version_id: int, field: str) -> None:
        if version_id == -1:
            if self.last_version_id is None:
                raise BadRequest(f"{field}: -1 (last added version) but no version was added")
            version_id = self.last_version_id
        if not any(v["version-id"] == version_id for v in self.md.get("versions", [])):
            raise BadRequest(f"{field}: unknown view version {version_id}")
        if self.md.get("current-version-id") == version_id:
            return
        self.md["current-version-id"] = version_id
        self.md["version-log"] = [*self.md.get("version-log", []),
                                  {"version-id": version_id, "timestamp-ms": self.now_ms}]
        self.changed = True

    def build(self) -> dict[str, Any]:
        """Retain the newest `version.history.num-entries` versions (always the current one)."""
        try:
            keep = int(self.md.get("properties", {}).get(VERSION_HISTORY_PROP, DEFAULT_VERSION_HISTORY))
        except ValueError:
            raise BadRequest(f"properties.{VERSION_HISTORY_PROP} must be an integer") from None
        if keep < 1:
            raise BadRequest(f"properties.{VERSION_HISTORY_PROP} must be >= 1")
        versions = self.md.get("versions", [])
        if len(versions) > keep:
            current = self.md["current-version-id"]
            newest = sorted(versions, key=lambda v: v["version-id"])[-keep:]
            kept = {v["version-id"] for v in newest} | {current}
            self.md["versions"] = [v for v in versions if v["version-id"] in kept]
            self.md["version-log"] = [e for e in self.md.get("version-log", []) if e["version-id"] in kept]
        return self.md


def check_view_requirements(base: dict[str, Any], requirements: list[AssertViewUUID]) -> None:
    """Raise CommitConflict for the first requirement that does not hold against `base`."""
    for r in requirements:
        if r.uuid != base.get("view-uuid"):
            raise CommitConflict(f"Requirement failed: view UUID does not match: expected {r.uuid}, "
                                 f"found {base.get('view-uuid')}")


def apply_view_commit(base: dict[str, Any], requirements: list[AssertViewUUID], updates: list, *,
                      now_ms: int) -> dict[str, Any]:
    """Replace a view: check `assert-view-uuid`, apply the updates; returns `base` itself when nothing changed."""
    check_view_requirements(base, requirements)
    b = _Builder(base, now_ms)
    for i, u in enumerate(updates):
        field = f"updates[{i}]"
        if isinstance(u, m.AssignUUIDUpdate):
            if u.uuid != base.get("view-uuid"):
                raise BadRequest(f"{field}.uuid: cannot reassign the UUID of an existing view")
        elif isinstance(u, m.UpgradeFormatVersionUpdate):
            if u.format_version != 1:
                raise BadRequest(f"{field}.format-version: unsupported view format version {u.format_version}")
        elif isinstance(u, m.AddSchemaUpdate):
            b.add_schema({"type": "struct", **u.schema_.stored()})
        elif isinstance(u, m.SetLocationUpdate):
            b.md["location"], b.changed = u.location, True
        elif isinstance(u, m.SetPropertiesUpdate):
            b.md["properties"], b.changed = {**b.md.get("properties", {}), **u.updates}, True
        elif isinstance(u, m.RemovePropertiesUpdate):
            gone = set(u.removals)
            b.md["properties"] = {k: v for k, v in b.md.get("properties", {}).items() if k not in gone}
            b.changed = True
        elif isinstance(u, AddViewVersionUpdate):
            b.add_version(u.view_version.stored(), f"{field}.view-version")
        elif isinstance(u, SetCurrentViewVersionUpdate):
            b.set_current_version(u.view_version_id, f"{field}.view-version-id")
    return b.build() if b.changed else base


def new_view_metadata(*, view_uuid: str, location: str, schema: dict[str, Any], version: dict[str, Any],
                      properties: dict[str, str], now_ms: int) -> dict[str, Any]:
    """CreateViewRequest -> metadata: the view-version's schema-id is replaced by the id given to `schema`."""
    b = _Builder({"view-uuid": view_uuid, "format-version": 1, "location": location, "schemas": [],
                  "versions": [], "version-log": [], "properties": dict(properties)}, now_ms)
    schema = _parse(models.Schema, schema, "schema")
    b.add_schema({k: v for k, v in schema.items() if k != "schema-id"} | {"type": "struct"})
    b.add_version({**_parse(models.ViewVersion, version, "view-version"), "schema-id": -1}, "view-version")
    b.set_current_version(-1, "view-version")
    return b.build()
