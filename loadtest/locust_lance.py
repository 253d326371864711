"""Locust: Lance version commits through the Lance Namespace REST API (the external manifest store flow).

    locust -f loadtest/locust_lance.py --host http://127.0.0.1:8181 --headless \
        --tables 64 --writers-per-table 2 --duration 60 --csv out/lance

Flow per user (one table): `version/list` limit 1 (descending) for the latest version, write a staged manifest
into the table's `_versions/`, `version/create` at latest+1; on 409 wait as lance does, list again and retry; on
any other error describe the table (as pylance does to tell "gone" from "broken") and retry. The staged manifest
is a real file the server reads, so locust must run where the table locations are reachable (the default: the
same machine).
Works against lance's own RestAdapter too. Options: see loadtest/locust_common.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from locust import task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # locust puts only loadtest/ on sys.path

from loadtest.flows import LanceTable, lance_create_body, local_path, stage_manifest
from loadtest.locust_common import FixedShape, WriterUser  # noqa: F401 - locust finds the shape here


class LanceWriter(WriterUser):
    protocol = "lance"

    def setup_table(self) -> None:
        levels = (self.namespace, f"t{self.table_index}")
        ident = "$".join(levels)
        self.call("POST", f"/v1/namespace/{self.namespace}/create", "create namespace", {"id": [self.namespace]},
                  ok=(200, 409), conflict_ok=False)
        self.call("POST", f"/v1/table/{ident}/declare", "declare table", {"id": list(levels)}, ok=(200, 409),
                  conflict_ok=False)
        status, info = self.call("POST", f"/v1/table/{ident}/describe", "describe table", {"id": list(levels)})
        if status != 200:
            raise RuntimeError(f"cannot describe Lance table {ident}: HTTP {status}")
        location = local_path(info["location"])
        os.makedirs(os.path.join(location, "_versions"), exist_ok=True)
        self.table = LanceTable(ident, levels, location)
        self.refresh()

    def refresh(self) -> None:
        status, body = self.call("POST", f"{self.table.route}/version/list?limit=1&descending=true",
                                 "list versions (limit 1)", {"id": list(self.table.levels)})
        if status != 200:
            raise RuntimeError(f"version/list failed: HTTP {status}")
        versions = (body or {}).get("versions") or []
        self.latest = versions[0]["version"] if versions else 0

    def commit(self) -> None:
        retry = self.retry_schedule()
        while True:
            v = self.latest + 1
            staged = stage_manifest(self.table.location, v)
            status, _ = self.call("POST", f"{self.table.route}/version/create", "create version",
                                  lance_create_body(self.table, v, staged))
            if status == 200:
                self.latest = v
                return
            try:
                os.unlink("/" + staged)
            except FileNotFoundError:
                pass
            if status != 409:
                self.call("POST", f"{self.table.route}/describe", "describe table", {"id": list(self.table.levels)})
            try:
                if status == 409:
                    self.wait_to_retry(retry)
            finally:
                self.refresh()
            if status not in (409, 503):
                raise RuntimeError(f"version/create failed with HTTP {status}")

    @task
    def create_version(self) -> None:
        self.timed_commit()
