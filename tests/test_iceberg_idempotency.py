"""Idempotency-Key on Iceberg's mutating routes (seed 000), over real HTTP."""

from __future__ import annotations

import threading
import uuid

import httpx
import pytest

from storage.files import to_local_path
from tests.support import iceberg_table_client, sql, uuid7

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


@pytest.fixture
def http(service):
    with iceberg_table_client(service, SCHEMA) as client:
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


def stored_record(config, key: str):
    return sql(config.database_url, "SELECT status, body, body_ref FROM idempotency_keys WHERE key=$1",
               uuid.UUID(key))[0]


def test_a_commit_answer_is_kept_as_its_metadata_file_not_copied_into_the_database(config, http):
    """A commit's answer is the table's whole metadata; the record names the metadata file it wrote instead."""
    key = uuid7()
    first = commit(http, key, {"n": "1"})
    assert first.status_code == 200 and first.headers["ETag"]
    record = stored_record(config, key)
    assert record["status"] == 200 and record["body"] is None
    assert record["body_ref"] == first.json()["metadata-location"]
    assert commit(http, key, {"n": "1"}).content == first.content


def test_create_is_replayed_with_the_same_load_result(config, http):
    key = uuid7()
    body = {"name": "made", "schema": SCHEMA}
    first = http.post("/v1/namespaces/db/tables", json=body, headers={"Idempotency-Key": key})
    again = http.post("/v1/namespaces/db/tables", json=body, headers={"Idempotency-Key": key})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json() and "config" in again.json()
    assert stored_record(config, key)["body"] is None


def test_a_replay_whose_metadata_file_is_gone_answers_with_the_current_state(config, http):
    """Old metadata files may be removed (write.metadata.delete-after-commit.enabled). The spec lets a replay
    reflect a newer state of the catalog: the answer is then the table as it is now, and nothing is applied."""
    key = uuid7()
    first = commit(http, key, {"n": "1"}).json()
    later = http.post("/v1/namespaces/db/tables/t", json={"requirements": [], "updates": [
        {"action": "set-properties", "updates": {"m": "2"}}]}).json()
    to_local_path(first["metadata-location"]).unlink()
    replay = commit(http, key, {"n": "1"})
    assert replay.status_code == 200
    assert replay.json()["metadata-location"] == later["metadata-location"]
    assert replay.json()["metadata"]["properties"]["m"] == "2" and "config" not in replay.json()
    assert len(http.get("/v1/namespaces/db/tables/t").json()["metadata"]["metadata-log"]) == 2


def test_key_reused_on_another_table_is_rejected_not_replayed(http):
    """The record is bound to its target: table A's answer is never given as table B's."""
    assert http.post("/v1/namespaces/db/tables", json={"name": "b", "schema": SCHEMA}).status_code == 200
    key = uuid7()
    first = commit(http, key, {"n": "1"})
    r = http.post("/v1/namespaces/db/tables/b", headers={"Idempotency-Key": key},
                  json={"requirements": [], "updates": [{"action": "set-properties", "updates": {"n": "1"}}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestException"
    assert "n" not in http.get("/v1/namespaces/db/tables/b").json()["metadata"]["properties"]
    assert commit(http, key, {"n": "1"}).content == first.content  # its own target still replays, byte for byte


def test_key_reused_to_create_another_object_is_rejected(http):
    for path, body, other in (("/v1/namespaces", {"namespace": ["n1"]}, {"namespace": ["n2"]}),
                              ("/v1/namespaces/db/tables", {"name": "a", "schema": SCHEMA},
                               {"name": "b", "schema": SCHEMA})):
        key = uuid7()
        first = http.post(path, json=body, headers={"Idempotency-Key": key})
        assert first.status_code == 200
        assert http.post(path, json=other, headers={"Idempotency-Key": key}).status_code == 400
        assert http.post(path, json=body, headers={"Idempotency-Key": key}).content == first.content
    assert http.get("/v1/namespaces/n2").status_code == 404
    assert http.get("/v1/namespaces/db/tables/b").status_code == 404


def test_key_reused_for_a_rename_or_transaction_of_other_tables_is_rejected(http):
    """Renames and multi-table commits name their tables in the body: the key is bound to those names too."""
    for name in ("a", "c", "e"):
        assert http.post("/v1/namespaces/db/tables", json={"name": name, "schema": SCHEMA}).status_code == 200
    key = uuid7()

    def rename(src: str, dst: str):
        return http.post("/v1/tables/rename", headers={"Idempotency-Key": key}, json={
            "source": {"namespace": ["db"], "name": src}, "destination": {"namespace": ["db"], "name": dst}})
    assert rename("a", "b").status_code == 204
    assert rename("c", "d").status_code == 400
    assert rename("a", "b").status_code == 204   # the same rename retried still replays
    assert http.get("/v1/namespaces/db/tables/c").status_code == 200

    key = uuid7()

    def change(name: str):
        return http.post("/v1/transactions/commit", headers={"Idempotency-Key": key}, json={"table-changes": [
            {"identifier": {"namespace": ["db"], "name": name}, "requirements": [],
             "updates": [{"action": "set-properties", "updates": {"k": name}}]}]})
    assert change("c").status_code == 204
    assert change("e").status_code == 400
    assert "k" not in http.get("/v1/namespaces/db/tables/e").json()["metadata"]["properties"]


def test_key_reused_under_another_prefix_is_rejected(http):
    key = uuid7()
    assert http.delete("/v1/namespaces/db/tables/t", headers={"Idempotency-Key": key}).status_code == 204
    assert http.delete("/v1/cat/namespaces/db/tables/t", headers={"Idempotency-Key": key}).status_code == 400
    assert http.delete("/v1/namespaces/db/tables/t", headers={"Idempotency-Key": key}).status_code == 204


def test_a_record_written_before_targets_were_bound_still_replays(config, http):
    """Older versions stored the operation alone in `route`; such a record replays as before."""
    key = uuid7()
    first = commit(http, key, {"n": "1"})
    sql(config.database_url, "UPDATE idempotency_keys SET route='commit-table' WHERE key=$1", uuid.UUID(key))
    assert commit(http, key, {"n": "1"}).content == first.content
    assert len(http.get("/v1/namespaces/db/tables/t").json()["metadata"]["metadata-log"]) == 1


def test_view_drop_and_rename_retries_replay(http):
    """A view's drop and rename were recorded under the table's operation names, so their retry was refused."""
    version = {"version-id": 1, "timestamp-ms": 1, "schema-id": 0, "summary": {}, "default-namespace": ["db"],
               "representations": [{"type": "sql", "sql": "select 1", "dialect": "spark"}]}
    assert http.post("/v1/namespaces/db/views", json={"name": "v", "schema": SCHEMA, "view-version": version,
                                                      "properties": {}}).status_code == 200
    key = uuid7()
    rename = {"source": {"namespace": ["db"], "name": "v"}, "destination": {"namespace": ["db"], "name": "w"}}
    for _ in range(2):
        assert http.post("/v1/views/rename", json=rename, headers={"Idempotency-Key": key}).status_code == 204
    key = uuid7()
    for _ in range(2):
        assert http.delete("/v1/namespaces/db/views/w", headers={"Idempotency-Key": key}).status_code == 204
    assert http.get("/v1/namespaces/db/views/w").status_code == 404


def test_an_error_is_recorded_as_what_it_is_and_replayed_in_icebergs_words(config, http):
    """The record holds the error itself (its class, message and status), not Iceberg's body: the replay raises
    it again and Iceberg's one error translation answers, as it did the first time."""
    key = uuid7()
    first = http.delete("/v1/namespaces/nowhere", headers={"Idempotency-Key": key})
    assert first.status_code == 404 and first.json()["error"]["type"] == "NoSuchNamespaceException"
    record = stored_record(config, key)
    assert record["status"] == 404 and record["body"].startswith(b'{"recorded-error":')
    assert b"NoSuchNamespace" in record["body"] and b"IcebergErrorResponse" not in record["body"]
    http.post("/v1/namespaces", json={"namespace": ["nowhere"]})
    replay = http.delete("/v1/namespaces/nowhere", headers={"Idempotency-Key": key})
    assert (replay.status_code, replay.content) == (404, first.content)   # finalized: not dropped now


def test_an_error_recorded_in_icebergs_words_by_older_versions_still_replays(config, http):
    key = uuid7()
    bad = [{"type": "assert-table-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}]
    assert commit(http, key, {"x": "1"}, bad).status_code == 409
    old = b'{"error":{"message":"Requirement failed: table uuid","type":"CommitFailedException","code":409}}'
    sql(config.database_url, "UPDATE idempotency_keys SET body=$2 WHERE key=$1", uuid.UUID(key), old)
    replay = commit(http, key, {"x": "1"})
    assert (replay.status_code, replay.content) == (409, old)
