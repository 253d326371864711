"""Hostile and broken input (issue 7): names and locations cannot place files outside the configured roots, and
oversized, deeply nested, malformed or slow requests get a clear error in the protocol's own format.

"Names and locations: a table name or user-given `location` can never place files outside the configured roots
(`..`, absolute paths, other schemes, URL-encoding tricks). Body size limit, JSON depth limit, request timeouts
(slowloris) configured on hypercorn." Every refusal must change nothing: no table, no file, anywhere.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from pathlib import Path

import httpx
import pytest

from api.app import MAX_BODY_BYTES
from coordinator.delta.service import MANAGED_DIR

from .delta.conftest import COLUMNS, FIRST, first_commit, table_properties, write_log_file
from .lance.conftest import stage

UC = "/api/2.1/unity-catalog"
SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


@pytest.fixture
def http(service):
    with httpx.Client(base_url=service, timeout=60) as client:
        yield client


@pytest.fixture
def warehouse(config) -> str:
    return config.warehouse_uri


def hostile_locations(warehouse: str, outside: Path) -> list[str]:
    """Locations that name (or that some reader resolves to) a place outside `warehouse`; `outside` is a directory
    next to the warehouse that must stay empty."""
    bare = warehouse.removeprefix("file://")
    return [
        f"{warehouse}/../{outside.name}",                   # `..`
        f"{warehouse}/t/../../{outside.name}",
        f"{bare}/../{outside.name}",                        # `..` in a bare path
        f"{warehouse}/%2e%2e/{outside.name}",               # URL-encoding tricks
        f"{warehouse}/%2E%2E/{outside.name}",
        f"{warehouse}/t%2f..%2f..%2f{outside.name}",
        f"{warehouse}/%252e%252e/../../{outside.name}",
        f"{warehouse}/t\\..\\..\\{outside.name}",           # backslashes: `/` to WHATWG URL parsers
        f"{warehouse}/.\t./{outside.name}",                 # URL parsers drop tabs: `..`
        f"{warehouse}/t?/../../{outside.name}",             # a query or fragment cuts the path short
        f"{warehouse}/t#/../../{outside.name}",
        f"{warehouse}/t%00",                                # NUL
        str(outside),                                       # absolute paths elsewhere
        outside.as_uri(),
        "file:///etc/coordinator-test",
        "file:/etc/coordinator-test",
        "s3://bucket/warehouse/t",                          # other schemes
        "http://example.com/t",
        "gs://bucket/t",
        "relative/t",                                       # relative paths
        "",
    ]


def quote_all(name: str) -> str:
    """Percent-encode every byte but letters and digits: HTTP clients drop `.` and `..` path segments."""
    return "".join(chr(b) if chr(b).isalnum() else f"%{b:02X}" for b in name.encode())


def assert_nothing_outside(outside: Path) -> None:
    assert not outside.exists() or not any(outside.iterdir()), sorted(outside.rglob("*"))
    assert not Path("/etc/coordinator-test").exists()


def iceberg_error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(r.json()) == {"error"} and err["code"] == status and err["type"] and err["message"], r.text
    return err


def lance_error(r: httpx.Response, status: int = 400, code: int = 13) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == code and body["error"] and body["detail"] and body["instance"], body
    return body


def uc_error(r: httpx.Response, status: int = 400, code: str = "INVALID_PARAMETER_VALUE") -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["error_code"] == code and body["message"], body
    return body


# -- Iceberg -------------------------------------------------------------------------------------------------------


def _view_version() -> dict:
    return {"version-id": 1, "timestamp-ms": int(time.time() * 1000), "schema-id": 0, "summary": {},
            "default-namespace": ["db"], "representations": [{"type": "sql", "sql": "select 1", "dialect": "spark"}]}


def test_iceberg_create_table_and_view_refuse_locations_outside_the_warehouse(http, warehouse, tmp_path):
    outside = tmp_path / "outside"
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    for i, location in enumerate(hostile_locations(warehouse, outside)):
        if not location:
            continue  # an empty location means "the default" to Iceberg
        r = http.post("/v1/namespaces/db/tables", json={"name": f"t{i}", "schema": SCHEMA, "location": location})
        assert "location" in iceberg_error(r)["message"], location
        r = http.post("/v1/namespaces/db/views", json={"name": f"v{i}", "schema": SCHEMA, "location": location,
                                                       "view-version": _view_version(), "properties": {}})
        assert "location" in iceberg_error(r)["message"], location
        # The create transaction (stage-create, then a commit with assert-create) too.
        r = http.post("/v1/namespaces/db/tables/s", json={
            "requirements": [{"type": "assert-create"}],
            "updates": [{"action": "assign-uuid", "uuid": "9c12d441-03fe-4693-9a96-a0705ddf69c1"},
                        {"action": "upgrade-format-version", "format-version": 2},
                        {"action": "add-schema", "schema": SCHEMA}, {"action": "set-current-schema", "schema-id": -1},
                        {"action": "set-location", "location": location}]})
        iceberg_error(r)
    assert http.get("/v1/namespaces/db/tables").json()["identifiers"] == []
    assert http.get("/v1/namespaces/db/views").json()["identifiers"] == []
    assert_nothing_outside(outside)


def test_iceberg_set_location_cannot_move_a_table_or_view_out(http, warehouse, tmp_path):
    outside = tmp_path / "outside"
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    table = http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).json()
    view = http.post("/v1/namespaces/db/views", json={"name": "v", "schema": SCHEMA, "properties": {},
                                                      "view-version": _view_version()}).json()
    for location in hostile_locations(warehouse, outside):
        if not location:
            continue
        r = http.post("/v1/namespaces/db/tables/t", json={"requirements": [],
                                                          "updates": [{"action": "set-location", "location": location}]})
        iceberg_error(r)
        r = http.post("/v1/namespaces/db/views/v",
                      json={"updates": [{"action": "set-location", "location": location}]})
        iceberg_error(r)
        r = http.post("/v1/transactions/commit", json={"table-changes": [{
            "identifier": {"namespace": ["db"], "name": "t"}, "requirements": [],
            "updates": [{"action": "set-location", "location": location}]}]})
        iceberg_error(r)
    assert http.get("/v1/namespaces/db/tables/t").json()["metadata-location"] == table["metadata-location"]
    assert http.get("/v1/namespaces/db/views/v").json()["metadata-location"] == view["metadata-location"]
    # Within the warehouse a table may move.
    r = http.post("/v1/namespaces/db/tables/t", json={"requirements": [], "updates": [
        {"action": "set-location", "location": f"{warehouse}/moved"}]})
    assert r.status_code == 200, r.text
    assert r.json()["metadata-location"].startswith(f"{warehouse}/moved/metadata/")
    assert_nothing_outside(outside)


def test_iceberg_register_reads_and_takes_only_what_is_in_the_warehouse(http, warehouse, tmp_path):
    outside = tmp_path / "outside"
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    created = http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).json()
    metadata = created["metadata"]
    # A metadata file outside the warehouse is not read, even when it is a valid table's.
    elsewhere = tmp_path / "elsewhere" / "00000-x.metadata.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text(json.dumps(metadata))
    for location in [str(elsewhere), elsewhere.as_uri(), "/etc/passwd", "/etc",
                     *hostile_locations(warehouse, outside)]:
        r = http.post("/v1/namespaces/db/register", json={"name": "r", "metadata-location": location})
        iceberg_error(r)
    # A metadata file in the warehouse whose table lives outside it is not taken: commits would write there.
    for location in hostile_locations(warehouse, outside):
        inside = Path(warehouse.removeprefix("file://")) / "foreign" / "00000-y.metadata.json"
        inside.parent.mkdir(parents=True, exist_ok=True)
        inside.write_text(json.dumps({**metadata, "location": location}))
        iceberg_error(http.post("/v1/namespaces/db/register", json={"name": "r", "metadata-location": inside.as_uri()}))
    inside.write_text(json.dumps({**metadata, "table-uuid": "not-a-uuid"}))
    iceberg_error(http.post("/v1/namespaces/db/register", json={"name": "r", "metadata-location": inside.as_uri()}))
    assert [i["name"] for i in http.get("/v1/namespaces/db/tables").json()["identifiers"]] == ["t"]
    assert_nothing_outside(outside)


@pytest.mark.parametrize("namespace", [[".."], ["%2e%2e"], ["a", "..", ".."], ["a/../../outside"], ["a\\..\\.."],
                                       ["q?x"], ["h#x"], ["sp ace"]])
def test_iceberg_names_cannot_move_default_locations_out(http, warehouse, tmp_path, namespace):
    """Namespace levels and table names become directory names only in a safe spelling."""
    for depth in range(1, len(namespace)):   # a nested namespace needs its parents
        assert http.post("/v1/namespaces", json={"namespace": namespace[:depth]}).status_code == 200
    r = http.post("/v1/namespaces", json={"namespace": namespace})
    if any("/" in level for level in namespace):  # could never be addressed (a path's %2F is decoded): refused
        assert r.status_code == 400, r.text
        return
    assert r.status_code == 200, r.text
    path = "%1F".join(quote_all(level) for level in namespace)
    for name in ["..x", "a?b", "a?c", "a#b", "%2e%2e"]:
        r = http.post(f"/v1/namespaces/{path}/tables", json={"name": name, "schema": SCHEMA})
        assert r.status_code == 200, r.text
        location = r.json()["metadata"]["location"]
        assert location.startswith(warehouse + "/"), location
        assert Path(httpx.URL(r.json()["metadata-location"]).path).is_file()
        # The create transaction names the table in the body, so any namespace can be spelled there.
        r = http.post("/v1/transactions/commit", json={"table-changes": [{
            "identifier": {"namespace": namespace, "name": "tx" + name}, "requirements": [{"type": "assert-create"}],
            "updates": [{"action": "assign-uuid", "uuid": str(uuid.uuid4())},
                        {"action": "upgrade-format-version", "format-version": 2},
                        {"action": "add-schema", "schema": SCHEMA}, {"action": "set-current-schema", "schema-id": -1},
                        {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
                        {"action": "set-default-spec", "spec-id": -1},
                        {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
                        {"action": "set-default-sort-order", "sort-order-id": -1}]}]})
        assert r.status_code == 204, r.text
    # Names that differ only in characters the spelling replaces do not share files.
    loaded = {n: http.get(f"/v1/namespaces/{path}/tables/{quote_all(n)}").json() for n in ["a?b", "a?c"]}
    assert loaded["a?b"]["metadata"]["table-uuid"] != loaded["a?c"]["metadata"]["table-uuid"]
    assert loaded["a?b"]["metadata-location"] != loaded["a?c"]["metadata-location"]
    written = {p.name for p in Path(warehouse.removeprefix("file://")).rglob("*.metadata.json")}
    assert len(written) == 10, written
    assert not (tmp_path / "outside").exists() and not (tmp_path / "a").exists()


def test_iceberg_prefix_cannot_move_default_locations_out(http, warehouse, tmp_path):
    for prefix in ["%2e%2e", "..%2F..", "%2E%2E"]:
        r = http.post(f"/v1/{prefix}/namespaces", json={"namespace": ["db"]})
        if r.status_code != 200:
            iceberg_error(r, r.status_code)
            continue
        r = http.post(f"/v1/{prefix}/namespaces/db/tables", json={"name": "t", "schema": SCHEMA})
        assert r.status_code == 200, r.text
        assert r.json()["metadata"]["location"].startswith(warehouse + "/"), r.json()["metadata"]["location"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("db")) == []


# -- Lance -----------------------------------------------------------------------------------------------------------


def test_lance_declare_and_register_refuse_locations_outside_the_warehouse(http, warehouse, tmp_path):
    outside = tmp_path / "outside"
    # A real Lance table outside the warehouse: register must still refuse it.
    stage(outside.as_uri(), 1)
    before = sorted(outside.rglob("*"))
    assert http.post("/v1/namespace/db/create", json={}).status_code == 200
    for i, location in enumerate(hostile_locations(warehouse, outside)):
        if not location:
            continue  # empty: the default location
        lance_error(http.post(f"/v1/table/db$t{i}/declare", json={"location": location}))
        lance_error(http.post(f"/v1/table/db$t{i}/register", json={"location": location}))
        r = http.post("/v1/table/batch-commit", json={"operations": [
            {"declare_table": {"id": ["db", f"b{i}"], "location": location}}]})
        lance_error(r)
    assert http.get("/v1/namespace/db/table/list").json()["tables"] == []
    assert sorted(outside.rglob("*")) == before


@pytest.mark.parametrize("ident", ["..$..", "%2e%2e$t", "a$..", "q?x$t"])
def test_lance_names_cannot_move_default_locations_out(http, warehouse, tmp_path, ident):
    *ns, name = ident.split("$")
    quoted = "$".join(quote_all(level) for level in ns)
    for i in range(1, len(ns) + 1):
        r = http.post(f"/v1/namespace/{'$'.join(quote_all(level) for level in ns[:i])}/create", json={})
        assert r.status_code in (200, 409), r.text
    r = http.post(f"/v1/table/{quoted}${quote_all(name)}/declare", json={})
    assert r.status_code == 200, r.text
    assert r.json()["location"].startswith(warehouse + "/"), r.json()["location"]


# -- Unity Catalog (Delta) --------------------------------------------------------------------------------------------


def _uc_schema(http) -> None:
    assert http.post(f"{UC}/catalogs", json={"name": "main"}).status_code == 200
    assert http.post(f"{UC}/schemas", json={"name": "default", "catalog_name": "main"}).status_code == 200


def test_delta_storage_locations_cannot_leave_the_managed_root(http, warehouse, tmp_path):
    outside = tmp_path / "outside"
    _uc_schema(http)
    staging = http.post(f"{UC}/staging-tables", json={"name": "t", "catalog_name": "main",
                                                      "schema_name": "default"}).json()
    loc = staging["staging_location"]
    assert loc.startswith(f"{warehouse}/{MANAGED_DIR}/")
    write_log_file(loc, FIRST, first_commit(staging["id"]))
    body = {"name": "t", "catalog_name": "main", "schema_name": "default", "table_type": "MANAGED",
            "data_source_format": "DELTA", "columns": COLUMNS, "properties": table_properties(staging["id"])}
    parent = loc.rsplit("/", 1)[0]
    tricks = [f"{loc}/..", f"{loc}/../{staging['id']}/../..", f"{parent}/%2e%2e/{staging['id']}",
              f"{loc}%2f..", f"{loc}\\..", f"{loc}?x", f"{loc}#x", f"{loc}%00",
              *hostile_locations(warehouse, outside)]
    for location in tricks:
        r = http.post(f"{UC}/tables", json={**body, "storage_location": location})
        assert r.status_code in (400, 404), (location, r.text)
        uc_error(r, r.status_code, "INVALID_PARAMETER_VALUE" if r.status_code == 400 else "TABLE_DOES_NOT_EXIST")
    # An EXTERNAL table is the client's own location, but never in the managed root nor spelled ambiguously.
    managed = f"{warehouse}/{MANAGED_DIR}"
    for location in [f"{managed}/tables/x", f"{warehouse}/ext/../{MANAGED_DIR}/tables/x",
                     f"{warehouse}/%2e%2e/x", f"{warehouse}/ext\\..\\{MANAGED_DIR}", f"{warehouse}/ext?x",
                     f"{warehouse}/ext#x", f"{warehouse}/e\txt", "relative/ext", ""]:
        r = http.post(f"{UC}/tables", json={**body, "name": "e", "table_type": "EXTERNAL",
                                            "data_source_format": "PARQUET", "storage_location": location})
        uc_error(r)
    assert http.get(f"{UC}/tables", params={"catalog_name": "main", "schema_name": "default"}).json()["tables"] == []
    # The real staging location still works after all that.
    assert http.post(f"{UC}/tables", json={**body, "storage_location": loc}).status_code == 200
    # Catalogs and schemas take no storage root.
    uc_error(http.post(f"{UC}/catalogs", json={"name": "c2", "storage_root": str(outside)}))
    uc_error(http.post(f"{UC}/schemas", json={"name": "s2", "catalog_name": "main", "storage_root": str(outside)}))
    assert_nothing_outside(outside)


# -- limits ------------------------------------------------------------------------------------------------------------


def test_nul_characters_are_refused_in_every_protocol(http):
    iceberg_error(http.post("/v1/namespaces", json={"namespace": ["a\x00b"]}))
    iceberg_error(http.get("/v1/namespaces/a%00b"))
    iceberg_error(http.post("/v1/tables/rename", json={"source": {"namespace": ["a"], "name": "b"},
                                                       "destination": {"namespace": ["x\x00"], "name": "b"}}))
    iceberg_error(http.post("/v1/namespaces", json={"namespace": ["db"], "properties": {"k": "v\x00"}}))
    lance_error(http.post("/v1/namespace/a%00b/create", json={}))
    lance_error(http.post("/v1/namespace/db/create", json={"properties": {"k\x00": "v"}}))
    uc_error(http.post(f"{UC}/catalogs", json={"name": "c", "comment": "\x00"}))
    uc_error(http.get(f"{UC}/schemas", params={"catalog_name": "a\x00"}))


def _chunks(total: int, size: int = 1 << 20):
    while total > 0:
        yield b"x" * min(size, total)
        total -= size


@pytest.mark.parametrize("chunked", [False, True])
def test_body_size_limit(http, chunked):
    """Over MAX_BODY_BYTES: 413 in Iceberg's and Unity Catalog's formats; Lance's spec maps every input error to
    400 with code 13 (InvalidInput), so a too-large body is that there."""
    too_big = MAX_BODY_BYTES + 1

    def post(path: str) -> httpx.Response:
        if chunked:  # no Content-Length: the limit must hold while the body streams in
            return http.post(path, content=_chunks(too_big), headers={"Content-Type": "application/json"})
        return http.post(path, content=b"x" * too_big, headers={"Content-Type": "application/json"})

    iceberg_error(post("/v1/namespaces"), 413)
    uc_error(post(f"{UC}/catalogs"), 413)
    assert "too large" in lance_error(post("/v1/namespace/db/create"))["error"].lower()
    assert http.get("/v1/namespaces").json()["namespaces"] == []


@pytest.mark.parametrize("depth", [300, 1100, 100_000])
def test_deeply_nested_json_is_a_bad_request(http, depth):
    """orjson refuses nesting beyond 1024 levels, and cannot write back more than 255: the service refuses more
    than MAX_JSON_DEPTH levels at the door, so nothing deep is taken and then fails to be stored."""
    nested = "[" * depth + "]" * depth
    deep_object = '{"a":' * depth + "1" + "}" * depth
    iceberg_error(http.post("/v1/namespaces", content=f'{{"namespace": ["db"], "x": {nested}}}'))
    iceberg_error(http.post("/v1/namespaces", content='{"namespace": ["db"], "properties": ' + deep_object + "}"))
    schema = {"type": "struct", "schema-id": 0, "fields": []}
    inner = schema
    for i in range(depth // 3):
        struct = {"type": "struct", "fields": []}
        inner["fields"].append({"id": i + 1, "name": f"f{i}", "type": struct, "required": False})
        inner = struct
    assert http.post("/v1/namespaces", json={"namespace": ["ok"]}).status_code == 200
    if depth < 1000:  # deeper than that the encoder below would fail first
        iceberg_error(http.post("/v1/namespaces/ok/tables", content=json.dumps({"name": "t", "schema": schema})))
    lance_error(http.post("/v1/namespace/db/create", content=f'{{"properties": {nested}}}'))
    lance_error(http.post("/v1/table/batch-commit", content=f'{{"operations": {nested}}}'))
    uc_error(http.post(f"{UC}/catalogs", content=f'{{"name": "c", "x": {nested}}}'))
    if depth < 1000:  # ColumnInfo keeps unknown keys: a deep one must not reach the table's stored entry
        _uc_schema(http)
        columns = [{"name": "c", "type_name": "STRUCT", "nested": json.loads(nested)}]
        uc_error(http.post(f"{UC}/tables", json={"name": "e", "catalog_name": "main", "schema_name": "default",
                                                 "table_type": "EXTERNAL", "data_source_format": "PARQUET",
                                                 "columns": columns, "storage_location": "/tmp/x"}))
    assert http.get("/v1/namespaces").json()["namespaces"] == [["ok"]]
    assert http.get("/v1/namespaces/ok/tables").json()["identifiers"] == []


def test_integers_beyond_64_bits_are_bad_requests(http, tmp_path):
    big = 2**63
    _uc_schema(http)
    staging = http.post(f"{UC}/staging-tables", json={"name": "t", "catalog_name": "main",
                                                      "schema_name": "default"}).json()
    write_log_file(staging["staging_location"], FIRST, first_commit(staging["id"]))
    table = http.post(f"{UC}/tables", json={
        "name": "t", "catalog_name": "main", "schema_name": "default", "table_type": "MANAGED",
        "data_source_format": "DELTA", "columns": COLUMNS, "storage_location": staging["staging_location"],
        "properties": table_properties(staging["id"])}).json()
    base = {"table_id": table["table_id"], "table_uri": table["storage_location"]}
    now = int(time.time() * 1000)
    for field, value in [("timestamp", big), ("file_size", big), ("file_modification_timestamp", 2**64 - 1),
                         ("version", big)]:
        info = {"version": 1, "timestamp": now, "file_name": "1.json", "file_size": 1,
                "file_modification_timestamp": now, field: value}
        uc_error(http.post(f"{UC}/delta/commit", json={**base, "commit_info": info}))
    uc_error(http.post(f"{UC}/delta/commit", json={**base, "latest_published_version": big}))
    uc_error(http.post(f"{UC}/delta/metrics", json={**base, "report": {"commit_report": {"commit_version": big}}}))
    uc_error(http.get(f"{UC}/delta/commits", params={**base, "start_version": big}))
    assert http.post(f"{UC}/delta/commit", json={**base, "commit_info": {
        "version": 1, "timestamp": now, "file_name": "1.json", "file_size": 1,
        "file_modification_timestamp": now}}).status_code == 200
    assert http.post("/v1/namespace/db/create", json={}).status_code == 200
    assert http.post("/v1/table/db$t/declare", json={}).status_code == 200
    lance_error(http.post("/v1/table/db$t/version/create", json={"version": 2**64, "manifest_path": "x"}))
    lance_error(http.post("/v1/table/db$t/version/describe", json={"version": 2**64}))
    lance_error(http.post("/v1/table/db$t/version/delete", json={"ranges": [{"start_version": 1,
                                                                              "end_version": 2**64}]}))
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    for update in [{"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": 2**64 - 1},
                   {"action": "add-snapshot", "snapshot": {"snapshot-id": 2**64 - 1, "timestamp-ms": now,
                                                           "manifest-list": "x", "summary": {"operation": "append"},
                                                           "sequence-number": 1}},
                   {"action": "add-schema", "schema": {**SCHEMA, "schema-id": 2**63}},
                   {"action": "set-properties", "updates": {"k": "v"}, "x": 2**64 - 1}]:
        # Taken, any of these would make the table unreadable to Java clients (a long cannot hold it).
        iceberg_error(http.post("/v1/namespaces/db/tables/t", json={"requirements": [], "updates": [update]}))
    assert http.get("/v1/namespaces/db/tables/t").json()["metadata"]["snapshots"] == []


def test_long_digit_runs_within_64_bits_are_taken(http):
    # Zero-padded versions (Delta's 00000000000000000000.json, Lance's V2 manifest names) and the largest long.
    assert http.post("/v1/namespaces", json={"namespace": ["digits"], "properties": {
        "zeros": "00000000000000000000.json", "padded": "00000000000000000007", "max": str(2**63 - 1),
        "padded-max": f"0{2**63 - 1}"}}).status_code == 200
    iceberg_error(http.post("/v1/namespaces", json={"namespace": ["big"], "n": 2**63}))


# -- slow clients (slowloris) ------------------------------------------------------------------------------------------


@pytest.fixture
def impatient(config):
    """The service with short HTTP deadlines, so that the tests of them are quick."""
    from api.server import EmbeddedService
    config.http_keep_alive_s = 1.5
    config.http_body_timeout_s = 1.5
    with EmbeddedService(config) as base_url:
        yield httpx.URL(base_url)


def _connect(url: httpx.URL) -> socket.socket:
    sock = socket.create_connection((url.host, url.port), timeout=10)
    return sock


def _trickle(sock: socket.socket, data: bytes, interval_s: float, limit_s: float) -> float:
    """Send `data` a byte at a time until the server closes the connection; the seconds that took."""
    started = time.monotonic()
    try:
        for b in data:
            sock.sendall(bytes([b]))
            time.sleep(interval_s)
            if time.monotonic() - started > limit_s:
                break
        sock.settimeout(limit_s)
        while sock.recv(65536):
            pass
    except (BrokenPipeError, ConnectionResetError, socket.timeout):
        pass  # closed by the server, or (the failure the caller asserts on) never closed
    return time.monotonic() - started


@pytest.mark.parametrize("after_a_request", [False, True])
def test_slow_headers_are_cut_off(impatient, after_a_request):
    """A client that sends its request line and headers a byte at a time (slowloris) is disconnected once the
    keep-alive deadline passes: trickling bytes does not extend it. Also on a connection that has served a
    request (the deadline restarts after each response; quart-trio's cancellation used to stop that)."""
    sock = _connect(impatient)
    if after_a_request:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b'"ok"}' not in answer:
            answer += sock.recv(65536)
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
    elapsed = _trickle(sock, request, 0.05, limit_s=20)
    sock.close()
    assert elapsed < 6, f"the server held a trickling connection for {elapsed:.1f} s"
    # The service still answers others.
    assert httpx.get(impatient.join("/healthz")).status_code == 200


def test_idle_connections_are_closed(impatient):
    """An idle keep-alive connection, before or after requests, is closed after the keep-alive deadline."""
    for requests_first in (0, 2):
        sock = _connect(impatient)
        for _ in range(requests_first):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while b'"ok"}' not in answer:
                answer += sock.recv(65536)
        started = time.monotonic()
        sock.settimeout(10)
        try:
            assert sock.recv(65536) == b""
        except socket.timeout:
            pass
        sock.close()
        elapsed = time.monotonic() - started
        assert elapsed < 6, f"an idle connection ({requests_first} requests served) stayed open {elapsed:.1f} s"


@pytest.mark.parametrize("method, path, fmt", [("POST", "/v1/namespaces", "iceberg"),
                                               ("GET", "/v1/config", "iceberg"),
                                               ("POST", "/v1/namespace/db/create", "lance"),
                                               ("GET", f"{UC}/delta/commits", "uc"),
                                               # the commit routes (api/direct.py)
                                               ("POST", "/v1/namespaces/db/tables/t", "iceberg"),
                                               ("POST", "/v1/table/db$t/version/create", "lance"),
                                               ("POST", f"{UC}/delta/preview/commits", "uc")])
def test_slow_bodies_time_out(impatient, method, path, fmt):
    """A body that trickles in must arrive whole within the body deadline; after it the client gets 408 in the
    protocol's format (Lance: 400 with code 13) and the connection is closed."""
    sock = _connect(impatient)
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    sock.sendall(head.encode())
    started = time.monotonic()
    answer = b""
    try:
        sock.settimeout(0.2)
        while time.monotonic() - started < 20:
            try:
                sock.sendall(b" ")
            except (BrokenPipeError, ConnectionResetError):
                break
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                break
            answer += chunk
    finally:
        sock.close()
    elapsed = time.monotonic() - started
    assert elapsed < 8, elapsed
    status_line, _, rest = answer.partition(b"\r\n")
    body = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    if fmt == "iceberg":
        assert status_line.startswith(b"HTTP/1.1 408"), answer
        assert body["error"]["code"] == 408 and body["error"]["type"], body
    elif fmt == "uc":
        assert status_line.startswith(b"HTTP/1.1 408"), answer
        assert body["error_code"] and body["message"], body
    else:
        assert status_line.startswith(b"HTTP/1.1 400"), answer
        assert body["code"] == 13 and body["error"], body


def test_a_json_object_with_a_key_twice_is_refused_in_every_protocol(http):
    """Parsers disagree on which of a repeated key counts: a failing assertion placed first and an empty list last
    must not apply on one reading and be refused on another. 400 in each protocol, nothing applied."""
    assert http.post("/v1/namespaces", json={"namespace": ["dup"]}).status_code == 200
    created = http.post("/v1/namespaces/dup/tables", json={"name": "t", "schema": {
        "type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}})
    before = created.json()["metadata-location"]
    commit = ('{"requirements": [{"type": "assert-table-uuid", "uuid": "00000000-0000-0000-0000-000000000000"}],'
              ' "updates": [{"action": "set-properties", "updates": {"k": "v"}}], "requirements": []}')
    err = iceberg_error(http.post("/v1/namespaces/dup/tables/t", content=commit))
    assert "'requirements' twice" in err["message"]
    assert http.get("/v1/namespaces/dup/tables/t").json()["metadata-location"] == before
    # nested objects too, and the other protocols
    iceberg_error(http.post("/v1/namespaces", content='{"namespace": ["dup2"], "properties": {"a": "1", "a": "2"}}'))
    assert http.get("/v1/namespaces/dup2").status_code == 404
    lance_error(http.post("/v1/namespace/dup3/create", content='{"properties": {}, "properties": {"a": "b"}}'))
    assert http.post("/v1/namespace/dup3/exists", json={}).status_code == 404
    uc_error(http.post(f"{UC}/catalogs", content='{"name": "c1", "name": "c2"}'))
    assert http.get(f"{UC}/catalogs/c1").status_code == 404 and http.get(f"{UC}/catalogs/c2").status_code == 404


@pytest.mark.parametrize("body, key", [
    (b'{"a": 1, "a": 2}', "a"),
    (b'{"a": "x:y", "b": {"c": 1, "c": "p:q"}}', "c"),            # colons in strings, a nested object
    (b'{"a": 1, "\\u0061": 2}', "a"),                            # the same key spelled with an escape
    (b'{"a": "\\u003a", "a": 1}', "a"),                          # an escaped colon
    (b'[{"k": ":"}, {"k": 1, "k": 1}]', "k"),
])
def test_a_repeated_key_is_found_however_the_body_is_spelled(body, key):
    from api.common import parse_json
    from coordinator.errors import BadRequest
    with pytest.raises(BadRequest, match=f"the key '{key}' twice"):
        parse_json(body)


@pytest.mark.parametrize("body", [b'{"a": "x:y", "b:c": {"c": ":"}}', b'{"a": "\\u003a", "\\u003a": 1}', b'[]',
                                  b'"::"', b'{"a": [{"a": 1}, {"a": 2}]}'])
def test_keys_once_per_object_pass(body):
    from api.common import parse_json
    assert parse_json(body) == json.loads(body)


# -- name limits -----------------------------------------------------------------------------------------------

LONG = "x" * 2700            # beyond PostgreSQL's index row limit, where a name used to be a 500 or a 503
WIDE = "€" * 100             # 100 characters, 300 bytes of UTF-8: over the byte limit, under a character one
FITS = "€" * 85              # 255 bytes: the longest name there is


def test_names_over_the_limit_are_a_bad_request_in_every_protocol(http, warehouse):
    from coordinator.name_limits import NAME_MAX_BYTES
    # Iceberg: namespaces, tables, views, renames
    for level in (LONG, WIDE):
        err = iceberg_error(http.post("/v1/namespaces", json={"namespace": [level]}))
        assert f"at most {NAME_MAX_BYTES} bytes" in err["message"]
    iceberg_error(http.post("/v1/namespaces", json={"namespace": ["a"] * 17}))
    assert http.get("/v1/namespaces").json()["namespaces"] == []
    assert http.post("/v1/namespaces", json={"namespace": [FITS]}).status_code == 200
    schema = {"type": "struct", "schema-id": 0, "fields": []}
    for name in (LONG, WIDE):
        iceberg_error(http.post(f"/v1/namespaces/{FITS}/tables", json={"name": name, "schema": schema}))
        iceberg_error(http.post(f"/v1/namespaces/{FITS}/views", json={
            "name": name, "schema": schema, "view-version": _view_version(), "properties": {}}))
    assert http.get(f"/v1/namespaces/{FITS}/tables").json()["identifiers"] == []
    assert http.post(f"/v1/namespaces/{FITS}/tables", json={"name": FITS, "schema": schema}).status_code == 200
    iceberg_error(http.post("/v1/tables/rename", json={"source": {"namespace": [FITS], "name": FITS},
                                                       "destination": {"namespace": [FITS], "name": WIDE}}))
    assert http.get(f"/v1/namespaces/{FITS}/tables/{FITS}").status_code == 200
    # Lance: namespaces and tables
    lance_error(http.post(f"/v1/namespace/{LONG}/create", json={}))
    lance_error(http.post(f"/v1/namespace/{WIDE}/create", json={}))
    assert http.post("/v1/namespace/ln/create", json={}).status_code == 200
    lance_error(http.post(f"/v1/table/ln${WIDE}/declare", json={}))
    assert http.post(f"/v1/namespace/ln/table/list", json={}).json()["tables"] == []
    # Unity Catalog: catalogs, schemas, tables
    uc_error(http.post(f"{UC}/catalogs", json={"name": WIDE}))
    assert http.post(f"{UC}/catalogs", json={"name": "main"}).status_code == 200
    uc_error(http.post(f"{UC}/schemas", json={"name": WIDE, "catalog_name": "main"}))
    assert http.post(f"{UC}/schemas", json={"name": "default", "catalog_name": "main"}).status_code == 200
    uc_error(http.post(f"{UC}/tables", json={
        "name": WIDE, "catalog_name": "main", "schema_name": "default", "table_type": "EXTERNAL",
        "data_source_format": "DELTA", "storage_location": f"{warehouse}/ext", "columns": []}))
    assert http.get(f"{UC}/tables", params={"catalog_name": "main", "schema_name": "default"}).json()["tables"] == []
