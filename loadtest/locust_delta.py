"""Locust: Delta catalog-managed commits through Unity Catalog, as Delta's UC commit coordinator makes them.

    locust -f loadtest/locust_delta.py --host http://127.0.0.1:8181 --headless \
        --tables 64 --writers-per-table 2 --duration 60 --csv out/delta

Flow per user (one table): read `latest_table_version` (GET /delta/preview/commits), then commit the staged
commit as version last+1 (POST /delta/preview/commits); the writer that lands a multiple of BACKFILL_EVERY
reports the backfill (`latest_backfilled_version`). On 409 it reads the latest version and retries; on 429 (too
many unpublished commits) it backfills and retries. Creating a table writes its `_delta_log/0.json`, so locust
must run on a machine that sees the service's warehouse (the default: the same machine). Staged commit files are
not written: the catalog never reads them. Options: see loadtest/locust_common.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from locust import task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # locust puts only loadtest/ on sys.path

from loadtest.flows import (
    BACKFILL_EVERY,
    DELTA_COLUMNS,
    UC,
    DeltaTable,
    delta_commit_body,
    delta_first_commit,
    delta_properties,
    local_path,
)
from loadtest.locust_common import FixedShape, WriterUser  # noqa: F401 - locust finds the shape here

CATALOG = "locust"
COMMITS = f"{UC}/delta/preview/commits"


class DeltaWriter(WriterUser):
    protocol = "delta"

    def setup_table(self) -> None:
        schema, name = self.namespace, f"t{self.table_index}"
        self.call("POST", f"{UC}/catalogs", "create catalog", {"name": CATALOG}, ok=(200, 409), conflict_ok=False)
        self.call("POST", f"{UC}/schemas", "create schema", {"name": schema, "catalog_name": CATALOG},
                  ok=(200, 409), conflict_ok=False)
        status, info = self.call("GET", f"{UC}/tables/{CATALOG}.{schema}.{name}", "get table", ok=(200, 404))
        if status == 404:
            status, staging = self.call("POST", f"{UC}/staging-tables", "create staging table",
                                        {"name": name, "catalog_name": CATALOG, "schema_name": schema},
                                        ok=(200, 400))
            if status == 200:
                log_dir = os.path.join(local_path(staging["staging_location"]), "_delta_log")
                os.makedirs(log_dir, exist_ok=True)
                with open(os.path.join(log_dir, "00000000000000000000.json"), "wb") as f:
                    f.write(delta_first_commit(staging["id"]))
                self.call("POST", f"{UC}/tables", "create table", {
                    "name": name, "catalog_name": CATALOG, "schema_name": schema, "table_type": "MANAGED",
                    "data_source_format": "DELTA", "columns": DELTA_COLUMNS,
                    "storage_location": staging["staging_location"], "properties": delta_properties(staging["id"])},
                    ok=(200, 400))
            # Another writer of this table may have won the race: read what exists.
            status, info = self.call("GET", f"{UC}/tables/{CATALOG}.{schema}.{name}", "get table")
        if status != 200:
            raise RuntimeError(f"cannot set up Delta table {CATALOG}.{schema}.{name}: HTTP {status}")
        self.table = DeltaTable(info["table_id"], info["storage_location"])
        self.last = 0
        self.refresh()

    @property
    def ident(self) -> dict:
        return {"table_id": self.table.table_id, "table_uri": self.table.uri}

    def refresh(self) -> None:
        with self.client.request("GET", COMMITS, json={**self.ident, "start_version": self.last + 1},
                                 name="get commits", catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"HTTP {r.status_code}: {(r.text or '')[:200]}")
                raise RuntimeError(f"get commits failed: HTTP {r.status_code}")
            self.last = r.json()["latest_table_version"]

    def backfill(self, version: int) -> None:
        self.call("POST", COMMITS, "report backfill", {**self.ident, "latest_backfilled_version": version})

    def commit(self) -> None:
        while True:
            v = self.last + 1
            status, _ = self.call("POST", COMMITS, "commit", delta_commit_body(self.table, v), ok=(200,))
            if status == 200:
                self.last = v
                if v % BACKFILL_EVERY == 0:
                    self.backfill(v)
                return
            if status == 409:
                self.refresh()
            elif status == 429:
                self.refresh()
                self.backfill(self.last)
            else:
                raise RuntimeError(f"commit failed with HTTP {status}")

    @task
    def commit_version(self) -> None:
        self.timed_commit()
