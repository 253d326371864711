"""api/direct.py serves each protocol's commit without Quart's request machinery: every answer, refusal, header,
log line and metric must be the one Quart's route gives. Each request here goes twice over real HTTP, once with
a Content-Length (served directly) and once with its body chunked (served by Quart), and the two answers are
compared."""

from __future__ import annotations

import json
import logging
import uuid

import httpx
import pytest

import api.direct
from api.server import EmbeddedService
from coordinator.keys import new_key
from tests.delta.conftest import FIRST, PREFIX as UC, first_commit, table_properties, write_log_file
from tests.lance.conftest import fake_manifest, stage
from tests.support import fetch_token, write_auth_file

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
# Differ between the two answers: when and which request, and what a commit made (a success commits twice).
PER_REQUEST = {"date", "x-request-id", "etag", "content-length"}


@pytest.fixture
def served(monkeypatch):
    """Counts the requests the direct routes took (before any went on to Quart)."""
    taken = []
    serve = api.direct.DirectRoutes.serve

    async def counted(self, *args):
        taken.append(args[1]["path"])
        return await serve(self, *args)
    monkeypatch.setattr(api.direct.DirectRoutes, "serve", counted)
    return taken


@pytest.fixture
def http(service, served):
    with httpx.Client(base_url=service, timeout=60) as client:
        yield client


def both(http, served, method: str, path: str, *, json_body=None, content: bytes | None = None, second=None,
         direct: bool = True, **kwargs) -> tuple[httpx.Response, ...]:
    """The request with its body as one, then chunked (which Quart serves; with the JSON body `second` if given);
    `direct`: whether the first went to a direct route."""
    data = content if content is not None else json.dumps(json_body).encode()
    before = len(served)
    first = http.request(method, path, content=data, **kwargs)
    assert len(served) == before + direct, f"{method} {path} was {'not ' if direct else ''}taken directly"
    second = http.request(method, path, content=iter([data if second is None else json.dumps(second).encode()]),
                          **kwargs)
    assert len(served) == before + direct, "a chunked request was taken directly"
    return first, second


def same(pair, body: bool = True) -> httpx.Response:
    direct, quart = pair
    assert direct.status_code == quart.status_code, (direct.text, quart.text)
    assert {k: v for k, v in direct.headers.items() if k not in PER_REQUEST} == \
        {k: v for k, v in quart.headers.items() if k not in PER_REQUEST}
    assert direct.headers["x-request-id"] != quart.headers["x-request-id"]
    if body:
        assert direct.json() == quart.json()
    return direct


def iceberg_commit(properties: dict, requirements=(), **more) -> dict:
    return {"requirements": list(requirements), "updates": [{"action": "set-properties", "updates": properties}],
            **more}


def test_iceberg_commits_and_refusals_are_quarts(http, served):
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    path = "/v1/namespaces/db/tables/t"
    ok = same(both(http, served, "POST", path, json_body=iceberg_commit({"a": "1"})), body=False)
    assert ok.status_code == 200 and ok.json()["metadata"]["properties"]["a"] == "1" and ok.headers["etag"]
    conflict = iceberg_commit({"b": "2"}, [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": 7}])
    assert same(both(http, served, "POST", path, json_body=conflict)).status_code == 409
    for body in (b"{", b'{"requirements": [], "requirements": [], "updates": []}', b'{"updates": []}',
                 b'{"requirements": [], "updates": [{"action": "no-such-action"}]}', b"[]"):
        assert same(both(http, served, "POST", path, content=body)).status_code == 400, body
    wrong_table = iceberg_commit({"c": "3"}, identifier={"namespace": ["db"], "name": "u"})
    assert same(both(http, served, "POST", path, json_body=wrong_table)).status_code == 400
    for other, status in (("/v1/namespaces/db/tables/none", 404), ("/v1/namespaces/nodb/tables/t", 404),
                          ("/v1/namespaces/db/tables/t%00", 400), ("/v1/nowarehouse/namespaces/db/tables/t", 404)):
        assert same(both(http, served, "POST", other, json_body=iceberg_commit({}))).status_code == status, other
    # What a writer reloads after a conflict (a streaming engine before each batch)
    loaded = same(both(http, served, "GET", path, content=b""))
    assert loaded.json()["metadata"]["properties"]["a"] == "1" and loaded.headers["etag"]
    refs = same(both(http, served, "GET", path, params={"snapshots": "refs"}, content=b""))
    assert refs.headers["etag"].endswith('-refs"')
    not_modified = same(both(http, served, "GET", path, content=b"", headers={"If-None-Match": loaded.headers["etag"]}),
                        body=False)
    assert not_modified.status_code == 304 and not not_modified.content
    assert same(both(http, served, "GET", path, params={"snapshots": "some"}, content=b"")).status_code == 400
    assert same(both(http, served, "GET", "/v1/namespaces/db/tables/none", content=b"")).status_code == 404
    # With an Idempotency-Key, Iceberg's idempotent route serves the commit.
    keyed = both(http, served, "POST", path, json_body=iceberg_commit({"d": "4"}),
                 headers={"Idempotency-Key": new_key()}, direct=False)
    assert same(keyed).status_code == 200   # the second is a replay of the first


def test_delta_commits_and_refusals_are_quarts(http, served, tmp_path):
    assert http.post(f"{UC}/catalogs", json={"name": "main"}).status_code == 200
    assert http.post(f"{UC}/schemas", json={"name": "s", "catalog_name": "main"}).status_code == 200
    staging = http.post(f"{UC}/staging-tables", json={"name": "t", "catalog_name": "main", "schema_name": "s"}).json()
    write_log_file(staging["staging_location"], FIRST, first_commit(staging["id"]))
    table = http.post(f"{UC}/tables", json={
        "name": "t", "catalog_name": "main", "schema_name": "s", "table_type": "MANAGED",
        "data_source_format": "DELTA", "storage_location": staging["staging_location"],
        "properties": table_properties(staging["id"])}).json()

    def commit(version: int, table_id: str = table["table_id"]) -> dict:
        return {"table_id": table_id, "table_uri": table["storage_location"],
                "commit_info": {"version": version, "timestamp": 1, "file_name": f"{version:020d}.{uuid.uuid4()}.json",
                                "file_size": 10, "file_modification_timestamp": 1}}
    assert same(both(http, served, "POST", f"{UC}/delta/preview/commits", json_body=commit(1), second=commit(2))
                ).json() == {}
    assert same(both(http, served, "POST", f"{UC}/delta/preview/commits", json_body=commit(2))).status_code == 409
    assert same(both(http, served, "POST", f"{UC}/delta/commit", json_body=commit(9))).status_code == 400
    assert same(both(http, served, "POST", f"{UC}/delta/preview/commits",
                     json_body=commit(3, str(uuid.uuid4())))).status_code == 404
    for body in (b"{}", b'{"table_id": "x", "table_uri": "y"}', b"not json"):
        assert same(both(http, served, "POST", f"{UC}/delta/preview/commits", content=body)).status_code == 400
    # what a Delta writer reads before it commits: the latest commits, asked in the body or in the query
    ident = {"table_id": table["table_id"], "table_uri": table["storage_location"]}
    latest = same(both(http, served, "GET", f"{UC}/delta/preview/commits", json_body={**ident, "start_version": 1}))
    assert latest.json()["latest_table_version"] == 2
    assert same(both(http, served, "GET", f"{UC}/delta/commits", params={**ident, "start_version": 2},
                     content=b"")).json()["latest_table_version"] == 2
    for params, body, status in (({"start_version": "x"}, ident, 400), ({"table_id": str(uuid.uuid4())}, ident, 400),
                                 ({}, {**ident, "table_id": str(uuid.uuid4())}, 404), ({}, {}, 400)):
        assert same(both(http, served, "GET", f"{UC}/delta/preview/commits", params=params, json_body=body)
                    ).status_code == status, (params, body)


def test_lance_versions_and_refusals_are_quarts(http, served):
    assert http.post("/v1/namespace/db/create", json={}).status_code == 200
    location = http.post("/v1/table/db$t/declare", json={}).json()["location"]

    def create(version: int, **more) -> dict:
        return {"version": version, "manifest_path": stage(location, version, fake_manifest()), **more}
    direct, quart = both(http, served, "POST", "/v1/table/db$t/version/create", json_body=create(1), second=create(2))
    assert same((direct, quart), body=False).json()["version"]["version"] == 1
    assert quart.json()["version"]["version"] == 2
    # pylance names the delimiter in every request; another delimiter spells the id another way
    for delimiter, ident, version in ((".", "db.t", 3), ("$", "db$t", 5)):
        assert same(both(http, served, "POST", f"/v1/table/{ident}/version/create", params={"delimiter": delimiter},
                         json_body=create(version), second=create(version + 1)), body=False).status_code == 200
    assert same(both(http, served, "POST", "/v1/table/db$t/version/create", params={"delimiter": ""},
                     json_body=create(7))).status_code == 400
    assert same(both(http, served, "POST", "/v1/table/db$t/version/create", json_body=create(2))).status_code == 409
    assert same(both(http, served, "POST", "/v1/table/db$t/version/create",
                     json_body=create(3, id=["db", "u"]))).status_code == 400
    assert same(both(http, served, "POST", "/v1/table/db$none/version/create", json_body=create(3))).status_code == 404
    assert same(both(http, served, "POST", "/v1/table/$/version/create", json_body=create(3))).status_code == 400
    assert same(both(http, served, "POST", "/v1/table/db%2Ft/version/create", json_body=create(3),
                     direct=False)).status_code == 400   # (no direct route: decoded, the path has another shape)
    assert same(both(http, served, "POST", "/v1/table/db$t/version/create",
                     json_body={"version": 7, "manifest_path": "nowhere"})).status_code == 400
    assert same(both(http, served, "POST", "/v1/table/db$t/version/create", content=b'{"version": "x"}')
                ).status_code == 400
    # what pylance reads for each commit: the latest version, a version's manifest
    latest = same(both(http, served, "POST", "/v1/table/db$t/version/list", params={"limit": 1, "descending": "true"},
                       json_body={"id": ["db", "t"]}))
    assert [v["version"] for v in latest.json()["versions"]] == [6]
    assert same(both(http, served, "GET", "/v1/table/db$t/version/list", content=b"")).status_code == 200
    for params in ({"limit": 0}, {"descending": "maybe"}, {"page_token": "x"}):
        assert same(both(http, served, "POST", "/v1/table/db$t/version/list", params=params,
                         json_body={})).status_code == 400, params
    assert same(both(http, served, "POST", "/v1/table/db$t/version/describe", json_body={"version": 2})
                ).json()["version"]["version"] == 2
    for body in ({"version": 99}, {"version": 1, "id": ["db", "u"]}, {"version": "x"}):
        assert same(both(http, served, "POST", "/v1/table/db$t/version/describe", json_body=body)
                    ).status_code in (400, 404), body
    assert same(both(http, served, "POST", "/v1/table/db$none/version/list", json_body={})).status_code == 404


def test_what_is_not_ordinary_goes_to_quart(http, served):
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    path = "/v1/namespaces/db/tables/t"
    chunked = http.post(path, content=iter([b'{"requirements": [], ', b'"updates": []}']))
    assert chunked.status_code == 200 and not served
    assert http.head(path).status_code == 204 and not served
    not_utf8 = http.post(path + "?x=%ff", json=iceberg_commit({"a": "1"}))
    assert not_utf8.status_code == 200 and not served
    assert http.post(path, json=iceberg_commit({"a": "1"})).status_code == 200 and served == [path]


def test_log_lines_and_metrics_are_quarts(http, served, caplog):
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    path = "/v1/namespaces/db/tables/t"
    caplog.set_level(logging.INFO, logger="coordinator.http")
    for body in (iceberg_commit({"a": "1"}), iceberg_commit({}, [{"type": "assert-table-uuid", "uuid": "x"}])):
        caplog.clear()
        both(http, served, "POST", path, json_body=body)
        lines = [{k: v for k, v in vars(r).items() if k in ("method", "path", "status", "error_type", "error",
                                                              "format", "table")}
                 for r in caplog.records if r.name == "coordinator.http"]
        assert len(lines) == 2 and lines[0] == lines[1], lines
    metrics = http.get("/metrics").text
    route = 'route="POST /v1/namespaces/<namespace>/tables/<table>"'
    assert f'coordinator_request_seconds_count{{protocol="iceberg",{route},status="2xx"}} 2.0' in metrics
    assert f'coordinator_request_seconds_count{{protocol="iceberg",{route},status="4xx"}} 2.0' in metrics


@pytest.fixture
def secured(config, tmp_path, served):
    config.auth_file = write_auth_file(tmp_path / "auth.toml", {
        "writer": ("writer-secret", [("*", ["read", "write", "create"])]),
        "reader": ("reader-secret", [("*", ["read"])])})
    with EmbeddedService(config) as base_url:
        yield base_url


def test_authentication_and_grants_are_quarts(secured, served):
    writer = {"Authorization": f"Bearer {fetch_token(secured, 'writer', 'writer-secret')}"}
    reader = {"Authorization": f"Bearer {fetch_token(secured, 'reader', 'reader-secret')}"}
    with httpx.Client(base_url=secured, timeout=60) as http:
        assert http.post("/v1/namespaces", json={"namespace": ["db"]}, headers=writer).status_code == 200
        assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA},
                         headers=writer).status_code == 200
        path = "/v1/namespaces/db/tables/t"
        unauthenticated = same(both(http, served, "POST", path, json_body=iceberg_commit({})))
        assert unauthenticated.status_code == 401 and unauthenticated.headers["www-authenticate"]
        bad = same(both(http, served, "POST", path, json_body=iceberg_commit({}),
                        headers={"Authorization": "Bearer x"}))
        assert bad.status_code == 401 and "invalid_token" in bad.headers["www-authenticate"]
        assert same(both(http, served, "POST", path, json_body=iceberg_commit({}), headers=reader)).status_code == 403
        assert same(both(http, served, "POST", path, json_body=iceberg_commit({"a": "1"}), headers=writer),
                    body=False).status_code == 200
        assert http.post("/v1/namespace/ln/create", json={}, headers=writer).status_code == 200
        location = http.post("/v1/table/ln$t/declare", json={}, headers=writer).json()["location"]
        forbidden = both(http, served, "POST", "/v1/table/ln$t/version/create", headers=reader,
                         json={"version": 1, "manifest_path": stage(location, 1, fake_manifest())})
        assert same(forbidden).status_code == 403
        # the x-api-key header of the Lance spec is a credential too
        api_key = {"x-api-key": writer["Authorization"].removeprefix("Bearer ")}
        created = http.post("/v1/table/ln$t/version/create", headers=api_key,
                            json={"version": 1, "manifest_path": stage(location, 1, fake_manifest())})
        assert created.status_code == 200, created.text


def test_the_hooks_the_direct_routes_stand_in_for(config):
    """The direct routes do what the app's and its blueprints' hooks do (api/direct.py, DirectRoutes._checked): the
    app's own are the two DirectRoutes stands in for, and every blueprint's is declared once for both paths
    (`before_request`), or this fails."""
    from api.app import create_app
    from api.direct import BEFORE
    from coordinator.service import Coordinator
    app = create_app(Coordinator(config))
    hooks = {attr: {bp: [f.__qualname__ for f in fns] for bp, fns in getattr(app, attr).items() if fns}
             for attr in ("before_request_funcs", "after_request_funcs", "teardown_request_funcs",
                          "url_value_preprocessors")}
    shared = ["before_request.<locals>.wrap.<locals>.hook"]
    assert set(BEFORE) == {"iceberg", "lance"}
    assert hooks == {"before_request_funcs": {None: ["create_app.<locals>._start"], "iceberg": shared,
                                              "lance": shared},
                     "after_request_funcs": {None: ["create_app.<locals>._finish"]},
                     "teardown_request_funcs": {}, "url_value_preprocessors": {}}
    assert sorted(app.direct.routes) == [
        "delta.commit", "delta.get_commits", "delta.v1_update_table", "iceberg.commit_table", "iceberg.commit_table_p", "iceberg.load_table",
        "iceberg.load_table_p", "lance.create_table_version", "lance.describe_table_version",
        "lance.list_table_versions", "uniform.load_table"]   # (the mount's loads `takes` refuses: Quart's)
