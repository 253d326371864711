"""Multi-table atomic commits (`transactions/commit`) and load caching, over real HTTP."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.support import sql

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


@pytest.fixture
def http(service):
    with httpx.Client(base_url=service, timeout=30) as client:
        assert client.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
        for t in ("a", "b", "c"):
            r = client.post("/v1/namespaces/db/tables", json={"name": t, "schema": SCHEMA})
            assert r.status_code == 200, r.text
        yield client


def props(http, table):
    return http.get(f"/v1/namespaces/db/tables/{table}").json()["metadata"]["properties"]


def change(table, updates, requirements=()):
    return {"identifier": {"namespace": ["db"], "name": table}, "requirements": list(requirements),
            "updates": [{"action": "set-properties", "updates": updates}]}


def test_transaction_applies_to_every_table(http):
    r = http.post("/v1/transactions/commit", json={"table-changes": [change("a", {"x": "1"}), change("b", {"x": "2"})]})
    assert r.status_code == 204, r.text
    assert props(http, "a")["x"] == "1" and props(http, "b")["x"] == "2"


def test_failed_requirement_in_last_table_leaves_every_table_unchanged(http):
    before = {t: http.get(f"/v1/namespaces/db/tables/{t}").json()["metadata-location"] for t in "abc"}
    bad = {"type": "assert-table-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}
    r = http.post("/v1/transactions/commit", json={"table-changes": [
        change("a", {"y": "1"}), change("b", {"y": "1"}), change("c", {"y": "1"}, [bad])]})
    assert r.status_code == 409
    assert r.json()["error"]["type"] == "CommitFailedException"
    after = {t: http.get(f"/v1/namespaces/db/tables/{t}").json()["metadata-location"] for t in "abc"}
    assert after == before


def test_unknown_table_is_404_and_changes_nothing(http):
    r = http.post("/v1/transactions/commit", json={"table-changes": [change("a", {"z": "1"}), change("nope", {})]})
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "NoSuchTableException"
    assert "z" not in props(http, "a")


def test_bad_transaction_bodies_are_400(http):
    assert http.post("/v1/transactions/commit", json={"table-changes": []}).status_code == 400
    no_ident = {"requirements": [], "updates": []}
    assert http.post("/v1/transactions/commit", json={"table-changes": [no_ident]}).status_code == 400
    twice = {"table-changes": [change("a", {"q": "1"}), change("a", {"q": "2"})]}
    assert http.post("/v1/transactions/commit", json=twice).status_code == 400
    assert "q" not in props(http, "a")


# -- requirements before updates (Java CatalogHandlers) ------------------------------------------------------

ASSERT_CREATE = {"type": "assert-create"}
WRONG_UUID = {"type": "assert-table-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}


def locations(http):
    return {t: http.get(f"/v1/namespaces/db/tables/{t}").json()["metadata-location"] for t in "abc"}


def assert_commit_failed(r: httpx.Response, says: str) -> None:
    assert r.status_code == 409, r.text
    assert r.json()["error"]["type"] == "CommitFailedException" and r.json()["error"]["code"] == 409
    assert says in r.json()["error"]["message"], r.text


def test_assert_create_on_an_existing_table_fails_as_a_requirement(http):
    """Not 400 over the metadata its (here: no) updates would leave incomplete: the requirement is checked
    first, on the table as it is."""
    before = locations(http)
    r = http.post("/v1/namespaces/db/tables/a", json={"requirements": [ASSERT_CREATE], "updates": []})
    assert_commit_failed(r, "table already exists")
    for changes in ([{**change("a", {}), "requirements": [ASSERT_CREATE], "updates": []}],
                    [change("b", {"x": "1"}), {**change("a", {}), "requirements": [ASSERT_CREATE], "updates": []}]):
        assert_commit_failed(http.post("/v1/transactions/commit", json={"table-changes": changes}),
                             "table already exists")
    assert locations(http) == before and "x" not in props(http, "b")


def test_a_failed_requirement_comes_before_a_refused_relocation(http):
    before = locations(http)
    taken = http.get("/v1/namespaces/db/tables/b").json()["metadata"]["location"]
    r = http.post("/v1/namespaces/db/tables/a", json={"requirements": [WRONG_UUID], "updates": [
        {"action": "set-location", "location": taken}]})
    assert_commit_failed(r, "UUID does not match")
    assert locations(http) == before


def test_a_failed_requirement_comes_before_another_tables_invalid_update(http):
    """Whichever table the transaction's parts are validated in first (table-id order), the failed requirement
    is the answer: the client refreshes and retries."""
    before = locations(http)
    bad_update = {"action": "set-current-schema", "schema-id": 42}
    for good, bad in (("a", "b"), ("b", "a")):
        r = http.post("/v1/transactions/commit", json={"table-changes": [
            {**change(good, {}), "updates": [bad_update]}, change(bad, {"y": "1"}, [WRONG_UUID])]})
        assert_commit_failed(r, "UUID does not match")
    assert locations(http) == before


def test_transactions_racing_single_commits_never_lose_a_table(service, http):
    """Iceberg's reference handlers commit one table after another and lose the second table's change under
    this race; every acknowledged transaction here must have changed every table it named."""
    acked_tx, acked_single, errors = [], [], []
    lock = threading.Lock()

    def tx_client(c: int) -> None:
        with httpx.Client(base_url=service, timeout=30) as client:
            for i in range(15):
                key = f"tx{c}-{i}"
                r = client.post("/v1/transactions/commit", json={"table-changes": [
                    change("a", {key: "1"}), change("b", {key: "1"})]})
                if r.status_code == 204:
                    with lock:
                        acked_tx.append(key)
                elif r.status_code != 503:
                    errors.append((r.status_code, r.text))

    def single_client(c: int) -> None:
        with httpx.Client(base_url=service, timeout=30) as client:
            for i in range(20):
                key, table = f"s{c}-{i}", "ab"[i % 2]
                r = client.post(f"/v1/namespaces/db/tables/{table}", json={
                    "requirements": [], "updates": [{"action": "set-properties", "updates": {key: table}}]})
                if r.status_code == 200:
                    with lock:
                        acked_single.append((key, table))
                elif r.status_code != 503:
                    errors.append((r.status_code, r.text))

    threads = [threading.Thread(target=tx_client, args=(c,)) for c in range(3)]
    threads += [threading.Thread(target=single_client, args=(c,)) for c in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    a, b = props(http, "a"), props(http, "b")
    lost = [k for k in acked_tx if k not in a or k not in b]
    assert not lost, f"{len(lost)} of {len(acked_tx)} acknowledged transactions lost a table's change"
    assert all(key in (a if table == "a" else b) for key, table in acked_single)
    assert len(acked_tx) == 45 and len(acked_single) == 60


def test_etag_and_if_none_match(http):
    r = http.get("/v1/namespaces/db/tables/a")
    etag = r.headers["ETag"]
    assert http.get("/v1/namespaces/db/tables/a", headers={"If-None-Match": etag}).status_code == 304
    refs = http.get("/v1/namespaces/db/tables/a", params={"snapshots": "refs"})
    assert refs.status_code == 200 and refs.headers["ETag"] != etag
    commit = http.post("/v1/namespaces/db/tables/a", json={"requirements": [], "updates": [
        {"action": "set-properties", "updates": {"e": "1"}}]})
    assert commit.status_code == 200 and commit.headers["ETag"] != etag
    again = http.get("/v1/namespaces/db/tables/a", headers={"If-None-Match": etag})
    assert again.status_code == 200 and again.headers["ETag"] == commit.headers["ETag"]
    # RFC 9110: `*` matches whatever representation exists; a missing table is still 404.
    star = http.get("/v1/namespaces/db/tables/a", headers={"If-None-Match": "*"})
    assert star.status_code == 304 and star.headers["ETag"] == commit.headers["ETag"]
    assert http.get("/v1/namespaces/db/tables/nope", headers={"If-None-Match": "*"}).status_code == 404


def test_large_metadata_goes_out_whole_with_its_length(http):
    """A large metadata (300 KB of properties) comes back whole: one plain body of the announced length, not
    chunked, equal to the metadata file, in the commit response and in loadTable."""
    from urllib.parse import urlparse

    big = "x" * 300_000
    commit = http.post("/v1/namespaces/db/tables/a", json={"requirements": [], "updates": [
        {"action": "set-properties", "updates": {"big": big}}]})
    loaded = http.get("/v1/namespaces/db/tables/a")
    for r in (commit, loaded):
        assert r.status_code == 200, r.text
        assert "transfer-encoding" not in r.headers
        assert int(r.headers["content-length"]) == len(r.content) > 300_000
        assert r.headers["content-type"] == "application/json"
    body = commit.json()
    assert set(body) == {"metadata-location", "metadata"} and body["metadata"]["properties"]["big"] == big
    assert loaded.json()["metadata"] == body["metadata"] and loaded.json()["config"] == {}
    with open(urlparse(body["metadata-location"]).path, "rb") as f:
        assert json.loads(f.read()) == body["metadata"]


def test_metrics_report_is_stored_and_credentials_are_empty_for_local_tables(http, database_url):
    report = {"report-type": "commit-report", "table-name": "db.a", "snapshot-id": 1, "sequence-number": 1,
              "operation": "append", "metrics": {"total-duration": {"count": 1, "time-unit": "nanoseconds",
                                                                    "total-duration": 1200}},
              "metadata": {"engine": "tests"}}
    assert http.post("/v1/namespaces/db/tables/a/metrics", json=report).status_code == 204
    assert http.post("/v1/namespaces/db/tables/a/metrics", json={"report-type": "nope"}).status_code == 400
    assert http.post("/v1/namespaces/db/tables/zz/metrics", json=report).status_code == 404
    table_id = http.get("/v1/namespaces/db/tables/a").json()["metadata"]["table-uuid"]
    stored = sql(database_url, "SELECT table_id, report_type, report FROM iceberg_metric_reports")
    assert [(str(r["table_id"]), r["report_type"], json.loads(r["report"])) for r in stored] == \
        [(table_id, "commit-report", report)]   # the one report of the known table, as it was sent
    r = http.get("/v1/namespaces/db/tables/a/credentials")
    assert r.status_code == 200 and r.json() == {"storage-credentials": []}


def test_delete_after_commit_removes_metadata_files_that_fell_off_the_log(http):
    from storage.files import to_local_path
    props = {"write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "2"}
    r = http.post("/v1/namespaces/db/tables", json={"name": "d", "schema": SCHEMA, "properties": props})
    locations = [r.json()["metadata-location"]]
    for i in range(4):
        r = http.post("/v1/namespaces/db/tables/d", json={"requirements": [], "updates": [
            {"action": "set-properties", "updates": {"i": str(i)}}]})
        locations.append(r.json()["metadata-location"])
    meta = http.get("/v1/namespaces/db/tables/d").json()["metadata"]
    assert [e["metadata-file"] for e in meta["metadata-log"]] == locations[2:4]
    import time
    deadline = time.monotonic() + 5  # deletion is best-effort clean-up after the commit is durable
    while True:
        exists = [to_local_path(loc).exists() for loc in locations]
        if exists == [False, False, True, True, True] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert exists == [False, False, True, True, True]
