"""The catalog's own rules, apart from a commit's: valid names and namespaces, the format version a create asks
for, where `set-location` may move a table, and how a name clash is told. Pure: no I/O."""

from __future__ import annotations

from typing import Any

from storage.files import is_within, unsafe_location
from storage.records import NAMESPACE_SEP, TableRow

from coordinator.errors import AlreadyExists, BadRequest, TableExists, ViewExists

from ..changes import AssertCreate


def check_name(name: str) -> None:
    if not name or "/" in name or name in (".", "..") or "\x00" in name:
        raise BadRequest(f"invalid table name: {name!r}")


def check_namespace(namespace: tuple[str, ...]) -> None:
    # A level with `/` could never be addressed: routing decodes the path's %2F before splitting it.
    if not namespace or any(not level or NAMESPACE_SEP in level or "/" in level or "\x00" in level
                            for level in namespace):
        raise BadRequest(f"invalid namespace: {list(namespace)!r}")


def format_version(properties: dict[str, str]) -> int | None:
    """The `format-version` a create's properties ask for, if any."""
    value = properties.get("format-version")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"properties.format-version must be an integer, got {value!r}") from None


def creates_table(requirements: list) -> bool:
    """`assert-create`: the change creates its table (the create transaction after a stage-create)."""
    return any(isinstance(r, AssertCreate) for r in requirements)


def location_refused(location: str | None, warehouse: str) -> BadRequest:
    """Why table files may not go to `location`: it is unsafe in itself, or outside the warehouse."""
    why = unsafe_location(location or "")
    return BadRequest(f"location {location!r} is refused: {why}" if why else
                      f"location {location!r} is not below the warehouse {warehouse!r}")


def check_moved(warehouse: str | None, old: dict[str, Any], new: dict[str, Any]) -> None:
    """`set-location` moves where the next metadata files are written: only to a place below the warehouse."""
    location = new.get("location")
    if warehouse is not None and location != old.get("location") and not is_within(warehouse, location or ""):
        raise location_refused(location, warehouse)


def name_taken(row: TableRow | None, ident: Any, kind: str) -> AlreadyExists:
    """A create (or rename) of a `kind` refused for its name: which kind holds it, in Java's words (a view's name
    is taken by a table: "Table with same name already exists"), so that the client looks for the right object."""
    holder = row.kind if row is not None else kind
    error = ViewExists if holder == "view" else TableExists
    if holder != kind:
        return error(f"{holder.capitalize()} with same name already exists: {ident}")
    return error(f"{kind.capitalize()} already exists: {ident}")
