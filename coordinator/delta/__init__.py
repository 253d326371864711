"""Delta tables managed through Unity Catalog's API: the service behind `api/delta/` and what it speaks in.

`models` holds the spec's request models, `state` a table's in-memory state, `rules` the spec's rules as pure
functions, `proposals` the glue the table actors run, `service` the `DeltaService` the HTTP layer calls, and
`files` the one file Delta reads; `v1/` is Unity Catalog's Delta API v1.0 over the same tables and actors. This is
the surface the rest imports (tests/delta checks the list).
"""

from coordinator.delta.models import (
                                      CommitInfo,
                                      CommitRequest,
                                      CreateCatalog,
                                      CreateSchema,
                                      CreateStagingTable,
                                      CreateTable,
                                      GetCommitsRequest,
                                      Metadata,
                                      MetricsRequest,
)
from coordinator.delta.service import DeltaService
from coordinator.delta.state import DeltaTable, StagingTable

__all__ = [
    "CommitInfo",
    "CommitRequest",
    "CreateCatalog",
    "CreateSchema",
    "CreateStagingTable",
    "CreateTable",
    "DeltaService",
    "DeltaTable",
    "GetCommitsRequest",
    "Metadata",
    "MetricsRequest",
    "StagingTable",
]
