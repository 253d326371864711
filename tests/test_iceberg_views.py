"""Iceberg views: list, create, load, replace (view updates, assert-view-uuid), drop, exists, rename."""

from __future__ import annotations

import time

import httpx
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField
from pyiceberg.view.metadata import SQLViewRepresentation, ViewVersion

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


def version(sql: str, schema_id: int = 0) -> dict:
    return {"version-id": 1, "timestamp-ms": int(time.time() * 1000), "schema-id": schema_id,
            "summary": {"engine-name": "test"}, "default-namespace": ["db"],
            "representations": [{"type": "sql", "sql": sql, "dialect": "spark"}]}


@pytest.fixture
def http(service):
    with httpx.Client(base_url=service, timeout=30) as client:
        assert client.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
        yield client


def create(http, name="v", sql="select 1 as id"):
    return http.post("/v1/namespaces/db/views", json={"name": name, "schema": SCHEMA,
                                                      "view-version": version(sql), "properties": {"k": "v"}})


def test_create_load_list_and_exists(http):
    r = create(http)
    assert r.status_code == 200, r.text
    meta = r.json()["metadata"]
    assert meta["current-version-id"] == 1 and meta["format-version"] == 1
    assert meta["version-log"][0]["version-id"] == 1
    assert r.json()["metadata-location"].endswith(".metadata.json")
    assert create(http).status_code == 409
    assert http.get("/v1/namespaces/db/views/v").json()["metadata"]["view-uuid"] == meta["view-uuid"]
    assert http.head("/v1/namespaces/db/views/v").status_code == 204
    assert http.head("/v1/namespaces/db/views/nope").status_code == 404
    assert http.get("/v1/namespaces/db/views").json()["identifiers"] == [{"namespace": ["db"], "name": "v"}]
    # A view is not a table, and a table cannot take a view's name.
    r = http.get("/v1/namespaces/db/tables/v")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NoSuchTableException"
    assert http.post("/v1/namespaces/db/tables", json={"name": "v", "schema": SCHEMA}).status_code == 409


def test_a_create_transaction_on_a_views_name_says_a_view_has_it(http):
    create(http)
    r = http.post("/v1/namespaces/db/tables/v", json={"requirements": [{"type": "assert-create"}], "updates": []})
    assert r.status_code == 409 and r.json()["error"]["type"] == "AlreadyExistsException", r.text
    assert "View with same name already exists" in r.json()["error"]["message"]
    assert http.get("/v1/namespaces/db/views/v").json()["metadata"]["current-version-id"] == 1
    assert http.get("/v1/namespaces/db/tables").json()["identifiers"] == []


def test_a_name_taken_by_the_other_kind_says_which_kind_has_it(http):
    """Java's words: a view refused for a table's name is told "Table with same name already exists"."""
    create(http)
    assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    refusals = {"Table with same name already exists: db.t": [create(http, name="t"), http.post(
                    "/v1/views/rename", json={"source": {"namespace": ["db"], "name": "v"},
                                              "destination": {"namespace": ["db"], "name": "t"}})],
                "View with same name already exists: db.v": [http.post(
                    "/v1/namespaces/db/tables", json={"name": "v", "schema": SCHEMA}), http.post(
                    "/v1/tables/rename", json={"source": {"namespace": ["db"], "name": "t"},
                                               "destination": {"namespace": ["db"], "name": "v"}})],
                "View already exists: db.v": [create(http)]}
    for message, answers in refusals.items():
        for r in answers:
            assert r.status_code == 409 and r.json()["error"] == {
                "message": message, "type": "AlreadyExistsException", "code": 409}, r.text
    assert http.get("/v1/namespaces/db/views").json()["identifiers"] == [{"namespace": ["db"], "name": "v"}]
    assert http.get("/v1/namespaces/db/tables").json()["identifiers"] == [{"namespace": ["db"], "name": "t"}]
    assert http.get("/v1/namespaces/db/views/v").json()["metadata"]["current-version-id"] == 1


def test_head_answers_carry_no_content_type(http):
    """A 204 has no body, so no type for one (Quart's default text/html was sent)."""
    create(http)
    assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    for path in ("/v1/namespaces/db", "/v1/namespaces/db/tables/t", "/v1/namespaces/db/views/v"):
        r = http.head(path)
        assert r.status_code == 204 and "content-type" not in r.headers and r.content == b"", (path, r.headers)
    r = http.delete("/v1/namespaces/db/views/v")
    assert r.status_code == 204 and "content-type" not in r.headers


def test_replace_adds_version_and_reuses_identical_ones(http):
    view_uuid = create(http).json()["metadata"]["view-uuid"]

    def replace(sql, requirements=None):
        return http.post("/v1/namespaces/db/views/v", json={
            "requirements": requirements or [{"type": "assert-view-uuid", "uuid": view_uuid}],
            "updates": [{"action": "add-schema", "schema": SCHEMA},
                        {"action": "add-view-version", "view-version": version(sql, -1)},
                        {"action": "set-current-view-version", "view-version-id": -1}]})

    r = replace("select 2 as id")
    assert r.status_code == 200, r.text
    meta = r.json()["metadata"]
    assert meta["current-version-id"] == 2 and len(meta["versions"]) == 2 and len(meta["schemas"]) == 1
    # Back to the first query: the identical version 1 is reused, not added again.
    meta = replace("select 1 as id").json()["metadata"]
    assert meta["current-version-id"] == 1 and len(meta["versions"]) == 2
    assert [e["version-id"] for e in meta["version-log"]] == [1, 2, 1]

    wrong = replace("select 3", [{"type": "assert-view-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}])
    assert wrong.status_code == 409 and wrong.json()["error"]["type"] == "CommitFailedException"
    bad = http.post("/v1/namespaces/db/views/v", json={"updates": [{"action": "set-current-view-version",
                                                                     "view-version-id": 99}]})
    assert bad.status_code == 400
    unknown = http.post("/v1/namespaces/db/views/v", json={"updates": [{"action": "add-snapshot", "snapshot": {}}]})
    assert unknown.status_code == 400
    assert http.get("/v1/namespaces/db/views/v").json()["metadata"]["current-version-id"] == 1


def test_version_history_is_trimmed(http):
    r = http.post("/v1/namespaces/db/views", json={"name": "h", "schema": SCHEMA, "view-version": version("q0"),
                                                   "properties": {"version.history.num-entries": "2"}})
    assert r.status_code == 200
    for i in range(1, 4):
        r = http.post("/v1/namespaces/db/views/h", json={"updates": [
            {"action": "add-view-version", "view-version": version(f"q{i}")},
            {"action": "set-current-view-version", "view-version-id": -1}]})
        assert r.status_code == 200, r.text
    meta = r.json()["metadata"]
    assert [v["version-id"] for v in meta["versions"]] == [3, 4]
    assert meta["current-version-id"] == 4


def test_rename_and_drop(http):
    create(http)
    r = http.post("/v1/views/rename", json={"source": {"namespace": ["db"], "name": "v"},
                                            "destination": {"namespace": ["db"], "name": "w"}})
    assert r.status_code == 204
    assert http.get("/v1/namespaces/db/views/v").status_code == 404
    assert http.get("/v1/namespaces/db/views/w").status_code == 200
    assert http.delete("/v1/namespaces/db/views/w").status_code == 204
    r = http.delete("/v1/namespaces/db/views/w")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NoSuchViewException"


def test_pyiceberg_view_api(service, http):
    catalog = load_catalog("coord", type="rest", uri=service)
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    vv = ViewVersion(version_id=1, schema_id=0, timestamp_ms=int(time.time() * 1000), summary={},
                     representations=[SQLViewRepresentation(type="sql", sql="select 1", dialect="spark")],
                     default_namespace=["db"])
    view = catalog.create_view(("db", "pv"), schema=schema, view_version=vv)
    assert view.metadata.current_version_id == 1
    assert catalog.view_exists(("db", "pv"))
    assert ("db", "pv") in catalog.list_views("db")
    catalog.drop_view(("db", "pv"))
    assert not catalog.view_exists(("db", "pv"))
