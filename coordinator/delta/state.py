"""A Delta table's in-memory state as its actor holds it, and its row form.

A UC table is a `tables` row whose `state` is either `{"staging": ...}` (allocated by `POST /staging-tables`, not yet
a table) or `{"info", "last", "published"}` (a table: its catalog entry and the commit coordinator's versions). The
ratified commits not yet published live in the commit log, keyed by version; `rows.load` reads them back.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping
from uuid import UUID

from storage.records import TableRow


@dataclass(frozen=True)
class StagingTable:
    """`POST /staging-tables` allocated an id and a location; `POST /tables` turns it into a table."""

    table_id: UUID
    catalog_name: str
    schema_name: str
    name: str
    location: str
    created_at: int
    schema_id: str | None = None   # the schema it was allocated in; None in rows written before it was kept
    created_by: str | None = None  # who allocated it: only they may finalize it (v1.0); None in older rows

    def row_state(self) -> dict[str, Any]:
        return {"staging": {"catalog_name": self.catalog_name, "schema_name": self.schema_name,
                            "name": self.name, "location": self.location, "created_at": self.created_at,
                            "schema_id": self.schema_id, "created_by": self.created_by}}


@dataclass(frozen=True)
class DeltaTable:
    """A UC table as its actor holds it. `info` is the catalog entry (TableInfo fields); the rest is the commit
    coordinator's state: everything GET commits needs is here, so it is answered from memory."""

    table_id: UUID
    info: Mapping[str, Any]
    last: int                        # latest ratified version; -1 when UC does not coordinate commits
    published: int                   # every version <= published is a `_delta_log/<v>.json`
    unpublished: tuple[dict, ...]    # ratified commits published+1 .. last, ascending
    newest: dict | None              # the commit ratified as `last`, kept after publishing to recognise replays
    # The service's own conversion of the table to Iceberg (coordinator/uniform), when it writes one: the metadata
    # file of the latest converted version, that version and its timestamp, or the version it refused and why.
    converted: Mapping[str, Any] | None = None

    @property
    def managed(self) -> bool:
        return self.info["table_type"] == "MANAGED" and self.info["data_source_format"] == "DELTA"

    @property
    def location(self) -> str:
        return self.info["storage_location"]

    @property
    def full_name(self) -> tuple[str, str, str]:
        return self.info["catalog_name"], self.info["schema_name"], self.info["name"]

    def row_state(self) -> dict[str, Any]:
        # The catalog entry rides along on every write: a table row is one compare-and-set, and the entry
        # (columns, properties) is a few KB, so keeping it in the row avoids a second store to keep in step.
        state = {"info": dict(self.info), "last": self.last, "published": self.published}
        if self.converted is not None:
            state["converted"] = dict(self.converted)
        return state


def freeze(info: dict[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(info)



def owned(comment: str | None, properties: dict[str, str], now: int, owner: str) -> dict[str, Any]:
    """The fields every UC object (catalog, schema, table) carries after its own: its comment (only when it has
    one), properties, owner and audit stamps."""
    fields: dict[str, Any] = {} if comment is None else {"comment": comment}
    return {**fields, "properties": properties, "owner": owner, "created_at": now, "created_by": owner,
            "updated_at": now, "updated_by": owner}


def table_info(table_id: UUID, full: tuple[str, str, str], table_type: str, data_source_format: str,
               columns: list[dict[str, Any]], location: str, comment: str | None, properties: dict[str, str],
               now: int, owner: str) -> dict[str, Any]:
    """A new table's catalog entry (UC `TableInfo`)."""
    catalog, schema, name = full
    return {"name": name, "catalog_name": catalog, "schema_name": schema, "table_type": table_type,
            "data_source_format": data_source_format, "columns": columns, "storage_location": location,
            **owned(comment, properties, now, owner), "table_id": str(table_id)}


def catalog_view(row: TableRow) -> DeltaTable | None:
    """A table as its row alone shows it (no unpublished commits read from the log), for listings; None for a
    staging table."""
    s = row.state
    if "info" not in s:
        return None
    converted = freeze(dict(s["converted"])) if "converted" in s else None
    return DeltaTable(row.table_id, freeze(dict(s["info"])), s["last"], s["published"], (), None, converted)
