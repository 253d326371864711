"""What every protocol's catalog must keep true whatever clients send, over real HTTP:

- a table's location is its own: no table may be created at, above or inside another table's location (in any
  protocol), since dropping either would delete the other's files;
- a namespace drop racing a table or child creation never leaves the child behind under a dropped namespace;
- a page token that is not one we handed out is the client's error (400), never a server fault.
"""

from __future__ import annotations

import concurrent.futures
import functools
import shutil
import time
import uuid

import httpx
import orjson
import pytest

from api.server import EmbeddedService
from storage.files import location_key, to_local_path
from tests.lance.conftest import stage
from tests.support import sql

LANCE_NS, LANCE_TABLE = "/v1/namespace", "/v1/table"
UC = "/api/2.1/unity-catalog"
ICEBERG_SCHEMA = {"type": "struct", "schema-id": 0,
                  "fields": [{"id": 1, "name": "x", "type": "long", "required": False}]}
VIEW_VERSION = {"version-id": 1, "timestamp-ms": 1700000000000, "schema-id": 0, "summary": {},
                "representations": [{"type": "sql", "sql": "SELECT 1", "dialect": "spark"}],
                "default-namespace": ["rc"]}
VIEW = {"schema": ICEBERG_SCHEMA, "view-version": VIEW_VERSION, "properties": {}}


@pytest.fixture
def http(service):
    with httpx.Client(base_url=service, timeout=60) as client:
        yield client


def ok(r) -> dict:
    assert r.status_code == 200, r.text
    return r.json() if r.content else {}


def overlap_refused(r) -> None:
    assert r.status_code == 400, r.text
    assert "overlaps another table's location" in r.text, r.text


def test_lance_table_cannot_take_another_tables_location(http):
    ok(http.post(f"{LANCE_NS}/ws/create", json={}))
    victim = ok(http.post(f"{LANCE_TABLE}/ws$victim/declare", json={}))["location"]
    namespace_dir = victim.rsplit("/", 1)[0]

    for ident, location in [("ws$above", namespace_dir), ("ws$same", victim), ("ws$same2", victim + "/"),
                            ("ws$inside", victim + "/data")]:
        r = http.post(f"{LANCE_TABLE}/{ident}/declare", json={"location": location})
        if ident == "ws$above":   # the namespace's own directory: refused as that, before any overlap
            assert r.status_code == 400 and "directory of namespace" in r.text, r.text
        else:
            overlap_refused(r)
        assert r.json()["code"] == 13
    ok(http.post(f"{LANCE_TABLE}/ws$victim/version/create",
                 json={"version": 1, "manifest_path": stage(victim, 1)}))
    overlap_refused(http.post(f"{LANCE_TABLE}/ws$twin/register", json={"location": victim}))

    # Nothing changed: the victim is the namespace's only table and still reads its version.
    assert ok(http.get(f"{LANCE_NS}/ws/table/list")) == {"tables": ["victim"]}
    assert ok(http.post(f"{LANCE_TABLE}/ws$victim/version/describe", json={"version": 1}))
    # A sibling beside it (a prefix of the name, not of the path) is fine.
    ok(http.post(f"{LANCE_TABLE}/ws$victim2/declare", json={"location": victim + "2"}))


def test_locations_are_exclusive_across_protocols(http, tmp_path):
    # Iceberg: a table inside another Iceberg table's location.
    ok(http.post("/v1/namespaces", json={"namespace": ["ice"]}))
    first = ok(http.post("/v1/namespaces/ice/tables", json={"name": "t1", "schema": ICEBERG_SCHEMA}))
    location = first["metadata"]["location"]
    r = http.post("/v1/namespaces/ice/tables", json={"name": "t2", "location": location + "/nested",
                                                      "schema": ICEBERG_SCHEMA})
    overlap_refused(r)
    assert r.json()["error"]["type"] == "BadRequestException"
    assert http.get("/v1/namespaces/ice/tables/t2").status_code == 404

    # Unity Catalog: an EXTERNAL table containing another one's location.
    ok(http.post(f"{UC}/catalogs", json={"name": "main"}))
    ok(http.post(f"{UC}/schemas", json={"name": "s", "catalog_name": "main"}))
    body = {"catalog_name": "main", "schema_name": "s", "table_type": "EXTERNAL", "data_source_format": "PARQUET",
            "columns": []}
    ok(http.post(f"{UC}/tables", json={**body, "name": "inner", "storage_location": (tmp_path / "a/b").as_uri()}))
    r = http.post(f"{UC}/tables", json={**body, "name": "outer", "storage_location": (tmp_path / "a").as_uri()})
    overlap_refused(r)
    assert r.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert http.get(f"{UC}/tables/main.s.outer").status_code == 404


def test_purge_never_reaches_another_tables_files(http):
    """Paths in a table's metadata are the client's word: a purge deletes only inside the table's own location,
    whatever its manifest lists or statistics name."""
    ok(http.post("/v1/namespaces", json={"namespace": ["pv"]}))
    victim = ok(http.post("/v1/namespaces/pv/tables", json={"name": "victim", "schema": ICEBERG_SCHEMA}))
    ok(http.post("/v1/namespaces/pv/tables", json={"name": "evil", "schema": ICEBERG_SCHEMA}))
    stolen = victim["metadata-location"]
    ok(http.post("/v1/namespaces/pv/tables/evil", json={"requirements": [], "updates": [
        {"action": "add-snapshot", "snapshot": {"snapshot-id": 1, "sequence-number": 1, "timestamp-ms": 1700000000000,
                                                "manifest-list": stolen, "summary": {"operation": "append"},
                                                "schema-id": 0}},
        {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": 1},
        {"action": "set-statistics", "statistics": {"snapshot-id": 1, "statistics-path": stolen,
                                                    "file-size-in-bytes": 1, "file-footer-size-in-bytes": 1,
                                                    "blob-metadata": []}}]}))
    for props in ({}, {"gc.enabled": "false"}):
        if props:  # the second round: a table that keeps data files, whose named files are deleted one by one
            ok(http.post("/v1/namespaces/pv/tables", json={"name": "evil", "schema": ICEBERG_SCHEMA,
                                                             "properties": props}))
            ok(http.post("/v1/namespaces/pv/tables/evil", json={"requirements": [], "updates": [
                {"action": "add-snapshot", "snapshot": {
                    "snapshot-id": 2, "sequence-number": 1, "timestamp-ms": 1700000000000, "manifest-list": stolen,
                    "summary": {"operation": "append"}, "schema-id": 0}}]}))
        assert http.delete("/v1/namespaces/pv/tables/evil", params={"purgeRequested": "true"}).status_code == 204
        time.sleep(0.3)  # the purge runs after the answer
        assert to_local_path(stolen).is_file()
        assert ok(http.get("/v1/namespaces/pv/tables/victim"))["metadata-location"] == stolen


def test_set_location_keeps_locations_exclusive(http):
    """Iceberg's set-location moves a table: not onto, above or into another table's location, and once moved,
    its new place is taken (and its old one free)."""
    ok(http.post(f"{LANCE_NS}/sl/create", json={}))
    lance = ok(http.post(f"{LANCE_TABLE}/sl$victim/declare", json={}))["location"]
    ok(http.post("/v1/namespaces", json={"namespace": ["sl"]}))
    mover = ok(http.post("/v1/namespaces/sl/tables", json={"name": "mover", "schema": ICEBERG_SCHEMA}))
    before = mover["metadata"]["location"]

    def move(to: str):
        return http.post("/v1/namespaces/sl/tables/mover", json={"requirements": [], "updates": [
            {"action": "set-location", "location": to}]})
    for target in (lance, lance + "/inner"):
        overlap_refused(move(target))
    r = move(lance.rsplit("/", 1)[0])   # the namespace's own directory: refused as that, before any overlap
    assert r.status_code == 400 and "directory of namespace" in r.text, r.text
    assert ok(http.get("/v1/namespaces/sl/tables/mover"))["metadata"]["location"] == before
    assert not list(to_local_path(lance).rglob("*.metadata.json"))  # nothing written into the Lance table

    moved_to = before + "-moved"
    assert ok(move(moved_to))["metadata"]["location"] == moved_to
    overlap_refused(http.post(f"{LANCE_TABLE}/sl$late/declare", json={"location": moved_to + "/x"}))
    # The old place is no longer claimed; what holds it back is the moved table's files still there, which its
    # snapshots may read (a declared table starts with nothing of others'). Once they are gone, it is free.
    r = http.post(f"{LANCE_TABLE}/sl$late/declare", json={"location": before})
    assert r.status_code == 400 and "not a new Lance table's" in r.text, r.text
    shutil.rmtree(to_local_path(before))
    ok(http.post(f"{LANCE_TABLE}/sl$late/declare", json={"location": before}))


def test_tables_are_not_placed_at_or_above_namespace_directories_nor_namespaces_in_tables(http):
    """As for Lance: a location the client chooses that is, or holds, a namespace's directory (Iceberg or Lance,
    which share the warehouse; within a catalog prefix, that prefix's) would overlap every table later placed there
    by default. The create, register or move that chose it is refused, not the innocent creates after it."""
    ok(http.post("/v1/namespaces", json={"namespace": ["nd"]}))
    ok(http.post("/v1/namespaces", json={"namespace": ["nd", "kid"]}))
    ok(http.post(f"{LANCE_NS}/lnd/create", json={}))
    t = ok(http.post("/v1/namespaces/nd/tables", json={"name": "t", "schema": ICEBERG_SCHEMA}))
    nd_dir = t["metadata"]["location"].rsplit("/", 1)[0]
    warehouse = nd_dir.rsplit("/", 1)[0]

    def refused(r) -> None:
        assert r.status_code == 400 and "directory of namespace" in r.text, r.text

    for location in (nd_dir, nd_dir + "/kid", warehouse + "/lnd"):
        refused(http.post("/v1/namespaces/nd/tables", json={"name": "bad", "location": location,
                                                             "schema": ICEBERG_SCHEMA}))
        refused(http.post("/v1/namespaces/nd/tables/t", json={"requirements": [], "updates": [
            {"action": "set-location", "location": location}]}))
    staged = ok(http.post("/v1/namespaces/nd/tables", json={"name": "staged", "schema": ICEBERG_SCHEMA,
                                                             "stage-create": True}))
    refused(http.post("/v1/namespaces/nd/tables/staged", json={"requirements": [{"type": "assert-create"}],
                                                                 "updates": [
        {"action": "assign-uuid", "uuid": staged["metadata"]["table-uuid"]},
        {"action": "upgrade-format-version", "format-version": 2},
        {"action": "add-schema", "schema": ICEBERG_SCHEMA}, {"action": "set-current-schema", "schema-id": -1},
        {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}}, {"action": "set-default-spec", "spec-id": -1},
        {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
        {"action": "set-default-sort-order", "sort-order-id": -1}, {"action": "set-location", "location": nd_dir}]}))
    assert ok(http.get("/v1/namespaces/nd/tables/t"))["metadata"]["location"] == t["metadata"]["location"]
    assert [i["name"] for i in ok(http.get("/v1/namespaces/nd/tables"))["identifiers"]] == ["t"]
    # Creates placed by default still work there, and a place of its own inside a namespace's directory is fine.
    ok(http.post("/v1/namespaces/nd/tables", json={"name": "u", "schema": ICEBERG_SCHEMA}))
    ok(http.post("/v1/namespaces/nd%1Fkid/tables", json={"name": "v", "schema": ICEBERG_SCHEMA}))
    ok(http.post("/v1/namespaces/nd/tables", json={"name": "w", "location": nd_dir + "/chosen",
                                                   "schema": ICEBERG_SCHEMA}))

    # A catalog prefix's namespaces live below `<warehouse>/<prefix>~`, which belongs to that prefix alone.
    ok(http.post("/v1/p/namespaces", json={"namespace": ["pn"]}))
    for location in (warehouse + "/p~", warehouse + "/p~/pn"):
        refused(http.post("/v1/p/namespaces/pn/tables", json={"name": "bad", "location": location,
                                                               "schema": ICEBERG_SCHEMA}))
    for prefix, location in (("p", warehouse + "/q~/x"), ("", warehouse + "/p~/x")):
        path = f"/v1/{prefix}/namespaces/pn/tables" if prefix else "/v1/namespaces/nd/tables"
        r = http.post(path, json={"name": "bad", "location": location, "schema": ICEBERG_SCHEMA})
        assert r.status_code == 400 and "another Iceberg catalog prefix" in r.text, r.text
    ok(http.post("/v1/p/namespaces/pn/tables", json={"name": "ok", "location": warehouse + "/p~/pn/own",
                                                      "schema": ICEBERG_SCHEMA}))

    # The other way round: a namespace is not made where its directory lies in a table's location (chosen before the
    # namespace existed), whichever protocol's table or namespace.
    ok(http.post("/v1/namespaces/nd/tables", json={"name": "early", "location": warehouse + "/later",
                                                   "schema": ICEBERG_SCHEMA}))
    ok(http.post(f"{LANCE_TABLE}/lnd$early/declare", json={"location": warehouse + "/later2"}))
    for r in (http.post("/v1/namespaces", json={"namespace": ["later"]}),
              http.post("/v1/namespaces", json={"namespace": ["nd", "chosen"]}),   # table w is at nd/chosen
              http.post(f"{LANCE_NS}/later/create", json={}), http.post(f"{LANCE_NS}/later2/create", json={}),
              http.post("/v1/namespaces", json={"namespace": ["later2"]})):
        assert r.status_code == 400 and "lies within a table's location" in r.text, r.text
    assert http.get("/v1/namespaces/later").status_code == 404
    assert http.post(f"{LANCE_NS}/later2/exists", json={}).status_code == 404
    ok(http.post("/v1/namespaces", json={"namespace": ["lat"]}))   # a name beside it, not inside, is fine

def test_set_location_in_a_transaction_keeps_locations_exclusive(http):
    ok(http.post("/v1/namespaces", json={"namespace": ["tx"]}))
    a = ok(http.post("/v1/namespaces/tx/tables", json={"name": "a", "schema": ICEBERG_SCHEMA}))
    ok(http.post("/v1/namespaces/tx/tables", json={"name": "b", "schema": ICEBERG_SCHEMA}))
    a_dir = to_local_path(a["metadata"]["location"])
    before = sorted(a_dir.rglob("*"))
    r = http.post("/v1/transactions/commit", json={"table-changes": [
        {"identifier": {"namespace": ["tx"], "name": "b"}, "requirements": [],
         "updates": [{"action": "set-location", "location": a["metadata"]["location"] + "/b"}]}]})
    overlap_refused(r)
    assert sorted(a_dir.rglob("*")) == before   # nothing written into a's directory


@pytest.mark.parametrize("location", ["s3://[x/y", "file://[x/y", "http://[::1/x"])
def test_locations_that_are_no_uri_are_bad_requests(http, location):
    ok(http.post("/v1/namespaces", json={"namespace": ["uri"]}))
    r = http.post("/v1/namespaces/uri/tables", json={"name": "t", "location": location, "schema": ICEBERG_SCHEMA})
    assert r.status_code == 400, r.text
    ok(http.post("/v1/namespaces/uri/tables", json={"name": "u", "schema": ICEBERG_SCHEMA}))
    r = http.post("/v1/namespaces/uri/tables/u", json={"requirements": [], "updates": [
        {"action": "set-location", "location": location}]})
    assert r.status_code == 400, r.text
    ok(http.post(f"{LANCE_NS}/uri/create", json={}))
    r = http.post(f"{LANCE_TABLE}/uri$t/declare", json={"location": location})
    assert (r.status_code, r.json()["code"]) == (400, 13), r.text


def test_a_drop_deletes_no_files_another_table_lives_in(http, database_url):
    """Rows from before locations were exclusive may overlap: dropping one must not delete the other's files."""
    ok(http.post(f"{LANCE_NS}/dd/create", json={}))
    outer = ok(http.post(f"{LANCE_TABLE}/dd$outer/declare", json={}))["location"]
    ok(http.post(f"{LANCE_TABLE}/dd$outer/version/create", json={"version": 1, "manifest_path": stage(outer, 1)}))
    inner = outer + "/inner"
    (to_local_path(inner) / "data").mkdir(parents=True)
    (to_local_path(inner) / "data" / "keep.lance").write_bytes(b"x")
    sql(database_url, "INSERT INTO tables (table_id, realm, catalog, namespace, name, format, location,"
                      " location_key) VALUES ($1, 'lance', '', 'dd', 'legacy', 'lance', $2, $3)",
        uuid.uuid4(), inner, location_key(inner))
    assert http.post(f"{LANCE_TABLE}/dd$outer/drop", json={}).status_code == 200
    time.sleep(0.3)  # the clean-up runs after the answer
    assert (to_local_path(inner) / "data" / "keep.lance").read_bytes() == b"x"


def _race(first, second) -> tuple[int, int]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(first), pool.submit(second)
        return a.result().status_code, b.result().status_code


def test_namespace_drop_racing_a_new_table_or_child_leaves_no_orphan(service):
    with httpx.Client(base_url=service, timeout=60) as a, httpx.Client(base_url=service, timeout=60) as b:
        for i in range(25):
            ns = f"race{i}"
            ok(a.post(f"{LANCE_NS}/{ns}/create", json={}))
            child = "table" if i % 2 else "namespace"
            create = functools.partial(a.post, f"{LANCE_TABLE}/{ns}$t/declare" if child == "table" else
                                        f"{LANCE_NS}/{ns}$c/create", json={})
            created, dropped = _race(create, functools.partial(b.post, f"{LANCE_NS}/{ns}/drop", json={}))
            # Either the child came first (the drop finds it: 409 NamespaceNotEmpty) or the drop did (the child's
            # namespace is gone: 404), never both.
            assert (created, dropped) in ((200, 409), (404, 200)), (child, created, dropped)
            if dropped == 200:
                assert a.post(f"{LANCE_TABLE}/{ns}$t/describe", json={}).status_code == 404
                assert a.post(f"{LANCE_NS}/{ns}$c/describe", json={}).status_code == 404


def test_iceberg_namespace_drop_racing_a_new_child_leaves_no_orphan(service):
    with httpx.Client(base_url=service, timeout=60) as a, httpx.Client(base_url=service, timeout=60) as b:
        for i in range(25):
            ns = f"irace{i}"
            ok(a.post("/v1/namespaces", json={"namespace": [ns]}))
            created, dropped = _race(functools.partial(a.post, "/v1/namespaces", json={"namespace": [ns, "c"]}),
                                     functools.partial(b.delete, f"/v1/namespaces/{ns}"))
            assert (created, dropped) in ((200, 409), (404, 204)), (created, dropped)
            if dropped == 204:
                assert a.get(f"/v1/namespaces/{ns}%1Fc").status_code == 404


def test_catalog_delete_racing_a_new_schema_leaves_no_orphan(service):
    with httpx.Client(base_url=service, timeout=60) as a, httpx.Client(base_url=service, timeout=60) as b:
        for i in range(25):
            catalog = f"race{i}"
            ok(a.post(f"{UC}/catalogs", json={"name": catalog}))
            created, deleted = _race(functools.partial(a.post, f"{UC}/schemas", json={"name": "s",
                                                                                       "catalog_name": catalog}),
                                     functools.partial(b.delete, f"{UC}/catalogs/{catalog}"))
            assert (created, deleted) in ((200, 400), (404, 200)), (created, deleted)  # 400 CATALOG_NOT_EMPTY
            if deleted == 200:
                assert a.get(f"{UC}/schemas/{catalog}.s").status_code == 404
                ok(a.post(f"{UC}/catalogs", json={"name": catalog}))  # and re-created, it has no schema
                assert ok(a.get(f"{UC}/schemas", params={"catalog_name": catalog}))["schemas"] == []


@pytest.mark.parametrize("token", ["AAAA", "YQBi", "%%%", "not base64!"])
def test_page_tokens_we_never_issued_are_bad_requests(http, token):
    ok(http.post(f"{UC}/catalogs", json={"name": "c" + uuid.uuid4().hex[:8]}))
    r = http.get(f"{LANCE_NS}/$/list", params={"page_token": token})
    assert (r.status_code, r.json()["code"]) == (400, 13), r.text
    r = http.get(f"{LANCE_TABLE}", params={"page_token": token})
    assert (r.status_code, r.json()["code"]) == (400, 13), r.text
    r = http.get("/v1/namespaces", params={"pageToken": token})
    assert (r.status_code, r.json()["error"]["type"]) == (400, "BadRequestException"), r.text
    r = http.get(f"{UC}/catalogs", params={"page_token": token})
    assert (r.status_code, r.json()["error_code"]) == (400, "INVALID_PARAMETER_VALUE"), r.text


def test_lance_pages_end_without_a_token(http):
    ok(http.post(f"{LANCE_NS}/pg/create", json={}))
    for i in range(4):
        ok(http.post(f"{LANCE_NS}/pg$n{i}/create", json={}))
        ok(http.post(f"{LANCE_TABLE}/pg$t{i}/declare", json={}))
    first = ok(http.get(f"{LANCE_NS}/pg/list", params={"limit": 2}))
    last = ok(http.get(f"{LANCE_NS}/pg/list", params={"limit": 2, "page_token": first["page_token"]}))
    assert first["namespaces"] + last["namespaces"] == ["n0", "n1", "n2", "n3"]
    assert "page_token" not in last  # "there are more results available" no longer holds
    tables = ok(http.get(f"{LANCE_NS}/pg/table/list", params={"limit": 4}))
    assert tables == {"tables": ["t0", "t1", "t2", "t3"]}


def test_lance_list_all_tables_pages_in_listing_order(http):
    # A namespace holding a character below U+001E sorts after its prefix as a pair but before it as a joined
    # string: paging by the joined string skipped tables.
    for ns in ["a", "a%01"]:
        ok(http.post(f"{LANCE_NS}/{ns}/create", json={}))
        for t in ["x", "y"]:
            ok(http.post(f"{LANCE_TABLE}/{ns}${t}/declare", json={}))
    seen, token = [], None
    while True:
        page = ok(http.get(LANCE_TABLE, params={"limit": 1, **({"page_token": token} if token else {})}))
        seen += page["tables"]
        token = page.get("page_token")
        if not token:
            break
    assert sorted(seen) == sorted(["a$x", "a$y", "a\x01$x", "a\x01$y"]) and len(seen) == 4


def test_plus_in_a_path_is_a_space_as_java_clients_encode_it(http):
    """Java's Iceberg REST client sends a space in a path segment as `+` and a `+` as `%2B` (the reference server
    decodes them so); lance_namespace's Python client sends a space as `+` too."""
    ok(http.post("/v1/namespaces", json={"namespace": ["n s"]}))
    ok(http.post("/v1/namespaces/n+s/tables", json={"name": "sp ace", "schema": ICEBERG_SCHEMA}))
    ok(http.post("/v1/namespaces/n%20s/tables", json={"name": "a+b", "schema": ICEBERG_SCHEMA}))
    assert ok(http.get("/v1/namespaces/n+s/tables/sp+ace"))["metadata"]["location"]
    assert ok(http.get("/v1/namespaces/n%20s/tables/sp%20ace"))["metadata"]["location"]
    assert ok(http.get("/v1/namespaces/n+s/tables/a%2Bb"))["metadata"]["location"]
    assert http.get("/v1/namespaces/n+s/tables/a+b").status_code == 404   # that is "a b"
    ok(http.post(f"{LANCE_NS}/l+s/create", json={}))
    ok(http.post(f"{LANCE_TABLE}/l+s$t+1/declare", json={}))
    assert ok(http.get(f"{LANCE_NS}/l%20s/table/list")) == {"tables": ["t 1"]}


def test_lance_names_with_a_slash_are_refused(http):
    """A route's %2F is decoded before routing: a name holding `/` could be declared in a batch but never
    addressed again."""
    ok(http.post(f"{LANCE_NS}/sl2/create", json={}))
    r = http.post(f"{LANCE_TABLE}/batch-commit", json={"operations": [
        {"declare_table": {"id": ["sl2", "a/b"]}}]})
    assert r.status_code == 400 and r.json()["code"] == 13, r.text
    assert ok(http.get(f"{LANCE_NS}/sl2/table/list")) == {"tables": []}


def test_a_refused_create_leaves_no_files(http, config):
    """A create refused on its name (here: taken; or a lost race for it) writes its metadata file first, under a
    fresh location: it is removed with the directories it made."""
    ok(http.post("/v1/namespaces", json={"namespace": ["rc"]}))
    ok(http.post("/v1/namespaces/rc/tables", json={"name": "t1", "schema": ICEBERG_SCHEMA}))
    ok(http.post("/v1/namespaces/rc/views", json={"name": "v1", **VIEW}))
    warehouse = to_local_path(config.warehouse_uri)
    before = sorted(warehouse.rglob("*"))
    for path, body in [("tables", {"name": "t1", "schema": ICEBERG_SCHEMA}),
                       ("views", {"name": "v1", **VIEW}),
                       ("views", {"name": "t1", **VIEW})]:
        assert http.post(f"/v1/namespaces/rc/{path}", json=body).status_code == 409
    assert sorted(warehouse.rglob("*")) == before


def test_a_table_whose_metadata_file_is_gone_can_still_be_dropped(config):
    """A metadata file removed or damaged behind the catalog's back: loads and commits say so (and how to get out),
    and the table can be dropped, so that neither it nor its namespace is stuck for good."""
    with EmbeddedService(config) as base, httpx.Client(base_url=base, timeout=30) as http:
        ok(http.post("/v1/namespaces", json={"namespace": ["broken"]}))
        gone = ok(http.post("/v1/namespaces/broken/tables", json={"name": "gone", "schema": ICEBERG_SCHEMA}))
        bad = ok(http.post("/v1/namespaces/broken/tables", json={"name": "bad", "schema": ICEBERG_SCHEMA}))
        mended = ok(http.post("/v1/namespaces/broken/tables", json={"name": "mended", "schema": ICEBERG_SCHEMA}))
    to_local_path(gone["metadata-location"]).unlink()
    to_local_path(bad["metadata-location"]).write_bytes(b"{not json")
    to_local_path(mended["metadata-location"]).write_bytes(b"{not json")
    with EmbeddedService(config) as base, httpx.Client(base_url=base, timeout=30) as http:   # reads them afresh
        for name in ("gone", "bad"):
            r = http.get(f"/v1/namespaces/broken/tables/{name}")
            assert r.status_code == 503 and "restore the file, or drop the table" in r.text, r.text
            r = http.post(f"/v1/namespaces/broken/tables/{name}", json={"requirements": [], "updates": [
                {"action": "set-properties", "updates": {"k": "v"}}]})
            assert r.status_code == 503 and "restore the file, or drop the table" in r.text, r.text
        # Restored, the file is read again (within a reload interval), without waiting for the table to go idle.
        assert http.get("/v1/namespaces/broken/tables/mended").status_code == 503
        to_local_path(mended["metadata-location"]).write_bytes(orjson.dumps(mended["metadata"]))
        deadline = time.monotonic() + 5
        while (r := http.get("/v1/namespaces/broken/tables/mended")).status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ok(r)["metadata"]["table-uuid"] == mended["metadata"]["table-uuid"]
        assert http.delete("/v1/namespaces/broken/tables/mended").status_code == 204
        assert http.delete("/v1/namespaces/broken/tables/gone").status_code == 204
        assert http.delete("/v1/namespaces/broken/tables/bad", params={"purgeRequested": "true"}).status_code == 204
        assert http.get("/v1/namespaces/broken/tables/gone").status_code == 404
        assert http.delete("/v1/namespaces/broken").status_code == 204


def test_tables_from_before_location_keys_are_keyed_as_every_reader_spells_them(config, database_url):
    """Rows written before migration 007 have no location key; they get one at start-up, spelled as our file I/O
    resolves the location (a file:// host, `..`, `//`, percent-escapes, an upper-case scheme), so they still
    guard their place."""
    warehouse = to_local_path(config.warehouse_uri)
    spellings = {"t_host": f"file://localhost{warehouse}/old/t_host", "t_dots": f"{warehouse}/old/zz/../t_dots",
                 "t_slashes": f"{warehouse}//old/t_slashes", "t_escaped": f"file://{warehouse}/old/my%20t",
                 "t_upper": f"FILE://{warehouse}/old/t_upper"}
    plain = {"t_host": "t_host", "t_dots": "t_dots", "t_slashes": "t_slashes", "t_escaped": "my t",
             "t_upper": "t_upper"}
    with EmbeddedService(config):   # migrated
        pass
    for name, location in spellings.items():
        sql(database_url, "INSERT INTO tables (table_id, realm, catalog, namespace, name, format, location)"
                          " VALUES ($1, 'lance', '', 'old', $2, 'lance', $3)", uuid.uuid4(), name, location)
    with EmbeddedService(config) as base, httpx.Client(base_url=base, timeout=30) as http:
        ok(http.post(f"{LANCE_NS}/new/create", json={}))
        for name, directory in plain.items():
            r = http.post(f"{LANCE_TABLE}/new${name}/declare", json={"location": f"{warehouse}/old/{directory}"})
            overlap_refused(r)


# -- a dropped table's location stays its own until its files are deleted ------------------------------------------


@pytest.fixture
def slow_deletions(monkeypatch):
    """Every purge (of a whole location, or of the files a metadata reaches) waits until the test lets it go;
    `started` is set when one begins."""
    import threading

    from storage.files import FileIO

    started, go = threading.Event(), threading.Event()
    delete_tree_sync, delete_listed_sync = FileIO.delete_tree_sync, FileIO.delete_listed_sync

    def waiting(self, location: str, stop=None) -> None:
        started.set()
        go.wait(30)
        delete_tree_sync(self, location, stop)

    def waiting_listed(self, location: str, uris: list[str], stop=None) -> None:
        started.set()
        go.wait(30)
        delete_listed_sync(self, location, uris, stop)
    monkeypatch.setattr(FileIO, "delete_tree_sync", waiting)
    monkeypatch.setattr(FileIO, "delete_listed_sync", waiting_listed)
    yield started, go
    go.set()


def _eventually(check, what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_purged_tables_location_is_not_reused_until_its_files_are_gone(config, http, slow_deletions):
    """Spark's DROP TABLE ... PURGE, then CREATE TABLE ... LOCATION the same path: the purge runs after the drop
    is answered, and must not delete the new table's files. The create is refused while the purge runs (with a
    reason to retry), and succeeds once it has ended; the new table's files stay."""
    started, go = slow_deletions
    location = f"{config.warehouse_uri}/ice/explicit"
    ok(http.post("/v1/namespaces", json={"namespace": ["ice"]}))
    ok(http.post("/v1/namespaces/ice/tables", json={"name": "old", "location": location, "schema": ICEBERG_SCHEMA}))
    assert http.delete("/v1/namespaces/ice/tables/old", params={"purgeRequested": "true"}).status_code == 204
    assert started.wait(10), "the purge did not start"

    create = {"name": "new", "location": location, "schema": ICEBERG_SCHEMA}
    r = http.post("/v1/namespaces/ice/tables", json=create)
    overlap_refused(r)
    assert "still being deleted" in r.text and "retry" in r.text
    # Lance and Delta check the same claim: no other protocol's table may take the location meanwhile.
    ok(http.post(f"{LANCE_NS}/lw/create", json={}))
    overlap_refused(http.post(f"{LANCE_TABLE}/lw$squat/declare", json={"location": location + "/inside"}))

    go.set()
    _eventually(lambda: not to_local_path(location).exists(), "the purge did not finish")
    _eventually(lambda: http.post("/v1/namespaces/ice/tables", json=create).status_code == 200,
                "the location was not released after the purge")
    metadata = http.get("/v1/namespaces/ice/tables/new").json()["metadata-location"]
    time.sleep(0.3)  # anything still running from the purge would have deleted it by now
    assert to_local_path(metadata).exists()
    assert sql(config.database_url, "SELECT count(*) FROM purges")[0][0] == 0


def test_a_lance_drop_claims_its_location_until_its_files_are_gone(config, http, slow_deletions):
    started, go = slow_deletions
    ok(http.post(f"{LANCE_NS}/lw/create", json={}))
    location = ok(http.post(f"{LANCE_TABLE}/lw$old/declare", json={}))["location"]
    ok(http.post(f"{LANCE_TABLE}/lw$old/version/create", json={"version": 1, "manifest_path": stage(location, 1)}))
    ok(http.post(f"{LANCE_TABLE}/lw$old/drop", json={}))
    assert started.wait(10), "the drop's deletion did not start"
    # Registering the files about to be deleted would lose the new table's versions to the deletion.
    overlap_refused(http.post(f"{LANCE_TABLE}/lw$new/register", json={"location": location}))
    assert http.post(f"{LANCE_TABLE}/lw$new/declare", json={"location": location}).status_code == 400
    go.set()
    _eventually(lambda: http.post(f"{LANCE_TABLE}/lw$new/declare", json={"location": location}).status_code == 200,
                "the location was not released after the drop's deletion")


def test_a_deletion_a_crash_interrupted_is_resumed_at_start_up(config):
    """The claim outlives the process that was deleting: the next start deletes the files and frees the place."""
    leftover = to_local_path(f"{config.warehouse_uri}/ice/crashed")
    (leftover / "data").mkdir(parents=True)
    (leftover / "data" / "f.parquet").write_bytes(b"x")
    location = f"{config.warehouse_uri}/ice/crashed"
    sql(config.database_url, "INSERT INTO purges (location_key, location) VALUES ($1, $2)", location_key(location),
        location)
    with EmbeddedService(config) as base:
        _eventually(lambda: not leftover.exists(), "the interrupted deletion was not resumed")
        _eventually(lambda: sql(config.database_url, "SELECT count(*) FROM purges")[0][0] == 0,
                    "the claim was not released")
        with httpx.Client(base_url=base, timeout=30) as client:
            ok(client.post("/v1/namespaces", json={"namespace": ["ice"]}))
            ok(client.post("/v1/namespaces/ice/tables", json={"name": "t", "location": location,
                                                              "schema": ICEBERG_SCHEMA}))


def test_a_purge_without_gc_claims_nothing_and_a_failed_one_never_deletes_kept_files(config, monkeypatch):
    """`gc.enabled=false`: the purge deletes only files the metadata names (names no new table writes), so the
    location is not claimed, and nothing retried later may delete the data files it keeps."""
    from storage.files import FileIO

    location = f"{config.warehouse_uri}/ice/nogc"
    shared = to_local_path(location) / "data" / "shared-with-another-table.parquet"
    failures = {"left": 1}
    delete_within_sync = FileIO.delete_within_sync

    def flaky(self, uri, within, prune=False):
        if failures["left"]:
            failures["left"] -= 1
            raise OSError("transient object-store error")
        return delete_within_sync(self, uri, within, prune)
    monkeypatch.setattr(FileIO, "delete_within_sync", flaky)
    create = {"name": "t", "location": location, "schema": ICEBERG_SCHEMA, "properties": {"gc.enabled": "false"}}
    with EmbeddedService(config) as base, httpx.Client(base_url=base, timeout=30) as http:
        ok(http.post("/v1/namespaces", json={"namespace": ["ice"]}))
        ok(http.post("/v1/namespaces/ice/tables", json=create))
        shared.parent.mkdir(parents=True, exist_ok=True)
        shared.write_bytes(b"x")
        assert http.delete("/v1/namespaces/ice/tables/t", params={"purgeRequested": "true"}).status_code == 204
        assert sql(config.database_url, "SELECT count(*) FROM purges")[0][0] == 0
        ok(http.post("/v1/namespaces/ice/tables", json={**create, "name": "again"}))
    with EmbeddedService(config):   # a restart resumes claims: there is none to resume
        time.sleep(1)
    assert shared.exists()


def test_a_running_deletion_keeps_its_claim_and_is_not_started_twice(config, monkeypatch, slow_deletions):
    """A deletion that outlasts the retry interval renews its claim: `Resumer.resume_forever` leaves it alone (a second
    deletion would outlive the claim and delete the files of a table created once the first had ended)."""
    from coordinator import purges as registry

    monkeypatch.setattr(registry, "PURGE_RETRY_S", 1)   # renewed every 0.1 s, resumed after 1 s unrenewed
    started, go = slow_deletions
    location = f"{config.warehouse_uri}/ice/slow"
    create = {"name": "new", "location": location, "schema": ICEBERG_SCHEMA}
    with EmbeddedService(config) as base, httpx.Client(base_url=base, timeout=30) as http:
        ok(http.post("/v1/namespaces", json={"namespace": ["ice"]}))
        ok(http.post("/v1/namespaces/ice/tables", json={**create, "name": "old"}))
        assert http.delete("/v1/namespaces/ice/tables/old", params={"purgeRequested": "true"}).status_code == 204
        assert started.wait(10)
        started.clear()
        time.sleep(2.5)   # two retry intervals
        assert not started.is_set(), "a second deletion of the same location started"
        overlap_refused(http.post("/v1/namespaces/ice/tables", json=create))
        go.set()
        _eventually(lambda: http.post("/v1/namespaces/ice/tables", json=create).status_code == 200,
                    "the location was not released after the deletion")
        metadata = http.get("/v1/namespaces/ice/tables/new").json()["metadata-location"]
        time.sleep(1.5)
        assert to_local_path(metadata).exists()


def test_a_purge_of_a_chosen_place_resumes_with_the_same_reach(config, monkeypatch):
    """A purge of a location the client chose deletes what the metadata reaches (its claim names the metadata
    file); interrupted half-way, it is resumed at the next start with the same reach: the rest of the table's files
    go, and a file it never named stays."""
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    from storage.files import FileIO

    location = f"{config.warehouse_uri}/ice/chosen"
    foreign = to_local_path(location) / "data" / "not-the-tables.parquet"
    runs = []
    delete_listed_sync = FileIO.delete_listed_sync

    def dies_half_way_once(self, where, uris, stop=None):
        runs.append(len(uris))
        if len(runs) == 1:
            delete_listed_sync(self, where, uris[:2], stop)
            raise OSError("the object store went away")
        delete_listed_sync(self, where, uris, stop)
    monkeypatch.setattr(FileIO, "delete_listed_sync", dies_half_way_once)
    with EmbeddedService(config) as base:
        catalog = load_catalog("c", type="rest", uri=base)
        catalog.create_namespace("ice")
        table = catalog.create_table("ice.t", Schema(NestedField(1, "x", LongType(), required=False)),
                                     location=location)
        for i in range(3):
            table.append(pa.table({"x": pa.array([i], pa.int64())}))
        foreign.write_bytes(b"x")
        own = {p for p in to_local_path(location).rglob("*") if p.is_file()} - {foreign}
        assert len(own) >= 10   # 3 data files, manifests, manifest lists, metadata files
        catalog.purge_table("ice.t")
        _eventually(lambda: runs, "the purge did not start")
        time.sleep(0.2)
        assert sql(config.database_url, "SELECT metadata_location FROM purges")[0][0] == table.metadata_location
        assert 0 < sum(p.exists() for p in own) < len(own)
    with EmbeddedService(config):
        _eventually(lambda: sql(config.database_url, "SELECT count(*) FROM purges")[0][0] == 0,
                    "the interrupted purge was not resumed")
        assert not any(p.exists() for p in own) and foreign.exists()


def test_delete_after_commit_deletes_only_in_the_tables_own_place(http):
    """`write.metadata.delete-after-commit.enabled` deletes the metadata files that fell off the log. A registered
    table's log is the client's word: one naming another table's current metadata file must not delete it."""
    import json

    from storage.files import to_local_path

    assert http.post("/v1/namespaces", json={"namespace": ["victim"]}).status_code == 200
    assert http.post("/v1/namespaces", json={"namespace": ["att"]}).status_code == 200
    r = http.post("/v1/namespaces/victim/tables", json={"name": "v", "schema": ICEBERG_SCHEMA})
    assert r.status_code == 200, r.text
    victim_meta = r.json()["metadata-location"]
    r = http.post("/v1/namespaces/att/tables", json={"name": "a", "schema": ICEBERG_SCHEMA})
    own = r.json()
    meta = dict(own["metadata"])
    meta["metadata-log"] = [{"timestamp-ms": 0, "metadata-file": victim_meta}]
    meta["properties"] = {"write.metadata.delete-after-commit.enabled": "true",
                          "write.metadata.previous-versions-max": "1"}
    meta["table-uuid"] = "11111111-1111-1111-1111-111111111111"
    crafted = own["metadata-location"].rsplit("/", 1)[0] + "/99999-crafted.metadata.json"
    to_local_path(crafted).write_text(json.dumps(meta))
    assert http.delete("/v1/namespaces/att/tables/a").status_code == 204   # drop the row (no purge), keep files
    r = http.post("/v1/namespaces/att/register", json={"name": "b", "metadata-location": crafted})
    assert r.status_code == 200, r.text
    r = http.post("/v1/namespaces/att/tables/b", json={"requirements": [], "updates": [
        {"action": "set-properties", "updates": {"x": "1"}}]})
    assert r.status_code == 200, r.text
    time.sleep(1)
    assert to_local_path(victim_meta).exists(), "another table's current metadata file was deleted"


def test_a_link_planted_in_a_tables_metadata_directory_leads_no_commit_elsewhere(http, tmp_path):
    """A commit writes its metadata file from within the table's place, following no link there: with `metadata/`
    swapped for a link, the commit is refused as not applied (nothing is written where the link points), and
    once the directory is back it goes through."""
    import os
    from pathlib import Path
    ok(http.post("/v1/namespaces", json={"namespace": ["ml"]}))
    t = ok(http.post("/v1/namespaces/ml/tables", json={"name": "t", "schema": ICEBERG_SCHEMA}))
    metadata = Path(to_local_path(t["metadata-location"])).parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(metadata, metadata.with_name("metadata.aside"))
    os.symlink(elsewhere, metadata)
    body = {"requirements": [], "updates": [{"action": "set-properties", "updates": {"k": "v"}}]}
    r = http.post("/v1/namespaces/ml/tables/t", json=body)
    assert r.status_code == 503, r.text
    assert os.listdir(elsewhere) == []
    os.unlink(metadata)
    os.rename(metadata.with_name("metadata.aside"), metadata)
    # (Its actor may have reloaded while the link was there: the table was unreadable, and is read again.)
    deadline = time.monotonic() + 5
    while (r := http.get("/v1/namespaces/ml/tables/t")).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ok(r)["metadata-location"] == t["metadata-location"]
    assert ok(http.post("/v1/namespaces/ml/tables/t", json=body))["metadata"]["properties"]["k"] == "v"
