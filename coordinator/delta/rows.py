"""What the store holds of Delta (Unity Catalog): the realms its names live in, its table rows, how a row loads into
the actor's state, and where its metrics reports go.

- a catalog is a `namespaces` row (realm CATALOG_REALM, catalog "", path <name>);
- a schema is a `namespaces` row (realm REALM, catalog <catalog>, path <schema>);
- a table is a `tables` row (realm REALM, catalog, namespace <schema>, name), format FORMAT;
- a staging table is a `tables` row under a reserved catalog name no UC name can spell (STAGING_CATALOG), named by
  its id. `POST /tables` renames that row into place, so the table keeps the staging id (which `0.json` records as
  `io.unitycatalog.tableId`) and the unique (catalog, schema, name) index is the create's compare-and-set.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from storage.records import ReportTable, TableRow

from .state import DeltaTable, StagingTable, catalog_view

if TYPE_CHECKING:
    from coordinator.format import Services

REALM = "uc"
CATALOG_REALM = "uc-catalog"
STAGING_CATALOG = "\x1estaging"  # control characters are not allowed in UC names, so no catalog collides
FORMAT = "delta"
# Kept only while the table exists (a report racing a drop is dropped with it), and deleted with the table.
REPORTS = ReportTable("delta_commit_metrics", key="commit_version", while_table_exists=True)


async def load(services: Services, row: TableRow) -> StagingTable | DeltaTable:
    """The state of a table row, with its unpublished commits (and the newest one) read from the commit log."""
    s = row.state
    if "staging" in s:
        st = s["staging"]
        return StagingTable(row.table_id, st["catalog_name"], st["schema_name"], st["name"], st["location"],
                            st["created_at"], st.get("schema_id"), st.get("created_by"))
    last, published = s["last"], s["published"]
    entries = await services.store.read_log(row.table_id, start=published) if last >= 0 else []
    unpublished = tuple(e.payload for e in entries if e.version > published)
    newest = next((e.payload for e in entries if e.version == last), None)
    table = catalog_view(row)
    return replace(table, unpublished=unpublished, newest=newest)
