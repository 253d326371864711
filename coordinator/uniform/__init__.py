"""Delta tables readable as Iceberg (UniForm): an Iceberg REST catalog over Unity Catalog's namespace, serving the
Iceberg metadata a Delta writer sent with its commits, or that the service writes itself for writers that send
none.

It depends on both `coordinator.delta` and `coordinator.iceberg`, which know nothing of each other, so it lives
beside them, not inside either. `tables` holds the rules (which metadata a table is read from), `catalog` the
read-only catalog `api/iceberg/` serves at `/api/2.1/unity-catalog/iceberg` (`metadata`: the files it serves, as it
keeps them in memory), `converter` the service's own conversions (scheduled off the commit path), `conversion` one
conversion (run in a worker process, `worker`), `deltalog` and `schema` what it reads of the Delta log and how
Delta's schema, partitions and stats become Iceberg's.
"""

from coordinator.uniform.catalog import UniformCatalog
from coordinator.uniform.converter import Converter

__all__ = ["Converter", "UniformCatalog"]
