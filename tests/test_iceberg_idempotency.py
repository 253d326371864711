"""Idempotency-Key on Iceberg's mutating routes (seed 000), over real HTTP."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest

from tests.support import uuid7

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


@pytest.fixture
def http(service):
    with httpx.Client(base_url=service, timeout=30) as client:
        assert client.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
        assert client.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
        yield client


def commit(http, key, updates, requirements=()):
    return http.post("/v1/namespaces/db/tables/t", headers={"Idempotency-Key": key},
                     json={"requirements": list(requirements),
                           "updates": [{"action": "set-properties", "updates": updates}]})


def test_config_advertises_key_lifetime(http):
    assert http.get("/v1/config").json()["idempotency-key-lifetime"] == "PT30M"


def test_key_must_be_uuidv7(http):
    for bad in ("not-a-uuid", str(uuid.uuid4())):
        r = commit(http, bad, {"a": "1"})
        assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestException"
    assert "a" not in http.get("/v1/namespaces/db/tables/t").json()["metadata"]["properties"]


def test_retried_commit_is_applied_once_and_replayed(http):
    key = uuid7()
    first = commit(http, key, {"n": "1"})
    again = commit(http, key, {"n": "1"})
    assert first.status_code == again.status_code == 200
    assert again.json()["metadata-location"] == first.json()["metadata-location"]
    assert again.json() == first.json()   # the same CommitTableResponse, not another shape
    meta = http.get("/v1/namespaces/db/tables/t").json()["metadata"]
    assert len(meta["metadata-log"]) == 1  # one new metadata file, not two


def test_conflict_is_finalized_and_replayed(http):
    key = uuid7()
    bad = [{"type": "assert-table-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}]
    assert commit(http, key, {"x": "1"}, bad).status_code == 409
    # The same key again (even with a body that would now succeed) replays the finalized 409.
    replay = commit(http, key, {"x": "1"})
    assert replay.status_code == 409 and replay.json()["error"]["type"] == "CommitFailedException"
    assert "x" not in http.get("/v1/namespaces/db/tables/t").json()["metadata"]["properties"]


def test_create_namespace_retry_replays_instead_of_409(http):
    key = uuid7()
    body = {"namespace": ["sales"], "properties": {"owner": "ana"}}
    first = http.post("/v1/namespaces", json=body, headers={"Idempotency-Key": key})
    again = http.post("/v1/namespaces", json=body, headers={"Idempotency-Key": key})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert http.post("/v1/namespaces", json=body).status_code == 409  # without the key it is a real conflict


def test_key_reused_for_another_operation_is_rejected(http):
    key = uuid7()
    assert http.post("/v1/namespaces", json={"namespace": ["x"]}, headers={"Idempotency-Key": key}).status_code == 200
    r = commit(http, key, {"y": "1"})
    assert r.status_code == 400
    assert "y" not in http.get("/v1/namespaces/db/tables/t").json()["metadata"]["properties"]


def test_concurrent_requests_with_one_key_apply_once(service, http):
    key = uuid7()
    results = []

    def send():
        with httpx.Client(base_url=service, timeout=30) as client:
            results.append(commit(client, key, {"c": "1"}))

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {r.status_code for r in results} == {200}
    assert len({r.json()["metadata-location"] for r in results}) == 1
    assert len(http.get("/v1/namespaces/db/tables/t").json()["metadata"]["metadata-log"]) == 1
