"""Lance Namespace (REST) on the coordinator: the coordinator is each table's external manifest store.

The implementation modules are private in spirit; this is the surface the HTTP layer uses (tests/lance checks
the list).
"""

from coordinator.lance.catalog import LanceCatalog, Page
from coordinator.lance.models import (BatchCommitTablesRequest, BatchCreateTableVersionsRequest,
                                      BatchDeleteTableVersionsRequest, CreateNamespaceRequest,
                                      CreateTableVersionRequest, DeclareTableRequest, DeregisterTableRequest,
                                      DescribeNamespaceRequest, DescribeTableRequest, DescribeTableVersionRequest,
                                      DropNamespaceRequest, DropTableRequest, RegisterTableRequest,
                                      TableExistsRequest)
from coordinator.lance.table import LanceTable, TableVersion, object_path

__all__ = [
    "BatchCommitTablesRequest",
    "BatchCreateTableVersionsRequest",
    "BatchDeleteTableVersionsRequest",
    "CreateNamespaceRequest",
    "CreateTableVersionRequest",
    "DeclareTableRequest",
    "DeregisterTableRequest",
    "DescribeNamespaceRequest",
    "DescribeTableRequest",
    "DescribeTableVersionRequest",
    "DropNamespaceRequest",
    "DropTableRequest",
    "LanceCatalog",
    "LanceTable",
    "Page",
    "RegisterTableRequest",
    "TableExistsRequest",
    "TableVersion",
    "object_path",
]
