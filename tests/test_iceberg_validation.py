"""Input the Iceberg REST spec does not allow is refused with the spec's error and changes nothing, over real HTTP.

Each case is one a conformance probe found stored: partition transforms, decimal types, view versions, namespace
levels with `/`, a nested namespace without its parent, a property both updated and removed, a
`purgeRequested` that is not a boolean; and the spec's paging rules for list routes.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from pyiceberg.catalog import load_catalog

from tests.support import iceberg_table_client

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [
    {"id": 1, "name": "id", "type": "long", "required": False},
    {"id": 2, "name": "s", "type": "string", "required": False},
]}


@pytest.fixture
def http(service):
    with iceberg_table_client(service, SCHEMA) as client:
        yield client


def table_location(http) -> str:
    return http.get("/v1/namespaces/db/tables/t").json()["metadata-location"]


def commit(http, *updates):
    return http.post("/v1/namespaces/db/tables/t", json={"requirements": [], "updates": list(updates)})


def assert_bad_request(r: httpx.Response, status: int = 400, kind: str = "BadRequestException") -> None:
    assert r.status_code == status, r.text
    assert r.json()["error"]["type"] == kind and r.json()["error"]["code"] == status


# -- partition transforms ----------------------------------------------------------------------------------------

BAD_TRANSFORMS = ["bucket[-1]", "bucket[abc]", "bucket[0]", "truncate[0]", "BUCKET[4]", "identity ", " identity",
                  "bucket[2147483648]", "bucket[99999999999999999999]", "truncate[]", "bucket[4", "bucket[ 4]",
                  "bucket[4]x", "Identity", "zorder", "bucket[٤]", "identity\n"]


@pytest.mark.parametrize("transform", BAD_TRANSFORMS)
def test_add_spec_with_a_transform_outside_the_spec_is_refused(http, transform):
    before = table_location(http)
    r = commit(http, {"action": "add-spec", "spec": {"fields": [
        {"source-id": 1, "name": "p", "transform": transform}]}})
    assert_bad_request(r)
    assert "transform" in r.json()["error"]["message"]
    assert table_location(http) == before


@pytest.mark.parametrize("transform", BAD_TRANSFORMS)
def test_create_table_with_a_transform_outside_the_spec_is_refused(http, transform):
    r = http.post("/v1/namespaces/db/tables", json={"name": "p", "schema": SCHEMA, "partition-spec": {
        "fields": [{"source-id": 1, "name": "p", "transform": transform}]}})
    assert_bad_request(r)
    assert http.get("/v1/namespaces/db/tables/p").status_code == 404


def test_spec_transforms_are_accepted_and_the_table_loads_in_pyiceberg(service, http):
    fields = [{"source-id": 1, "name": "b", "transform": "bucket[2147483647]"},
              {"source-id": 2, "name": "tr", "transform": "truncate[1]"},
              {"source-id": 1, "name": "i", "transform": "identity"},
              {"source-id": 2, "name": "v", "transform": "void"}]
    r = commit(http, {"action": "add-spec", "spec": {"fields": fields}},
               {"action": "set-default-spec", "spec-id": -1})
    assert r.status_code == 200, r.text
    table = load_catalog("c", type="rest", uri=service).load_table(("db", "t"))
    assert [str(f.transform) for f in table.spec().fields] == ["bucket[2147483647]", "truncate[1]", "identity",
                                                               "void"]


# -- decimal types -----------------------------------------------------------------------------------------------

BAD_DECIMALS = ["decimal(39,2)", "decimal(0,0)", "decimal(5,6)", "decimal(100, 0)"]


def nested(type_) -> list:
    """`type_` at the top of a schema and inside a struct, a list and a map."""
    return [
        type_,
        {"type": "struct", "fields": [{"id": 10, "name": "x", "type": type_, "required": False}]},
        {"type": "list", "element-id": 10, "element": type_, "element-required": False},
        {"type": "map", "key-id": 10, "key": "string", "value-id": 11, "value": type_, "value-required": False},
    ]


def schema_with(type_) -> dict:
    return {"type": "struct", "fields": [{"id": 1, "name": "id", "type": "long", "required": False},
                                         {"id": 2, "name": "d", "type": type_, "required": False}]}


@pytest.mark.parametrize("type_", [t for d in BAD_DECIMALS for t in nested(d)])
def test_add_schema_with_a_decimal_java_cannot_read_is_refused(http, type_):
    before = table_location(http)
    r = commit(http, {"action": "add-schema", "schema": schema_with(type_)})
    assert_bad_request(r)
    assert "decimal" in r.json()["error"]["message"]
    assert table_location(http) == before


@pytest.mark.parametrize("type_", [t for d in BAD_DECIMALS for t in nested(d)])
def test_create_table_with_a_decimal_java_cannot_read_is_refused(http, type_):
    assert_bad_request(http.post("/v1/namespaces/db/tables", json={"name": "d", "schema": schema_with(type_)}))
    assert http.get("/v1/namespaces/db/tables/d").status_code == 404


def test_decimals_within_the_limits_are_accepted_and_kept_as_every_reader_spells_them(http, service):
    """Java's `Types.fromPrimitiveString` takes any case and spaces around the numbers, and a Java catalog keeps
    the type it parsed, spelled `decimal(P, S)`; pyiceberg reads only that spelling. So the stored type is
    Java's, and pyiceberg loads the table with the precision and scale that were sent."""
    from pyiceberg.types import DecimalType, FixedType, LongType
    cases = [("a", "decimal(38,38)", DecimalType(38, 38)), ("b", "decimal(1,0)", DecimalType(1, 0)),
             ("c", "DECIMAL( 10 , 2 )", DecimalType(10, 2)), ("d", "Fixed[ 16 ]", FixedType(16)),
             ("e", "LONG", LongType())]
    for name, type_, _ in cases:
        r = http.post("/v1/namespaces/db/tables", json={"name": name, "schema": schema_with(type_)})
        assert r.status_code == 200, r.text
    r = commit(http, {"action": "add-schema", "schema": schema_with("DECIMAL(12 ,3)")})
    assert r.status_code == 200, r.text
    catalog = load_catalog("c", type="rest", uri=service)
    for name, type_, expected in cases:
        stored = http.get(f"/v1/namespaces/db/tables/{name}").json()["metadata"]["schemas"][0]["fields"][1]["type"]
        assert stored == str(expected), (type_, stored)   # Java's spelling: `decimal(10, 2)`, `fixed[16]`, `long`
        assert catalog.load_table(f"db.{name}").schema().find_field("d").field_type == expected
    evolved = catalog.load_table("db.t").metadata.schemas[-1]
    assert evolved.find_field("d").field_type == DecimalType(12, 3)


@pytest.mark.parametrize("type_", [" long", "long ", "long\n", "\tint", "decimal(10, 2) ", " fixed[4]"])
def test_a_type_name_with_space_around_it_is_refused_as_java_refuses_it(http, type_):
    """Java's `Types.fromPrimitiveString` matches the whole string: a space or newline around a type name is an
    IllegalArgumentException there, so a table created here with one could not be created through a Java catalog."""
    r = http.post("/v1/namespaces/db/tables", json={"name": "w", "schema": schema_with(type_)})
    assert_bad_request(r)
    assert "unknown primitive type" in r.json()["error"]["message"]
    assert http.get("/v1/namespaces/db/tables/w").status_code == 404


# -- view versions -----------------------------------------------------------------------------------------------


def view_version(**overrides) -> dict:
    version = {"version-id": 1, "timestamp-ms": int(time.time() * 1000), "schema-id": 0,
               "summary": {"engine-name": "test"}, "default-namespace": ["db"],
               "representations": [{"type": "sql", "sql": "select 1 as id", "dialect": "spark"}]}
    return {**version, **overrides}


BAD_VERSIONS = [
    {"timestamp-ms": "abc"}, {"timestamp-ms": None}, {"version-id": "x"}, {"version-id": 2**31}, {"schema-id": 1.5},
    {"representations": [{"type": "sql"}]}, {"representations": [{"type": "sql", "sql": 1, "dialect": "spark"}]},
    {"representations": [{"sql": "select 1", "dialect": "spark"}]}, {"representations": ["select 1"]},
    {"representations": {"type": "sql"}}, {"default-namespace": "notalist"}, {"default-namespace": [1]},
    {"summary": {"n": 1}}, {"summary": []}, {"default-catalog": 5},
]


def create_view(http, version: dict, name: str = "v") -> httpx.Response:
    return http.post("/v1/namespaces/db/views", json={"name": name, "schema": SCHEMA, "view-version": version,
                                                      "properties": {}})


@pytest.mark.parametrize("bad", BAD_VERSIONS)
def test_create_view_with_a_malformed_version_is_refused(http, bad):
    r = create_view(http, view_version(**bad))
    assert_bad_request(r)
    assert r.json()["error"]["message"].startswith("view-version")
    assert http.get("/v1/namespaces/db/views/v").status_code == 404


@pytest.mark.parametrize("missing", ["version-id", "timestamp-ms", "schema-id", "summary", "representations",
                                     "default-namespace"])
def test_create_view_without_a_required_version_field_is_refused(http, missing):
    version = {k: v for k, v in view_version().items() if k != missing}
    assert_bad_request(create_view(http, version))


@pytest.mark.parametrize("bad", BAD_VERSIONS)
def test_add_view_version_with_a_malformed_version_is_refused(http, bad):
    before = create_view(http, view_version()).json()["metadata-location"]
    r = http.post("/v1/namespaces/db/views/v", json={"requirements": [], "updates": [
        {"action": "add-view-version", "view-version": view_version(**bad)}]})
    assert_bad_request(r)
    assert r.json()["error"]["message"].startswith("updates[0].view-version")
    assert http.get("/v1/namespaces/db/views/v").json()["metadata-location"] == before


def test_create_view_schema_is_checked_like_a_table_schema(http):
    r = http.post("/v1/namespaces/db/views", json={"name": "v", "schema": schema_with("decimal(39,0)"),
                                                   "view-version": view_version(), "properties": {}})
    assert_bad_request(r)
    assert http.get("/v1/namespaces/db/views/v").status_code == 404


def test_a_valid_version_with_every_field_loads_in_pyiceberg(service, http):
    version = view_version(**{"default-catalog": "cat", "timestamp-ms": 2**63 - 1})
    assert create_view(http, version).status_code == 200
    r = http.post("/v1/namespaces/db/views/v", json={"requirements": [], "updates": [
        {"action": "add-view-version", "view-version": view_version(representations=[
            {"type": "sql", "sql": "select 2 as id", "dialect": "trino"}])},
        {"action": "set-current-view-version", "view-version-id": -1}]})
    assert r.status_code == 200, r.text
    view = load_catalog("c", type="rest", uri=service).load_view(("db", "v"))
    assert view.metadata.current_version_id == 2
    assert view.metadata.versions[0].default_catalog == "cat"


# -- namespaces --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("namespace", [["a/b"], ["db", "x/y"], ["/"]])
def test_a_namespace_level_with_a_slash_is_refused_like_a_table_name(http, namespace):
    assert_bad_request(http.post("/v1/namespaces", json={"namespace": namespace}))
    assert http.get("/v1/namespaces").json()["namespaces"] == [["db"]]


def test_a_nested_namespace_needs_its_parent(http):
    """Created without its parent, a child would be unreachable: no listing leads to it. Refused as Polaris does."""
    r = http.post("/v1/namespaces", json={"namespace": ["orph", "kid"]})
    assert_bad_request(r, 404, "NoSuchNamespaceException")
    assert "orph" in r.json()["error"]["message"] and "create it" in r.json()["error"]["message"]
    assert http.get("/v1/namespaces/orph%1Fkid").status_code == 404
    assert http.get("/v1/namespaces").json()["namespaces"] == [["db"]]
    assert_bad_request(http.post("/v1/namespaces", json={"namespace": ["db", "no", "kid"]}), 404,
                       "NoSuchNamespaceException")
    assert http.get("/v1/namespaces", params={"parent": "db"}).json()["namespaces"] == []
    # Parents first, and the same request succeeds.
    assert http.post("/v1/namespaces", json={"namespace": ["orph"]}).status_code == 200
    assert http.post("/v1/namespaces", json={"namespace": ["orph", "kid"]}).status_code == 200
    assert http.get("/v1/namespaces", params={"parent": "orph"}).json()["namespaces"] == [["orph", "kid"]]


def test_a_property_both_updated_and_removed_is_unprocessable(http):
    assert http.post("/v1/namespaces/db/properties", json={"updates": {"a": "1"}}).status_code == 200
    r = http.post("/v1/namespaces/db/properties", json={"updates": {"a": "2", "b": "1"}, "removals": ["a"]})
    assert_bad_request(r, 422, "UnprocessableEntityException")
    assert http.get("/v1/namespaces/db").json()["properties"] == {"a": "1"}


# -- config ------------------------------------------------------------------------------------------------------


def test_the_namespace_separator_is_a_config_override(service, http):
    """The spec names it "the /config override `namespace-separator`"; clients read it from the merged
    properties (defaults, their own, overrides), never from a top-level key."""
    config = http.get("/v1/config").json()
    assert config["overrides"]["namespace-separator"] == "%1F" and "namespace-separator" not in config
    catalog = load_catalog("c", type="rest", uri=service)
    assert catalog.properties["namespace-separator"] == "%1F"
    assert catalog.list_namespaces("db") == []   # the `parent` it sends is joined with that separator


# -- query parameters --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["maybe", "1", "yes", "", "truee"])
def test_a_purge_requested_that_is_not_a_boolean_is_refused_and_drops_nothing(http, value):
    before = table_location(http)
    r = http.delete("/v1/namespaces/db/tables/t", params={"purgeRequested": value})
    assert_bad_request(r)
    assert "purgeRequested" in r.json()["error"]["message"]
    assert table_location(http) == before and Path(httpx.URL(before).path).is_file()


@pytest.mark.parametrize("value", ["TRUE", "False", "true", "false"])
def test_purge_requested_is_read_in_any_case(http, value):
    kept = Path(httpx.URL(table_location(http)).path)
    assert http.delete("/v1/namespaces/db/tables/t", params={"purgeRequested": value}).status_code == 204
    assert http.get("/v1/namespaces/db/tables/t").status_code == 404
    purged = value.lower() == "true"
    for _ in range(200):   # the purge runs once the drop is durable, after the answer
        if kept.exists() != purged:
            break
        time.sleep(0.025)
    assert kept.exists() != purged


# -- paging ------------------------------------------------------------------------------------------------------


@pytest.fixture
def listed(http):
    """Three more namespaces (four in all), three tables in db (four with `t`) and three views."""
    for i in range(3):
        assert http.post("/v1/namespaces", json={"namespace": [f"n{i}"]}).status_code == 200
        assert http.post("/v1/namespaces/db/tables", json={"name": f"t{i}", "schema": SCHEMA}).status_code == 200
        assert create_view(http, view_version(), name=f"v{i}").status_code == 200
    return {"/v1/namespaces": ("namespaces", 4), "/v1/namespaces/db/tables": ("identifiers", 4),
            "/v1/namespaces/db/views": ("identifiers", 3)}


def test_page_size_without_a_page_token_answers_everything(http, listed):
    for path, (key, count) in listed.items():
        body = http.get(path, params={"pageSize": 1}).json()
        assert len(body[key]) == count and "next-page-token" in body and body["next-page-token"] is None
        body = http.get(path).json()
        assert len(body[key]) == count and body["next-page-token"] is None


def test_pages_end_with_an_explicit_null_token(http, listed):
    for path, (key, count) in listed.items():
        for size in (1, 2, count, count + 5):
            seen, token, pages = [], "", 0
            while token is not None:
                body = http.get(path, params={"pageToken": token, "pageSize": size}).json()
                assert "next-page-token" in body
                seen += body[key]
                token, pages = body["next-page-token"], pages + 1
            assert len(seen) == count and len({str(x) for x in seen}) == count
            assert pages == -(-count // size)  # no empty last page, even when `size` divides `count`


# -- snapshot ids ------------------------------------------------------------------------------------------------

def test_a_snapshot_with_the_reserved_id_minus_one_is_refused(http):
    """-1 is the spec's "no current snapshot": a ref set to it would show every reader an empty table."""
    before = table_location(http)
    r = commit(http,
               {"action": "add-snapshot", "snapshot": {
                   "snapshot-id": -1, "sequence-number": 1, "timestamp-ms": int(time.time() * 1000),
                   "manifest-list": before.rsplit("/", 1)[0] + "/snap--1.avro", "summary": {"operation": "append"},
                   "schema-id": 0}},
               {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": -1})
    assert_bad_request(r)
    assert "-1" in r.json()["error"]["message"]
    assert table_location(http) == before
