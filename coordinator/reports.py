"""Metrics reports: what a table's clients tell of their scans and commits (Iceberg's `POST .../metrics`, Unity
Catalog's `/delta/metrics`), kept beside the table for observability and never read on the commit path.

A client that may only read a table may send them, so what they take is bounded (`Config`): a report of more
than `metrics_report_max_bytes` (as JSON) is refused, a table keeps only its newest `metrics_reports_per_table`
of each format, and each report is deleted `metrics_report_retain_s` after it came (the service's expiry loop).
Each format keeps its reports in a table of its own (`Format.reports`).
"""

from __future__ import annotations

from typing import Any

import orjson

from storage.records import ReportTable

from .errors import BadRequest


async def keep(store, config, table: ReportTable, table_id, key: str | int, report: dict[str, Any]) -> None:
    """A report of the table `table_id`, under `key` (its kind, or its commit's version), within the bounds
    above."""
    check_size(report, config.metrics_report_max_bytes)
    await store.add_report(table, table_id, key, report, config.metrics_reports_per_table)


def check_size(report: Any, max_bytes: int) -> None:
    size = len(orjson.dumps(report))
    if size > max_bytes:
        raise BadRequest(f"the metrics report is {size} bytes as JSON; this service keeps reports of at most "
                         f"{max_bytes} bytes (metrics_report_max_bytes)")
