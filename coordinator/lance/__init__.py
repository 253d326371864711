"""Lance Namespace (REST) on the coordinator: the coordinator is each table's external manifest store.

The implementation modules are private in spirit; this is the surface the HTTP layer uses (tests/lance checks
the list).
"""

from coordinator.lance.layout import object_path
from coordinator.lance.models import (BatchCommitTablesRequest, BatchCreateTableVersionsRequest,
                                      BatchDeleteTableVersionsRequest, CreateNamespaceRequest,
                                      CreateTableVersionRequest, DeclareTableRequest, DeregisterTableRequest,
                                      DescribeNamespaceRequest, DescribeTableRequest, DescribeTableVersionRequest,
                                      DropNamespaceRequest, DropTableRequest, Page, RegisterTableRequest,
                                      TableExistsRequest)
from coordinator.lance.service import LanceService
from coordinator.lance.state import LanceTable, TableVersion

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
    "LanceService",
    "LanceTable",
    "Page",
    "RegisterTableRequest",
    "TableExistsRequest",
    "TableVersion",
    "object_path",
]
