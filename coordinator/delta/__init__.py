"""Delta tables managed through Unity Catalog's API: commit rules and the catalog behind `api/delta.py`.

`rules` holds the commit rules as pure functions over the spec-named request models in `models`; `catalog`
turns them into proposals for the table actors. This is the surface the HTTP layer uses
(tests/delta checks the list).
"""

from coordinator.delta.catalog import DeltaCatalog
from coordinator.delta.models import (CommitInfo, CommitRequest, CreateCatalog, CreateSchema, CreateStagingTable,
                                      CreateTable, GetCommitsRequest, Metadata, MetricsRequest)
from coordinator.delta.rules import DeltaTable, StagingTable

__all__ = [
    "CommitInfo",
    "CommitRequest",
    "CreateCatalog",
    "CreateSchema",
    "CreateStagingTable",
    "CreateTable",
    "DeltaCatalog",
    "DeltaTable",
    "GetCommitsRequest",
    "Metadata",
    "MetricsRequest",
    "StagingTable",
]
