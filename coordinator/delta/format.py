"""Delta (Unity Catalog) as the core knows it (coordinator/format.py): its realm and rows, grants, service, feed
events, directories, warehouses, reports and settings."""

from __future__ import annotations

from storage.records import WarehouseUse

from coordinator.auth import Grants
from coordinator.format import Directories, Format, TableKind

from .rows import CATALOG_REALM, FORMAT, REALM, REPORTS, load
from .service import MANAGED_DIR, DeltaService

DELTA: Format[DeltaService] = Format(
    name=FORMAT,
    realm=REALM,
    catalog_called="catalog",
    tables={FORMAT: TableKind(load)},
    # format, catalog, schema, name: exactly so (a schema holds no schemas)
    grants=Grants(shape=f"{FORMAT}/<catalog>/<schema>/<name>", table_depth=4, exact=True),
    service=DeltaService,
    changes=tuple(f"{FORMAT}.table.{what}" for what in ("created", "committed", "dropped")),
    # (its drops' claims name no metadata: a managed table's directory is its own, deleted whole)
    # Managed tables are placed below a directory of the default warehouse that is Unity Catalog's alone.
    directories=Directories(top_catalog=lambda warehouse: None, reserves=lambda segment: segment == MANAGED_DIR,
                            reserved_for="Unity Catalog's managed tables"),
    warehouses=(WarehouseUse(CATALOG_REALM, root_within="storage_root"),),   # a catalog's storage_root
    reports=REPORTS,
    settings=("delta_max_unpublished_commits", "delta_commits_page_size"),
)
