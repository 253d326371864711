"""Atomic commits across formats (`POST /api/coordinator/v1/commit`, coordinator/client.py): every part applies or
none does, read back through each protocol's own API and clients (pyiceberg, Unity Catalog's GET commits, Lance's
version/list)."""

from __future__ import annotations

import threading
from collections import Counter
import time

import httpx
import pytest

from coordinator.client import CommitRefused, commit, delta_part, iceberg_part, lance_part
from coordinator.keys import new_key
from tests.delta.conftest import UC, commit_info
from tests.lance.conftest import local, stage
from tests.test_auth import auth_config, secured, tokens  # noqa: F401 - fixtures: the service with grants
from tests.test_chaos import (TABLES, ClientLog, CrossFormatWriter, check, read_state, set_up, single_format_writers)

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


@pytest.fixture
def tables(service):
    """One table of each format: Iceberg xf.events, Delta main.default.orders, Lance xf$vectors."""
    with httpx.Client(base_url=service, timeout=30) as http:
        assert http.post("/v1/namespaces", json={"namespace": ["xf"]}).status_code == 200
        r = http.post("/v1/namespaces/xf/tables", json={"name": "events", "schema": SCHEMA})
        assert r.status_code == 200, r.text
        assert http.post("/v1/namespace/xf/create", json={}).status_code == 200
        r = http.post("/v1/table/xf$vectors/declare", json={})
        assert r.status_code == 200, r.text
        lance_location = r.json()["location"]
    uc = UC(service)
    try:
        orders = uc.create_managed("orders")
    finally:
        uc.http.close()
    return {"delta": orders, "lance": lance_location}


def snapshot_change(parent: int | None, snapshot_id: int, sequence: int, location: str = "/tmp/x") -> dict:
    snapshot = {"snapshot-id": snapshot_id, "sequence-number": sequence, "timestamp-ms": int(time.time() * 1000),
                "manifest-list": f"{location}/metadata/snap-{snapshot_id}.avro", "summary": {"operation": "append"},
                "schema-id": 0}
    if parent is not None:
        snapshot["parent-snapshot-id"] = parent
    return {"requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": parent}],
            "updates": [{"action": "add-snapshot", "snapshot": snapshot},
                        {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch",
                         "snapshot-id": snapshot_id}]}


def parts(tables: dict, *, iceberg_parent: int | None = None, delta_version: int = 1, lance_version: int = 1):
    orders = tables["delta"]
    staged = stage(tables["lance"], lance_version)
    return [iceberg_part(["xf"], "events", **snapshot_change(iceberg_parent, 1001, 1)),
            delta_part({"table_id": orders["table_id"], "table_uri": orders["storage_location"],
                        "commit_info": commit_info(delta_version)}),
            lance_part(["xf", "vectors"], {"version": lance_version, "manifest_path": staged})], staged


def read_back(service: str, tables: dict) -> tuple[list[int], int, list[int]]:
    """What each protocol's own API shows: Iceberg's snapshot ids (pyiceberg), Delta's latest version (UC GET
    commits), Lance's versions (version/list)."""
    from pyiceberg.catalog import load_catalog
    snapshots = [s.snapshot_id for s in load_catalog("c", type="rest", uri=service).load_table("xf.events")
                 .metadata.snapshots]
    uc = UC(service)
    try:
        delta_latest = uc.commits(tables["delta"])["latest_table_version"]
    finally:
        uc.http.close()
    with httpx.Client(base_url=service, timeout=30) as http:
        r = http.post("/v1/table/xf$vectors/version/list", json={})
        assert r.status_code == 200, r.text
        lance_versions = sorted(v["version"] for v in r.json()["versions"])
    return snapshots, delta_latest, lance_versions


def test_every_part_applies_and_each_protocol_reads_it_back(service, tables):
    body, _ = parts(tables)
    results = commit(service, body)
    assert results[0]["metadata-location"].endswith(".metadata.json")
    assert results[1] == {}
    assert results[2]["version"] == 1
    assert read_back(service, tables) == ([1001], 1, [1])


@pytest.mark.parametrize("refused", [0, 1, 2])
def test_one_conflicting_part_applies_nothing(service, tables, refused):
    # The table the refused part names moves on first, on its own: the part's expectation no longer holds.
    ahead, _ = parts(tables)
    commit(service, [ahead[refused]])
    before = read_back(service, tables)
    body, staged = parts(tables)    # every part expects its table as created: only the refused one is not
    with pytest.raises(CommitRefused) as refusal:
        commit(service, body)
    error = refusal.value
    assert (error.status, error.part, error.applied) == (409, refused, False), error.error
    assert error.type == ["CommitFailedException", "ALREADY_EXISTS", 14][refused], error.error
    assert error.error["message"].startswith(f"part {refused} ({['iceberg', 'delta', 'lance'][refused]} ")
    assert read_back(service, tables) == before, "a refused commit changed a table"
    assert local(staged).exists(), "the refused commit's staged Lance manifest was taken"


def test_a_retry_with_the_same_idempotency_key_is_answered_as_the_first(service, tables):
    body, _ = parts(tables)
    key = new_key()
    first = commit(service, body, idempotency_key=key)
    assert commit(service, body, idempotency_key=key) == first
    assert read_back(service, tables) == ([1001], 1, [1])


def test_bad_parts_are_refused_before_anything_is_read(service, tables):
    with httpx.Client(base_url=service, timeout=30) as http:
        for body, part in [({"parts": []}, None), ({"parts": [{"format": "hudi"}]}, 0),
                           ({"parts": [{"format": "lance", "version": 1}]}, 0)]:
            r = http.post("/api/coordinator/v1/commit", json=body)
            assert r.status_code == 400, r.text
            assert r.json()["error"].get("part") == part, r.text
    assert read_back(service, tables) == ([], 0, [])


def test_cross_format_commits_racing_single_format_commits_lose_nothing(service, database_url):
    """The chaos test's writers without the kills, as long as it takes for a few cross-format commits to win their
    races: on each table a cross-format writer and one writer per format (pausing between commits, or the
    cross-format writer, which must win on three tables at once, would rarely win). Then every acknowledged
    commit is at its version in every format, and no cross-format commit is in some formats only."""
    tables = set_up(service)
    log, stop, give_up = ClientLog(), threading.Event(), threading.Event()
    writers = []
    for t in TABLES:
        writers += single_format_writers(service, t, log, stop, give_up, tables, patient=True, pause_s=0.2)
        writers.append(CrossFormatWriter(service, t, log, stop, give_up, patient=True, tables=tables))
    threads = [threading.Thread(target=w.run, daemon=True) for w in writers]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sum(o.across and o.status == "acked" for o in log.outcomes) < 3 * 5:
        time.sleep(0.2)
    stop.set()
    for th in threads:
        th.join(30)
    give_up.set()
    figures = check(log.outcomes, read_state(service, database_url, tables))
    assert figures.clean, figures.problems()
    across = Counter(o.status for o in log.outcomes if o.across)
    assert across["acked"] >= 3 * 5, f"too few cross-format commits won their races: {across}, errors {log.errors}"
    assert across["rejected"], "no cross-format commit lost a race: nothing raced"


def test_each_part_needs_the_grants_its_own_protocols_commit_needs(secured, tokens):
    """`updater` may write Iceberg's db tables but only create in Lance's db: a commit with a part for each is
    refused whole (403, nothing applied); `writer`, who may write both, commits it."""
    admin = {"Authorization": f"Bearer {tokens['admin']}"}
    with httpx.Client(base_url=secured, timeout=30, headers=admin) as http:
        assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
        assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
        assert http.post("/v1/namespace/db/create", json={}).status_code == 200
        location = http.post("/v1/table/db$t/declare", json={}).json()["location"]
    body = [iceberg_part(["db"], "t", **snapshot_change(None, 7, 1)),
            lance_part(["db", "t"], {"version": 1, "manifest_path": stage(location, 1)})]
    with pytest.raises(CommitRefused) as refusal:
        commit(secured, body, token=tokens["updater"])
    assert (refusal.value.status, refusal.value.type) == (403, "Forbidden"), refusal.value.error
    with httpx.Client(base_url=secured, timeout=30, headers=admin) as http:
        assert http.get("/v1/namespaces/db/tables/t").json()["metadata"].get("current-snapshot-id") in (None, -1)
    results = commit(secured, body, token=tokens["writer"])
    assert results[1]["version"] == 1
