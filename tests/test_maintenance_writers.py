"""Maintenance beside writers (coordinator/maintenance): writers appending continuously to opted-in tables get no
409 from it, and a file that a snapshot committed after an expiry references again is never deleted. pyiceberg
over real HTTP, the real PostgreSQL."""

from __future__ import annotations

import dataclasses
import re
import threading
import time

import httpx
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import load_catalog

from coordinator.iceberg import expiry
from storage.files import to_local_path
from tests.test_maintenance_expiry import SCHEMA, referenced_files, rows, settled, wait_for

GRACE_S = 3.0


@pytest.fixture
def config(config):
    return dataclasses.replace(config, maintenance_interval_s=0.1, maintenance_delete_grace_s=GRACE_S)


@pytest.fixture
def catalog(service):
    cat = load_catalog("coord", type="rest", uri=service)
    cat.create_namespace("m")
    return cat


def metric(service: str, name: str, labels: str = "") -> float:
    text = httpx.get(service + "/metrics").text
    found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


POLICY = {expiry.ENABLED: "true", expiry.MAX_SNAPSHOT_AGE_MS: "1", expiry.MIN_SNAPSHOTS_TO_KEEP: "3"}


def test_four_writers_appending_continuously_get_no_conflict_from_maintenance(catalog, service):
    tables = [catalog.create_table(f"m.w{i}", schema=SCHEMA, properties=POLICY) for i in range(4)]
    errors: list[BaseException] = []
    per_writer = 15

    def write(table) -> None:
        try:
            for i in range(per_writer):
                table.append(rows(i * 3))
        except BaseException as exc:   # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(t,)) for t in tables]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert metric(service, "coordinator_maintenance_expiry_commits_total") > 0
    # Every writer's commit applied at its first attempt: maintenance made none of them conflict.
    assert metric(service, "coordinator_commits_total", '{format="iceberg",outcome="conflict"}') == 0
    assert metric(service, "coordinator_commits_total", '{format="iceberg",outcome="applied"}') == 4 * per_writer
    for i in range(4):
        table = settled(catalog, f"m.w{i}", 3)
        assert len(table.metadata.snapshots) == 3
        assert table.scan().to_arrow().num_rows == 3 * per_writer


def test_a_file_referenced_again_after_the_expiry_is_never_deleted(catalog):
    table = catalog.create_table("m.again", schema=SCHEMA, properties={**POLICY, expiry.MIN_SNAPSHOTS_TO_KEEP: "1"})
    table.append(rows(0))
    table.append(rows(3))
    held = [f for f in referenced_files(table, table.current_snapshot()) if f.endswith(".parquet")]
    table.overwrite(rows(100))   # the two appends' files: now held only by the snapshots that expire
    table = settled(catalog, "m.again", 1)
    assert len(table.metadata.snapshots) == 1
    # Within the deletion's grace, a writer adds one of those files to the table again.
    again, other = held
    table.add_files([again])
    assert all(to_local_path(f).exists() for f in held)
    wait_for(lambda: not to_local_path(other).exists(), timeout_s=GRACE_S + 20)
    time.sleep(0.5)
    assert to_local_path(again).exists()
    table = catalog.load_table("m.again")
    readded = pq.read_table(to_local_path(again))["id"].to_pylist()
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == sorted([100, 101, 102, *readded])


def test_a_deletion_under_way_takes_out_what_a_newer_snapshot_references(catalog):
    """The deletion plans from the table as it is after the grace (above), and before each chunk of files reads the
    snapshots committed since (`Plan.protect`): what they reference leaves the plan."""
    from coordinator.iceberg import cleanup
    from storage.files import FileIO

    table = catalog.create_table("m.plan", schema=SCHEMA)   # no maintenance: the snapshots stay for this test
    table.append(rows(0))
    table.append(rows(3))
    held = sorted(f for f in referenced_files(table, table.current_snapshot()) if f.endswith(".parquet"))
    table.overwrite(rows(100))
    lists = [s.manifest_list for s in catalog.load_table("m.plan").metadata.snapshots]
    expired, retained = lists[:2], lists[2:]
    table.add_files([held[0]])
    newer = catalog.load_table("m.plan").current_snapshot().manifest_list
    files = FileIO()
    location = table.metadata.location
    plan = cleanup.plan(files, location, expired, retained)
    assert set(held) <= set(plan.content) and set(expired) == set(plan.manifest_lists)
    plan.protect(files, [newer, *retained])
    assert held[0] not in plan.content and held[1] in plan.content
    assert newer not in plan.files and not set(retained) & set(plan.files)
