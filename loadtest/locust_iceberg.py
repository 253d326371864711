"""Locust: Iceberg REST commits as the Java/pyiceberg clients make them.

    locust -f loadtest/locust_iceberg.py --host http://127.0.0.1:8181 --headless \
        --tables 64 --writers-per-table 2 --duration 60 --csv out/iceberg

Flow per user (one table): load the table, then commit `add-snapshot` + `set-snapshot-ref main` guarded by
`assert-ref-snapshot-id` (the snapshot this writer last saw); on 409 wait as the Java client does, reload the
table and retry. Manifest lists are not written: the catalog never reads them. Options: see
loadtest/locust_common.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

from locust import task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # locust puts only loadtest/ on sys.path

from loadtest.flows import ICEBERG_SCHEMA, iceberg_commit_body
from loadtest.locust_common import FixedShape, WriterUser  # noqa: F401 - locust finds the shape here


class IcebergWriter(WriterUser):
    protocol = "iceberg"

    def setup_table(self) -> None:
        ns, name = self.namespace, f"t{self.table_index}"
        self.path = f"/v1/namespaces/{ns}/tables/{name}"
        self.call("POST", "/v1/namespaces", "create namespace", {"namespace": [ns]}, ok=(200, 409),
                  conflict_ok=False)
        self.call("POST", f"/v1/namespaces/{ns}/tables", "create table", {"name": name, "schema": ICEBERG_SCHEMA},
                  ok=(200, 409), conflict_ok=False)
        self.reload()

    def reload(self) -> None:
        status, body = self.call("GET", self.path, "load table")
        if status != 200:
            raise RuntimeError(f"cannot load {self.path}: HTTP {status}")
        meta = body["metadata"]
        current = meta.get("current-snapshot-id")
        self.snapshot_id = None if current in (None, -1) else current
        self.seq = meta.get("last-sequence-number", 0)

    def commit(self) -> None:
        retry = self.retry_schedule()
        while True:
            new_id = self.rng.getrandbits(62)
            status, _ = self.call("POST", self.path, "commit table",
                                  iceberg_commit_body(self.snapshot_id, new_id, self.seq + 1))
            if status == 200:
                self.snapshot_id, self.seq = new_id, self.seq + 1
                return
            if status == 409:
                try:
                    self.wait_to_retry(retry)
                finally:
                    self.reload()
                continue
            raise RuntimeError(f"commit failed with HTTP {status}")

    @task
    def append(self) -> None:
        self.timed_commit()
