"""Iceberg as the core knows it (coordinator/format.py): its realm and rows, grants, service, feed events, purge
claims, directories, warehouses and reports."""

from __future__ import annotations

from storage.files import path_segment
from storage.records import WarehouseUse

from coordinator.auth import Grants
from coordinator.format import Directories, Format, TableKind
from coordinator.purges import PurgeListing
from coordinator.warehouses import DEFAULT as DEFAULT_WAREHOUSE

from .files import reachable_files
from .rows import COMPACTION, FORMAT, REALM, REPORTS, VIEW_FORMAT, load
from .service import IcebergService

ICEBERG: Format[IcebergService] = Format(
    name=FORMAT,
    realm=REALM,
    catalog_called="catalog prefix",
    tables={FORMAT: TableKind(load, COMPACTION), VIEW_FORMAT: TableKind(load, COMPACTION)},
    # format, prefix ("" for none), at least one namespace level, the name
    grants=Grants(shape=f"{FORMAT}/<prefix>/<namespace levels>/<name>", table_depth=4),
    service=IcebergService,
    changes=tuple(f"{FORMAT}.{kind}.{what}" for kind in ("table", "view")
                  for what in ("created", "committed", "renamed", "dropped")),
    # A purge claim names the table's metadata file (a directory is another format's).
    purge=PurgeListing(claims=lambda named: not named.endswith("/"), files=reachable_files),
    # Unprefixed namespaces are the warehouse's top directories, a prefix's are below `<prefix>~` (which no
    # namespace level's directory ends in), and a prefix named after a warehouse has that warehouse's root.
    directories=Directories(top_catalog=lambda warehouse: "" if warehouse is None else warehouse,
                            own_directory=lambda catalog: path_segment(catalog) + "~" if catalog else None,
                            reserves=lambda segment: segment.endswith("~"),
                            reserved_for="another Iceberg catalog prefix"),
    warehouse_catalog=lambda warehouse: "" if warehouse == DEFAULT_WAREHOUSE else warehouse,
    warehouses=(WarehouseUse(REALM, catalog=True, called="an Iceberg catalog prefix"),),
    reports=REPORTS,
)
