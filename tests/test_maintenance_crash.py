"""Snapshot expiry and its deletion survive a crash: the service is SIGKILLed during an expiry (its claim recorded,
or the expiry durable) and during the deletion of what only expired snapshots referenced (storage/faults.py
points); after the restart every retained snapshot reads with pyiceberg, everything it references exists, and the
deletion resumes until the expired manifest lists and the data files only they held are gone."""

from __future__ import annotations

import time

import pytest
from pyiceberg.catalog import load_catalog

from coordinator.iceberg import expiry
from storage.files import to_local_path
from tests.support import ServerProcess
from tests.test_maintenance_expiry import SCHEMA, referenced_files, rows, settled, wait_for

pytestmark = pytest.mark.crash

ENV = {"COORDINATOR_MAINTENANCE_INTERVAL_S": "0.1", "COORDINATOR_MAINTENANCE_DELETE_GRACE_S": "0"}
POLICY = {expiry.ENABLED: "true", expiry.MAX_SNAPSHOT_AGE_MS: "1", expiry.MIN_SNAPSHOTS_TO_KEEP: "2"}


def died(server: ServerProcess, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while server.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.proc.poll() is not None


@pytest.mark.parametrize("point", ["expiry-claimed", "expiry-committed", "mid-deletion"])
def test_a_kill_during_expiry_or_deletion_loses_nothing_retained_and_the_deletion_resumes(point, database_url,
                                                                                            tmp_path):
    crashing = ServerProcess(database_url, tmp_path / "srv", extra_env={**ENV, "COORDINATOR_CRASH_POINTS": point})
    base = crashing.start()
    catalog = load_catalog("c", type="rest", uri=base)
    catalog.create_namespace("m")
    table = catalog.create_table("m.t", schema=SCHEMA, properties=POLICY)
    table.append(rows(0))
    table.append(rows(3))
    every = {s.manifest_list for s in catalog.load_table("m.t").metadata.snapshots}
    first_files = referenced_files(table, table.metadata.snapshots[0])
    table.overwrite(rows(100))   # the first appends' data files: now only older snapshots hold them
    try:
        table.append(rows(200))  # over the limits: the expiry runs, and the service dies at `point`
    except Exception:   # noqa: BLE001 - the kill may come before this answer
        pass
    assert died(crashing), f"the service did not die at {point}"

    server = ServerProcess(database_url, tmp_path / "srv", extra_env=ENV)
    server.port, server.base_url = crashing.port, crashing.base_url
    base = server.start()
    try:
        catalog = load_catalog("c", type="rest", uri=base)
        table = catalog.load_table("m.t")
        table.append(rows(300))   # (an expiry cut short before its commit is planned again after a commit)
        # (Read once the expiry is done: with no grace, a reader holding older metadata would lose its files.)
        table = settled(catalog, "m.t", 2)
        assert len(table.metadata.snapshots) == 2
        retained = {s.manifest_list for s in table.metadata.snapshots}
        gone = (every | {f for f in first_files if f.endswith(".parquet")}) - retained
        wait_for(lambda: not any(to_local_path(f).exists() for f in gone))
        for s in table.metadata.snapshots:
            scan = table.scan(snapshot_id=s.snapshot_id).to_arrow()
            assert scan.num_rows == int(s.summary["total-records"])
            assert all(to_local_path(f).exists() for f in referenced_files(table, s))
        assert {100, 300} <= set(table.scan().to_arrow()["id"].to_pylist())
    finally:
        server.stop()
