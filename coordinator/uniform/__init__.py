"""Delta tables readable as Iceberg (UniForm): an Iceberg REST catalog over Unity Catalog's namespace, serving the
Iceberg metadata a Delta writer sent with its commits, or that the service writes itself for writers that send
none.

It depends on both `coordinator.delta` and `coordinator.iceberg`, which know nothing of each other, so it lives
beside them, not inside either. `tables` holds the rules (which metadata a table is read from), `catalog` the
read-only catalog `api/iceberg/` serves at `/api/2.1/unity-catalog/iceberg`.
"""

from coordinator.uniform.catalog import UniformCatalog

__all__ = ["UniformCatalog"]
