"""Snapshot expiry by the coordinator (coordinator/maintenance, coordinator/iceberg/expiry.py), with pyiceberg over
real HTTP against the running service and its real PostgreSQL. The long run (600 appends at 10/s) is
loadtest-sized: set COORDINATOR_TEST_EXPIRY_APPENDS=600 COORDINATOR_TEST_EXPIRY_RATE=10 to run it."""

from __future__ import annotations

import dataclasses
import os
import time

import httpx
import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from coordinator.iceberg import expiry
from storage.files import to_local_path

APPENDS = int(os.environ.get("COORDINATOR_TEST_EXPIRY_APPENDS", "30"))
RATE = float(os.environ.get("COORDINATOR_TEST_EXPIRY_RATE", "40"))   # appends per second, at most
KEEP = 5
SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))
ROWS = 3   # per append


# -- the policy, as Java's RemoveSnapshots reads the table's properties -------------------------------------------

def snap(i: int, ts: int, parent: int | None = None) -> dict:
    s = {"snapshot-id": i, "timestamp-ms": ts, "manifest-list": f"file:///t/metadata/snap-{i}.avro"}
    if parent is not None:
        s["parent-snapshot-id"] = parent
    return s


def metadata(n: int, props: dict, refs: dict | None = None, now: int = 1_000_000) -> dict:
    snaps = [snap(i, now - (n - i) * 1000, i - 1 if i > 1 else None) for i in range(1, n + 1)]
    return {"snapshots": snaps, "current-snapshot-id": n, "properties": props,
            "refs": {"main": {"snapshot-id": n, "type": "branch"}, **(refs or {})}}


def test_policy_keeps_min_snapshots_young_ones_tags_and_their_branches():
    now = 1_000_000
    md = metadata(10, {expiry.MAX_SNAPSHOT_AGE_MS: "2500", expiry.MIN_SNAPSHOTS_TO_KEEP: "1"})
    # Snapshots 8, 9, 10 are at most 2.5 s old; the rest go.
    assert expiry.plan(md, now).snapshot_ids == tuple(range(1, 8))
    md = metadata(10, {expiry.MAX_SNAPSHOT_AGE_MS: "1", expiry.MIN_SNAPSHOTS_TO_KEEP: "4"})
    assert expiry.plan(md, now).snapshot_ids == tuple(range(1, 7))
    # A tag keeps its snapshot; a branch keeps its own minimum; an unreferenced young snapshot stays.
    md = metadata(10, {expiry.MAX_SNAPSHOT_AGE_MS: "1", expiry.MIN_SNAPSHOTS_TO_KEEP: "2"},
                  {"t": {"snapshot-id": 2, "type": "tag"}, "b": {"snapshot-id": 5, "type": "branch",
                                                               "min-snapshots-to-keep": 3}})
    assert set(expiry.plan(md, now).snapshot_ids) == {1, 6, 7, 8}
    # A ref older than its max ref age goes (main never does), and then so do its snapshots.
    md = metadata(10, {expiry.MAX_SNAPSHOT_AGE_MS: "1", expiry.MIN_SNAPSHOTS_TO_KEEP: "2",
                       expiry.MAX_REF_AGE_MS: "5500"},
                  {"old": {"snapshot-id": 2, "type": "tag"}, "young": {"snapshot-id": 7, "type": "tag"},
                   "own": {"snapshot-id": 3, "type": "tag", "max-ref-age-ms": 10 ** 9}})
    p = expiry.plan(md, now)
    assert p.refs == ("old",) and set(p.snapshot_ids) == {1, 2, 4, 5, 6, 8}
    # Defaults: 5 days, keep 1: nothing young expires.
    assert not expiry.plan(metadata(10, {}), now)
    assert expiry.enabled({"properties": {expiry.ENABLED: "true"}}, False)
    assert not expiry.enabled({"properties": {expiry.ENABLED: "false"}}, True)
    assert expiry.enabled({"properties": {}}, True) and not expiry.enabled({"properties": {}}, False)


# -- end to end with pyiceberg -------------------------------------------------------------------------------

@pytest.fixture
def config(config):
    return dataclasses.replace(config, maintenance_interval_s=0.2, maintenance_delete_grace_s=0.0)


@pytest.fixture
def catalog(service):
    cat = load_catalog("coord", type="rest", uri=service)
    cat.create_namespace("m")
    return cat


def rows(start: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + ROWS), pa.int64())})


def appended(table, n: int, rate: float = RATE) -> dict[int, int]:
    """`n` appends at most `rate` a second: snapshot id -> rows the table holds in it."""
    held = {}
    for i in range(n):
        started = time.monotonic()
        table.append(rows(i * ROWS))
        snapshot = table.current_snapshot()
        held[snapshot.snapshot_id] = int(snapshot.summary["total-records"])
        time.sleep(max(0.0, 1 / rate - (time.monotonic() - started)))
    return held


def duckdb_reader():
    """DuckDB with its iceberg extension from the PyPI wheels (tests/uniform/conftest.py): nothing is downloaded."""
    import importlib.util

    import duckdb
    extensions = list(importlib.util.find_spec("duckdb_ext").submodule_search_locations)[0] + "/extensions"
    con = duckdb.connect()
    con.execute(f"SET extension_directory = '{extensions}'")
    con.execute("SET autoinstall_known_extensions = false")
    for extension in ("parquet", "avro", "iceberg"):
        con.execute(f"LOAD {extension}")
    return con


def local(uri: str):
    return to_local_path(uri)


def referenced_files(table, snapshot) -> set[str]:
    files = {snapshot.manifest_list}
    for manifest in snapshot.manifests(table.io):
        files.add(manifest.manifest_path)
        files.update(e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io))
    return files


def settled(catalog, name: str, at_most: int, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        table = catalog.load_table(name)
        if len(table.metadata.snapshots) <= at_most or time.monotonic() > deadline:
            return table
        time.sleep(0.1)


def policy(**extra) -> dict:
    return {expiry.ENABLED: "true", expiry.MAX_SNAPSHOT_AGE_MS: "1", expiry.MIN_SNAPSHOTS_TO_KEEP: str(KEEP),
            **extra}


def wait_for(check, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_expiry_keeps_the_policy_every_retained_snapshot_reads_and_only_unreferenced_files_go(catalog, service):
    table = catalog.create_table("m.stream", schema=SCHEMA, properties=policy())
    held = appended(table, 4)
    tagged = table.current_snapshot().snapshot_id
    table.manage_snapshots().create_tag(tagged, "kept").commit()
    tagged_files = referenced_files(table, table.current_snapshot())
    held.update(appended(catalog.load_table("m.stream"), APPENDS - 4))
    every_list = {s.manifest_list for s in catalog.load_table("m.stream").metadata.snapshots}

    table = settled(catalog, "m.stream", KEEP + 1)
    snapshots = table.metadata.snapshots
    # Within the policy: the newest KEEP of main, and the tag's.
    assert len(snapshots) == KEEP + 1, [s.snapshot_id for s in snapshots]
    assert tagged in {s.snapshot_id for s in snapshots} and table.metadata.refs["kept"].snapshot_id == tagged
    duck = duckdb_reader()
    for s in snapshots:   # every retained snapshot scans right (pyiceberg, DuckDB), everything it references exists
        assert table.scan(snapshot_id=s.snapshot_id).to_arrow().num_rows == held[s.snapshot_id]
        assert duck.execute(f"SELECT count(*) FROM iceberg_scan('{table.metadata_location}', "
                            f"snapshot_from_id => {s.snapshot_id})").fetchone()[0] == held[s.snapshot_id]
        assert all(local(f).exists() for f in referenced_files(table, s))
    retained = {s.manifest_list for s in snapshots}
    wait_for(lambda: not any(local(ml).exists() for ml in every_list - retained))
    expired = httpx.get(service + "/metrics").text
    assert "coordinator_maintenance_snapshots_expired_total" in expired

    # An overwrite: once the snapshots before it expire, the data files only they held go; the tag's stay.
    before = referenced_files(table, table.current_snapshot())
    table.overwrite(rows(10_000))
    held.update(appended(catalog.load_table("m.stream"), KEEP + 1))
    table = settled(catalog, "m.stream", KEEP + 1)
    assert table.scan().to_arrow().num_rows == ROWS * (KEEP + 2)
    assert table.scan(snapshot_id=tagged).to_arrow().num_rows == held[tagged]
    live = set().union(*(referenced_files(table, s) for s in table.metadata.snapshots))
    only_expired = {f for f in before - live if f.endswith(".parquet")}
    assert only_expired and not (only_expired & tagged_files)
    wait_for(lambda: not any(local(f).exists() for f in only_expired))
    assert all(local(f).exists() for f in live | tagged_files)

    # The commit feed tells of each expiry.
    feed = httpx.get(service + "/api/coordinator/v1/events", params={"limit": 1000}).json()
    maintained = [e for e in feed["events"] if "maintenance" in e["data"]]
    assert maintained and all(e["type"] == "iceberg.table.committed" and
                              e["data"]["maintenance"]["operation"] == "expire-snapshots" for e in maintained)


def test_gc_disabled_expires_snapshots_but_deletes_nothing(catalog):
    table = catalog.create_table("m.shared", schema=SCHEMA, properties=policy(**{"gc.enabled": "false"}))
    appended(table, 12)
    table = catalog.load_table("m.shared")
    every = set().union(*(referenced_files(table, s) for s in table.metadata.snapshots))
    table.append(rows(0))
    table = settled(catalog, "m.shared", KEEP)
    assert len(table.metadata.snapshots) == KEEP
    time.sleep(0.5)
    assert all(local(f).exists() for f in every)


def test_without_the_opt_in_nothing_changes(catalog):
    table = catalog.create_table("m.plain", schema=SCHEMA, properties={expiry.MAX_SNAPSHOT_AGE_MS: "1",
                                                                         expiry.MIN_SNAPSHOTS_TO_KEEP: "1"})
    appended(table, 10)
    time.sleep(0.5)
    table = catalog.load_table("m.plain")
    assert len(table.metadata.snapshots) == 10
    assert all(local(s.manifest_list).exists() for s in table.metadata.snapshots)


def test_cli_dry_run_prints_what_would_be_expired_and_deleted_and_changes_nothing(catalog, service):
    import subprocess
    import sys

    table = catalog.create_table("m.dry", schema=SCHEMA, properties={expiry.MAX_SNAPSHOT_AGE_MS: "1"})
    appended(table, 3)
    table.overwrite(rows(50))
    snapshots = catalog.load_table("m.dry").metadata.snapshots
    out = subprocess.run([sys.executable, "-m", "api.cli", "table", "maintain", "m.dry", "--dry-run",
                          "--url", service], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # (pyiceberg's overwrite is two snapshots: a delete, then the append; min-snapshots-to-keep is 1)
    assert f"m.dry: would expire {len(snapshots) - 1} snapshot(s)" in out.stdout
    for s in snapshots[:-1]:
        assert f"  snapshot {s.snapshot_id}" in out.stdout and f"  {s.manifest_list}" in out.stdout
    assert ".parquet" in out.stdout   # the appends' data files: only the expired snapshots hold them
    assert [s.snapshot_id for s in catalog.load_table("m.dry").metadata.snapshots] == \
        [s.snapshot_id for s in snapshots]
    assert all(local(s.manifest_list).exists() for s in snapshots)
    missing = subprocess.run([sys.executable, "-m", "api.cli", "table", "maintain", "m.nope", "--dry-run",
                              "--url", service], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "does not exist" in missing.stderr.lower()
