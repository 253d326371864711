"""Lance as the core knows it (coordinator/format.py): its realm and rows, grants, service, feed events, purge
claims, directories, warehouses and settings."""

from __future__ import annotations

from storage.records import WarehouseUse

from coordinator.auth import Grants
from coordinator.format import Directories, Format, TableKind
from coordinator.purges import PurgeListing

from .files import own_files
from .namespaces import WAREHOUSE_PROPERTY
from .rows import CATALOG, COMPACTION, FORMAT, REALM, load
from .service import LanceService

LANCE: Format[LanceService] = Format(
    name=FORMAT,
    realm=REALM,
    catalog_called="catalog",
    tables={FORMAT: TableKind(load, COMPACTION)},
    # format, at least one namespace level, the name (no catalog)
    grants=Grants(shape=f"{FORMAT}/<namespace levels>/<name>", table_depth=2, catalog=False),
    service=LanceService,
    changes=tuple(f"{FORMAT}.table.{what}" for what in ("created", "committed", "dropped")),
    # A purge claim names the table's `_versions/` directory (a file is another format's).
    purge=PurgeListing(claims=lambda named: named.endswith("/"), files=own_files),
    # Its namespaces are the top directories of the default warehouse's root, or of the root of the warehouse a
    # top-level namespace names (its `warehouse` property).
    directories=Directories(top_catalog=lambda warehouse: CATALOG),
    warehouses=(WarehouseUse(REALM, named_by=WAREHOUSE_PROPERTY),),
    settings=("lance_unrecorded_grace_s",),
)
