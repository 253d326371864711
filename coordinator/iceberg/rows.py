"""What the store holds of Iceberg: the realm its names live in, its two kinds of table row (a table, a view), how
a row loads into the actor's state and is kept while the table is idle, and where its metrics reports go."""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.records import ReportTable, TableRow

from coordinator.decision import Compaction

from .files import read_table
from .state import IcebergTable, UnreadableTable, expand

if TYPE_CHECKING:
    from coordinator.format import Services

REALM = "iceberg"
FORMAT = "iceberg"
VIEW_FORMAT = "iceberg-view"
REPORTS = ReportTable("iceberg_metric_reports", key="report_type")


async def load(services: Services, row: TableRow) -> IcebergTable | UnreadableTable:
    """A table's (or view's) state: its current metadata file, read (`UnreadableTable` if it is gone)."""
    return await read_table(services.files, row)


# An idle table keeps only its metadata file's bytes (a tenth of the parsed dict's size); an unreadable one is
# not kept (None), so that a restored file is read again.
COMPACTION = Compaction(compact=lambda t: t.metadata_json if isinstance(t, IcebergTable) else None, expand=expand)
