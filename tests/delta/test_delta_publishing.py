"""The service publishes ratified Delta commits itself (coordinator/maintenance/publisher.py; the catalog-managed
RFC, "Publishing Commits"): a writer that never publishes commits 1,000 versions without meeting the
unpublished-commit limit (429); every `_delta_log/<v>.json` is byte-identical to its ratified staged file, in
order; a different file already at `<v>.json` is left intact and nothing after it is published. Real HTTP, the
real PostgreSQL, the files on disk."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
import uuid

import httpx
import pytest

from tests.delta.conftest import commit_info, local_path

VERSIONS = int(os.environ.get("COORDINATOR_TEST_PUBLISH_VERSIONS", "1000"))


@pytest.fixture
def config(config, request):
    return dataclasses.replace(config, maintenance_publish_delta=getattr(request, "param", True))


def staged_commit(log, version: int) -> tuple[str, bytes]:
    name = f"{version:020d}.{uuid.uuid4()}.json"
    ict = 1704067400000 + version
    data = b"".join(json.dumps(a).encode() + b"\n" for a in (
        {"commitInfo": {"inCommitTimestamp": ict, "timestamp": ict, "operation": "WRITE", "isBlindAppend": True}},
        {"add": {"path": f"part-{version}.parquet", "partitionValues": {}, "size": 100, "modificationTime": ict,
                 "dataChange": True}}))
    (log / "_staged_commits").mkdir(parents=True, exist_ok=True)
    (log / "_staged_commits" / name).write_bytes(data)
    return name, data


def wait_for(check, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def metric(service: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", httpx.get(service + "/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def test_a_writer_that_never_publishes_commits_every_version_and_each_is_published_in_order(uc, service):
    table = uc.create_managed("stream")
    log = local_path(table["storage_location"]) / "_delta_log"
    staged = {}
    for v in range(1, VERSIONS + 1):
        name, staged[v] = staged_commit(log, v)
        r = uc.commit(table, v, file_name=name)
        assert r.status_code == 200, (v, r.status_code, r.text)   # never 429: the service publishes
    wait_for(lambda: uc.commits(table)["latest_table_version"] == VERSIONS and not uc.commits(table).get("commits"))
    for v, data in staged.items():
        assert (log / f"{v:020d}.json").read_bytes() == data
    # A reader of the published log sees every version, each the commit ratified as it.
    versions = sorted(int(p.name[:20]) for p in log.glob("*.json"))
    assert versions == list(range(VERSIONS + 1))
    adds = [json.loads((log / f"{v:020d}.json").read_text().splitlines()[1])["add"]["path"]
            for v in range(1, VERSIONS + 1)]
    assert adds == [f"part-{v}.parquet" for v in range(1, VERSIONS + 1)]
    assert metric(service, "coordinator_maintenance_publish_conflicts_total") == 0


def test_a_different_file_at_the_version_is_never_overwritten_and_nothing_after_it_is_published(uc, service):
    table = uc.create_managed("guarded")
    log = local_path(table["storage_location"]) / "_delta_log"
    foreign = b'{"commitInfo": {"not": "the ratified commit"}}\n'
    (log / "00000000000000000002.json").write_bytes(foreign)
    for v in range(1, 5):
        name, _ = staged_commit(log, v)
        assert uc.commit(table, v, file_name=name).status_code == 200
    wait_for(lambda: metric(service, "coordinator_maintenance_publish_conflicts_total") >= 1)
    wait_for(lambda: [c["version"] for c in uc.commits(table)["commits"]] == [2, 3, 4])
    assert (log / "00000000000000000001.json").exists()
    assert (log / "00000000000000000002.json").read_bytes() == foreign
    assert not (log / "00000000000000000003.json").exists() and not (log / "00000000000000000004.json").exists()


def create_with(uc, name: str, properties: dict) -> dict:
    from tests.delta.conftest import COLUMNS, FIRST, first_commit, table_properties, write_log_file
    uc.setup_schema()
    st = uc.staging(name)
    write_log_file(st["staging_location"], FIRST, first_commit(st["id"]))
    r = uc.post("/tables", json={"name": name, "catalog_name": "main", "schema_name": "default",
                                 "table_type": "MANAGED", "data_source_format": "DELTA", "columns": COLUMNS,
                                 "storage_location": st["staging_location"],
                                 "properties": {**table_properties(st["id"]), **properties}})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("config", [False], indirect=True)
def test_only_tables_that_opt_in_are_published_when_the_service_setting_is_off(uc):
    from coordinator.delta.publishing import ENABLED
    opted = create_with(uc, "opted", {ENABLED: "true"})
    plain = create_with(uc, "plain", {})
    for table in (opted, plain):
        log = local_path(table["storage_location"]) / "_delta_log"
        for v in range(1, 4):
            name, _ = staged_commit(log, v)
            assert uc.commit(table, v, file_name=name).status_code == 200
    wait_for(lambda: not uc.commits(opted).get("commits"))
    time.sleep(0.3)
    assert [c["version"] for c in uc.commits(plain)["commits"]] == [1, 2, 3]
    assert not (local_path(plain["storage_location"]) / "_delta_log" / "00000000000000000001.json").exists()
