"""Unity Catalog API for catalog-managed Delta tables, over real HTTP against the running service.

Every error row of the seed's tables (`shared/specs/seeds/003_4bd097b12e79fdf1.txt`) has a case here that sends
that bad input, checks status and `error_code`, and checks that nothing changed. PERMISSION_DENIED rows are
not reachable: the service has no authentication yet.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from dataclasses import replace
from unittest.mock import ANY

import httpx

import coordinator.delta
from api.server import EmbeddedService
from tests.support import sql

from .conftest import (COLUMNS, FIRST, UC, commit_info, first_commit, local_path, table_properties,
                       write_log_file)


def error(r: httpx.Response, status: int, code: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error_code"] == code, body
    assert body["message"] and isinstance(body["details"], list)
    return body


def snapshot(uc: UC, table: dict) -> tuple:
    t = uc.get(f"/tables/{table['catalog_name']}.{table['schema_name']}.{table['name']}")
    return t.status_code, t.json(), uc.commits(table)


def test_public_surface():
    assert sorted(coordinator.delta.__all__) == [
        "CommitInfo", "CommitRequest", "CreateCatalog", "CreateSchema", "CreateStagingTable", "CreateTable",
        "DeltaService", "DeltaTable", "GetCommitsRequest", "Metadata", "MetricsRequest", "StagingTable"]
    for name in coordinator.delta.__all__:
        assert getattr(coordinator.delta, name)


# -- catalogs and schemas ------------------------------------------------------------------------------------


def test_catalogs_and_schemas(uc):
    r = uc.post("/catalogs", json={"name": "main", "comment": "prod", "properties": {"team": "data"}})
    assert r.status_code == 200, r.text
    cat = r.json()
    assert cat["name"] == "main" and cat["comment"] == "prod" and cat["properties"] == {"team": "data"}
    assert cat["id"] and cat["created_at"] > 0 and cat["owner"]
    assert uc.get("/catalogs/main").json() == cat
    error(uc.post("/catalogs", json={"name": "main"}), 409, "CATALOG_ALREADY_EXISTS")
    for name in ["a.b", "", "has space", "a/b", "x\x01"]:
        error(uc.post("/catalogs", json={"name": name}), 400, "INVALID_PARAMETER_VALUE")
    error(uc.post("/catalogs", json={"name": "rooted", "storage_root": "s3://b/x"}), 400, "INVALID_PARAMETER_VALUE")
    error(uc.post("/catalogs", json={"comment": "no name"}), 400, "INVALID_PARAMETER_VALUE")
    error(uc.get("/catalogs/nope"), 404, "CATALOG_DOES_NOT_EXIST")

    for n in ["c1", "c2", "c3"]:
        assert uc.post("/catalogs", json={"name": n}).status_code == 200
    first = uc.get("/catalogs", params={"max_results": 2}).json()
    assert [c["name"] for c in first["catalogs"]] == ["c1", "c2"]
    rest = uc.get("/catalogs", params={"max_results": 2, "page_token": first["next_page_token"]}).json()
    # The spec: next_page_token is "absent if there are no more pages", also when the last page is exactly full.
    assert [c["name"] for c in rest["catalogs"]] == ["c3", "main"] and "next_page_token" not in rest
    assert uc.get("/catalogs", params={"max_results": 4}).json().keys() == {"catalogs"}
    error(uc.get("/catalogs", params={"max_results": -1}), 400, "INVALID_PARAMETER_VALUE")

    r = uc.post("/schemas", json={"name": "default", "catalog_name": "main", "comment": "c"})
    assert r.status_code == 200, r.text
    schema = r.json()
    assert schema["full_name"] == "main.default" and schema["catalog_name"] == "main" and schema["schema_id"]
    assert uc.get("/schemas/main.default").json() == schema
    error(uc.post("/schemas", json={"name": "default", "catalog_name": "main"}), 409, "SCHEMA_ALREADY_EXISTS")
    error(uc.post("/schemas", json={"name": "s", "catalog_name": "nope"}), 404, "CATALOG_DOES_NOT_EXIST")
    error(uc.get("/schemas/main.nope"), 404, "SCHEMA_DOES_NOT_EXIST")
    error(uc.get("/schemas/nope.default"), 404, "CATALOG_DOES_NOT_EXIST")
    error(uc.get("/schemas/main"), 400, "INVALID_PARAMETER_VALUE")
    assert [s["name"] for s in uc.get("/schemas", params={"catalog_name": "main"}).json()["schemas"]] == [
        "default"]
    error(uc.get("/schemas"), 400, "INVALID_PARAMETER_VALUE")
    error(uc.get("/schemas", params={"catalog_name": "nope"}), 404, "CATALOG_DOES_NOT_EXIST")

    # Not empty: refused and nothing dropped; force drops the schema's tables through their actors.
    table = uc.create_managed("t", "main", "default")
    error(uc.delete("/catalogs/main"), 400, "CATALOG_NOT_EMPTY")
    error(uc.delete("/schemas/main.default"), 400, "SCHEMA_NOT_EMPTY")
    error(uc.delete("/schemas/main.default", params={"force": "maybe"}), 400, "INVALID_PARAMETER_VALUE")
    assert uc.get("/tables/main.default.t").status_code == 200
    assert uc.delete("/catalogs/main", params={"force": "true"}).status_code == 200
    error(uc.get("/catalogs/main"), 404, "CATALOG_DOES_NOT_EXIST")
    error(uc.get_json("/delta/commits", {"table_id": table["table_id"], "table_uri": table["storage_location"]}),
          404, "TABLE_DOES_NOT_EXIST")
    error(uc.delete("/catalogs/main"), 404, "CATALOG_DOES_NOT_EXIST")
    assert uc.delete("/catalogs/c1").status_code == 200


# -- staging tables and table creation -----------------------------------------------------------------------


def test_create_managed_table_seed_flow(uc):
    uc.setup_schema()
    st = uc.staging("my_table")
    assert st["name"] == "my_table" and st["catalog_name"] == "main" and st["schema_name"] == "default"
    table_id = str(uuid.UUID(st["id"]))
    assert local_path(st["staging_location"]).name == table_id
    # A staging table is not a table yet.
    error(uc.get("/tables/main.default.my_table"), 404, "TABLE_DOES_NOT_EXIST")
    error(uc.get_json("/delta/commits", {"table_id": table_id, "table_uri": st["staging_location"]}),
          404, "TABLE_DOES_NOT_EXIST")

    write_log_file(st["staging_location"], FIRST, first_commit(table_id))
    request = {"name": "my_table", "catalog_name": "main", "schema_name": "default", "table_type": "MANAGED",
               "data_source_format": "DELTA", "storage_location": st["staging_location"] + "/",
               "columns": COLUMNS, "properties": table_properties(table_id), "comment": "events"}
    r = uc.post("/tables", json=request)
    assert r.status_code == 200, r.text
    info = r.json()
    for key in ("name", "catalog_name", "schema_name", "table_type", "data_source_format", "columns",
                "properties", "comment"):
        assert info[key] == request[key], key
    assert info["table_id"] == table_id and info["storage_location"] == st["staging_location"]
    assert info["owner"] and info["created_by"] and info["created_at"] > 0 and info["updated_at"] > 0
    assert uc.get("/tables/main.default.my_table").json() == info
    listed = uc.get("/tables", params={"catalog_name": "main", "schema_name": "default"}).json()
    assert listed == {"tables": [info]}
    # A fresh table: version 0, nothing unpublished.
    assert uc.commits(info) == {"commits": [], "latest_table_version": 0}

    # The staging location is used now, and the name is taken.
    error(uc.post("/tables", json=request), 400, "TABLE_ALREADY_EXISTS")
    error(uc.post("/staging-tables", json={"name": "my_table", "catalog_name": "main", "schema_name": "default"}),
          400, "TABLE_ALREADY_EXISTS")
    error(uc.post("/tables", json={**request, "name": "other"}), 400, "INVALID_PARAMETER_VALUE")



def test_update_catalog_and_schema(uc):
    """UC OSS PATCH: a comment sent replaces the comment, properties sent replace the properties, what is not sent
    stays; a rename is refused (400) and a missing catalog or schema is 404, each changing nothing."""
    assert uc.post("/catalogs", json={"name": "main", "comment": "prod", "properties": {"team": "data"}}
                   ).status_code == 200
    assert uc.post("/schemas", json={"name": "s", "catalog_name": "main", "properties": {"a": "1"}}
                   ).status_code == 200
    for path, key in [("/catalogs/main", "catalogs"), ("/schemas/main.s", "schemas")]:
        before = uc.get(path).json()
        r = uc.patch(path, json={"comment": "renamed nothing"})
        assert r.status_code == 200, r.text
        after = r.json()
        assert after["comment"] == "renamed nothing" and after["properties"] == before["properties"]
        assert after["updated_at"] >= before["updated_at"] and uc.get(path).json() == after
        after = uc.patch(path, json={"properties": {"owner_team": "ml"}, "new_name": path.rpartition(".")[2]
                                     .rpartition("/")[2]}).json()
        assert after["properties"] == {"owner_team": "ml"} and after["comment"] == "renamed nothing"
        unchanged = uc.get(path).json()
        body = error(uc.patch(path, json={"new_name": "other", "comment": "x"}), 400, "INVALID_PARAMETER_VALUE")
        assert "renam" in body["message"]
        error(uc.patch(path, json={"properties": {"n": 1}}), 400, "INVALID_PARAMETER_VALUE")
        assert uc.get(path).json() == unchanged
    error(uc.patch("/catalogs/nope", json={"comment": "x"}), 404, "CATALOG_DOES_NOT_EXIST")
    error(uc.patch("/schemas/main.nope", json={"comment": "x"}), 404, "SCHEMA_DOES_NOT_EXIST")
    error(uc.patch("/schemas/nope.s", json={"comment": "x"}), 404, "CATALOG_DOES_NOT_EXIST")

def test_staging_table_errors(uc):
    uc.setup_schema()
    body = {"name": "t", "catalog_name": "main", "schema_name": "default"}
    error(uc.post("/staging-tables", json={**body, "catalog_name": "nope"}), 404, "CATALOG_DOES_NOT_EXIST")
    error(uc.post("/staging-tables", json={**body, "schema_name": "nope"}), 404, "SCHEMA_DOES_NOT_EXIST")
    error(uc.post("/staging-tables", json={"name": "t", "catalog_name": "main"}), 400, "INVALID_PARAMETER_VALUE")
    error(uc.post("/staging-tables", json={**body, "name": "a.b"}), 400, "INVALID_PARAMETER_VALUE")
    uc.create_managed("t")
    error(uc.post("/staging-tables", json=body), 400, "TABLE_ALREADY_EXISTS")
    assert uc.get("/tables", params={"catalog_name": "main", "schema_name": "default"}).json()["tables"][0][
        "name"] == "t"



def test_a_staging_table_goes_with_its_schema(uc):
    """A staging table allocated in a schema that was deleted (and made again under the same name) is gone: it
    cannot become a table of the new schema."""
    uc.setup_schema("main", "gone")
    st = uc.staging("t", schema="gone")
    write_log_file(st["staging_location"], FIRST, first_commit(st["id"]))
    assert uc.delete("/schemas/main.gone").status_code == 200
    uc.setup_schema("main", "gone")
    body = error(uc.post("/tables", json={
        "name": "t", "catalog_name": "main", "schema_name": "gone", "table_type": "MANAGED",
        "data_source_format": "DELTA", "columns": COLUMNS, "storage_location": st["staging_location"],
        "properties": table_properties(st["id"])}), 404, "TABLE_DOES_NOT_EXIST")
    assert "was deleted" in body["message"]
    assert uc.get("/tables/main.gone.t").status_code == 404
    uc.create_managed("t", schema="gone")   # a new staging table in the new schema works

def _bad_logs(table_id: str):
    other = str(uuid.uuid4())
    yield "minReaderVersion", first_commit(table_id, reader=2)
    yield "minWriterVersion", first_commit(table_id, writer=6)
    yield "reader feature catalogManaged", first_commit(table_id, reader_features=("vacuumProtocolCheck",))
    yield "writer feature catalogManaged", first_commit(
        table_id, writer_features=("inCommitTimestamp", "vacuumProtocolCheck"))
    yield "writer feature inCommitTimestamp", first_commit(
        table_id, writer_features=("catalogManaged", "vacuumProtocolCheck"))
    yield "reader feature vacuumProtocolCheck", first_commit(table_id, reader_features=("catalogManaged",))
    yield "io.unitycatalog.tableId", first_commit(table_id, configuration={
        "delta.enableInCommitTimestamps": "true", "io.unitycatalog.tableId": other})
    yield "io.unitycatalog.tableId", first_commit(table_id, configuration={"delta.enableInCommitTimestamps": "true"})
    yield "delta.enableInCommitTimestamps", first_commit(table_id, configuration={
        "io.unitycatalog.tableId": table_id})
    yield "inCommitTimestamp", first_commit(table_id, commit_info=False)
    yield "not a Delta log file", b"{not json\n"
    yield "a protocol action", b'{"commitInfo": {"inCommitTimestamp": 5}}\n'


def test_create_table_errors(uc):
    uc.setup_schema()
    st = uc.staging("t")
    table_id = st["id"]
    good = {"name": "t", "catalog_name": "main", "schema_name": "default", "table_type": "MANAGED",
            "data_source_format": "DELTA", "storage_location": st["staging_location"], "columns": COLUMNS,
            "properties": table_properties(table_id)}

    def refused(body, status, code, says=None):
        e = error(uc.post("/tables", json=body), status, code)
        if says:
            assert says in e["message"], e["message"]
        # Nothing changed: no table, and the staging table is still unused.
        error(uc.get("/tables/main.default.t"), 404, "TABLE_DOES_NOT_EXIST")

    refused(good, 400, "INVALID_PARAMETER_VALUE", "does not exist")  # no 0.json yet: not a Delta table
    for says, data in _bad_logs(table_id):
        write_log_file(st["staging_location"], FIRST, data)
        refused(good, 400, "INVALID_PARAMETER_VALUE", says)
    write_log_file(st["staging_location"], FIRST, first_commit(table_id))

    refused({**good, "catalog_name": "nope"}, 404, "CATALOG_DOES_NOT_EXIST")
    refused({**good, "schema_name": "nope"}, 404, "SCHEMA_DOES_NOT_EXIST")
    unknown = good["storage_location"].rsplit("/", 1)[0] + "/" + str(uuid.uuid4())
    refused({**good, "storage_location": unknown}, 404, "TABLE_DOES_NOT_EXIST")
    refused({**good, "storage_location": good["storage_location"].rsplit("/", 1)[0] + "/junk"}, 404,
            "TABLE_DOES_NOT_EXIST")
    refused({**good, "storage_location": "file:///elsewhere/t"}, 400, "INVALID_PARAMETER_VALUE", "staging")
    refused({**good, "storage_location": None}, 400, "INVALID_PARAMETER_VALUE")
    refused({**good, "data_source_format": "PARQUET"}, 400, "INVALID_PARAMETER_VALUE")
    refused({**good, "table_type": "VIEW"}, 400, "INVALID_PARAMETER_VALUE")
    refused({**good, "table_type": "NONSENSE"}, 400, "INVALID_PARAMETER_VALUE")
    refused({**good, "properties": {"io.unitycatalog.tableId": str(uuid.uuid4())}}, 400, "INVALID_PARAMETER_VALUE")
    refused({**good, "columns": [{"name": "x", "type_name": "long"}]}, 400, "INVALID_PARAMETER_VALUE")
    refused({**good, "columns": [COLUMNS[0], {**COLUMNS[0], "name": "ID"}]}, 400, "INVALID_PARAMETER_VALUE",
            "case-insensitive")
    refused({**good, "columns": [{"type_name": "LONG"}]}, 400, "INVALID_PARAMETER_VALUE", "name is required")
    refused({**good, "name": "not_the_staged_name"}, 400, "INVALID_PARAMETER_VALUE", "allocated for")

    # The right request still works after all the refusals.
    r = uc.post("/tables", json=good)
    assert r.status_code == 200, r.text
    # Another table of that name: TABLE_ALREADY_EXISTS, even with a fresh staging location.
    st2 = uc.staging("u")
    write_log_file(st2["staging_location"], FIRST, first_commit(st2["id"]))
    error(uc.post("/tables", json={**good, "storage_location": st2["staging_location"]}), 400,
          "TABLE_ALREADY_EXISTS")


def _without(props: dict, key: str) -> dict:
    return {k: v for k, v in props.items() if k != key}


DERIVED_PROPERTIES = ("delta.feature.catalogManaged", "delta.feature.inCommitTimestamp",
                      "delta.feature.vacuumProtocolCheck", "delta.minReaderVersion", "delta.minWriterVersion")


def _bad_required_properties(table_id: str, on_commit: bool = False):
    """Property maps that drop or contradict what the seed requires of a catalog-managed table, each with the
    key the refusal must name. On a commit, leaving out what Delta derives from the protocol is not dropping it
    (Delta's client sends only the log's configuration): those are carried over, see
    test_commit_metadata_from_the_delta_log_configuration."""
    good = table_properties(table_id)
    for key in ("io.unitycatalog.tableId", "delta.enableInCommitTimestamps", *DERIVED_PROPERTIES):
        if not (on_commit and key in DERIVED_PROPERTIES):
            yield key, _without(good, key)
    for key, value in [("io.unitycatalog.tableId", str(uuid.uuid4())), ("delta.enableInCommitTimestamps", "false"),
                       ("delta.feature.catalogManaged", "unsupported"), ("delta.minReaderVersion", "2"),
                       ("delta.minWriterVersion", "6"), ("delta.minReaderVersion", "+3"),
                       ("delta.minWriterVersion", "seven"), ("delta.lastUpdateVersion", "-1"),
                       ("delta.lastCommitTimestamp", "yesterday")]:
        yield key, {**good, key: value}
    # The probe's case: only the table id, and in-commit timestamps switched off.
    yield "delta.enableInCommitTimestamps" if on_commit else "delta.feature.catalogManaged", {
        "io.unitycatalog.tableId": table_id, "delta.enableInCommitTimestamps": "false"}


def test_create_managed_table_requires_properties(uc):
    """Seed, Create a Table, INVALID_PARAMETER_VALUE (2): "missing required table features or properties", even
    when 0.json has them all."""
    uc.setup_schema()
    st = uc.staging("t")
    write_log_file(st["staging_location"], FIRST, first_commit(st["id"]))
    body = {"name": "t", "catalog_name": "main", "schema_name": "default", "table_type": "MANAGED",
            "data_source_format": "DELTA", "storage_location": st["staging_location"], "columns": COLUMNS}
    for key, props in [("io.unitycatalog.tableId", None), ("delta.feature.catalogManaged", {}),
                       *_bad_required_properties(st["id"])]:
        request = body if props is None else {**body, "properties": props}
        e = error(uc.post("/tables", json=request), 400, "INVALID_PARAMETER_VALUE")
        assert key in e["message"], (key, e["message"])
        error(uc.get("/tables/main.default.t"), 404, "TABLE_DOES_NOT_EXIST")
    # Values that change from commit to commit are free, and so are extra features and properties.
    props = {**table_properties(st["id"]), "delta.lastUpdateVersion": "0", "delta.lastCommitTimestamp": "1",
             "delta.enableInCommitTimestamps": "TRUE", "delta.feature.deletionVectors": "supported",
             "delta.minWriterVersion": "8", "owner.team": "growth"}
    r = uc.post("/tables", json={**body, "properties": props})
    assert r.status_code == 200, r.text
    assert r.json()["properties"] == props


def test_concurrent_creates_of_one_name(uc):
    """Racing creates (one staging location twice, or two staging locations for one name): one table, and
    every loser hears TABLE_ALREADY_EXISTS."""
    from concurrent.futures import ThreadPoolExecutor
    uc.setup_schema()
    stagings = [uc.staging("t"), uc.staging("t")]
    for st in stagings:
        write_log_file(st["staging_location"], FIRST, first_commit(st["id"]))
    bodies = [{"name": "t", "catalog_name": "main", "schema_name": "default", "table_type": "MANAGED",
               "data_source_format": "DELTA", "storage_location": st["staging_location"],
               "properties": table_properties(st["id"])}
              for st in stagings for _ in range(3)]
    url = str(uc.base_url).rstrip("/") + "/tables"
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: httpx.post(url, json=b, timeout=30), bodies))
    assert sorted(r.status_code for r in answers) == [200] + [400] * 5, [r.text for r in answers]
    assert {r.json()["error_code"] for r in answers if r.status_code == 400} == {"TABLE_ALREADY_EXISTS"}
    winner = next(r.json() for r in answers if r.status_code == 200)
    assert uc.get("/tables/main.default.t").json()["table_id"] == winner["table_id"]


def test_get_and_delete_table(uc):
    table = uc.create_managed("t")
    error(uc.get("/tables/nope.default.t"), 404, "CATALOG_DOES_NOT_EXIST")
    error(uc.get("/tables/main.nope.t"), 404, "SCHEMA_DOES_NOT_EXIST")
    error(uc.get("/tables/main.default.nope"), 404, "TABLE_DOES_NOT_EXIST")
    error(uc.get("/tables/main.t"), 400, "INVALID_PARAMETER_VALUE")
    error(uc.get("/tables", params={"catalog_name": "main"}), 400, "INVALID_PARAMETER_VALUE")
    error(uc.get("/tables", params={"catalog_name": "main", "schema_name": "nope"}), 404, "SCHEMA_DOES_NOT_EXIST")
    assert uc.commit(table, 1).status_code == 200

    location = local_path(table["storage_location"])
    assert (location / "_delta_log").is_dir()
    assert uc.delete("/tables/main.default.t").status_code == 200
    error(uc.get("/tables/main.default.t"), 404, "TABLE_DOES_NOT_EXIST")
    # Seed: a managed table's "lifecycle (including deletion of files when dropped)" is the catalog's.
    for _ in range(200):
        if not location.exists():
            break
        time.sleep(0.025)
    assert not location.exists()
    error(uc.delete("/tables/main.default.t"), 404, "TABLE_DOES_NOT_EXIST")
    error(uc.commit(table, 2), 404, "TABLE_DOES_NOT_EXIST")
    # The name is free again; the new table is a new id at version 0.
    again = uc.create_managed("t")
    assert again["table_id"] != table["table_id"]
    assert uc.commits(again) == {"commits": [], "latest_table_version": 0}


def test_external_table(uc, tmp_path):
    uc.setup_schema()
    location = (tmp_path / "ext").as_uri()
    body = {"name": "ext", "catalog_name": "main", "schema_name": "default", "table_type": "EXTERNAL",
            "data_source_format": "PARQUET", "storage_location": location, "columns": COLUMNS}
    r = uc.post("/tables", json=body)
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["table_type"] == "EXTERNAL" and info["storage_location"] == location
    assert uc.get("/tables/main.default.ext").json() == info
    # UC does not coordinate its commits: -1 says so, and commits are refused.
    assert uc.commits(info) == {"commits": [], "latest_table_version": -1}
    e = error(uc.commit(info, 1), 400, "INVALID_PARAMETER_VALUE")
    assert "MANAGED DELTA" in e["message"]
    error(uc.post("/tables", json=body), 400, "TABLE_ALREADY_EXISTS")
    error(uc.post("/tables", json={**body, "name": "e2", "storage_location": None}), 400, "INVALID_PARAMETER_VALUE")
    managed = uc.staging("e3")["staging_location"]
    error(uc.post("/tables", json={**body, "name": "e3", "storage_location": managed}), 400,
          "INVALID_PARAMETER_VALUE")
    # Dropping an EXTERNAL table leaves its files: they are the user's.
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "part-0.parquet").write_bytes(b"data")
    assert uc.delete("/tables/main.default.ext").status_code == 200
    time.sleep(0.2)
    assert (tmp_path / "ext" / "part-0.parquet").read_bytes() == b"data"


def test_external_table_with_null_columns_has_no_columns(uc, tmp_path):
    """daft creates EXTERNAL Delta tables with `"columns": null` (the schema is in the Delta log): taken as none,
    as an absent `columns` is."""
    uc.setup_schema()
    body = {"name": "nulls", "catalog_name": "main", "schema_name": "default", "table_type": "EXTERNAL",
            "data_source_format": "DELTA", "storage_location": (tmp_path / "nulls").as_uri(), "columns": None}
    r = uc.post("/tables", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["columns"] == [] and uc.get("/tables/main.default.nulls").json()["columns"] == []
    error(uc.post("/tables", json={**body, "name": "bad", "columns": "none"}), 400, "INVALID_PARAMETER_VALUE")


# -- commits -------------------------------------------------------------------------------------------------


def test_commit_seed_samples(uc):
    table = uc.create_managed("my_table")
    tid, uri = table["table_id"], table["storage_location"]
    c1 = commit_info(1)
    r = uc.post("/delta/commit", json={"table_id": tid, "table_uri": uri, "commit_info": c1})
    assert r.status_code == 200 and r.json() == {}
    assert uc.commits(table) == {"commits": [c1], "latest_table_version": 1}

    # Sample 2: a commit with a metadata change (seed shape).
    c2 = commit_info(2)
    metadata = {"id": str(uuid.uuid4()), "name": "my_table", "description": "Updated table description",
                "format": {"provider": "parquet", "options": {}},
                "schema": [{"name": "id", "type": "long", "nullable": False},
                           {"name": "name", "type": "string", "nullable": True}],
                "properties": {**table_properties(tid), "delta.lastUpdateVersion": "2"},
                "created_time": 1804067300000}
    r = uc.post("/delta/commit", json={"table_id": tid, "table_uri": uri, "commit_info": c2, "metadata": metadata})
    assert r.status_code == 200, r.text
    info = uc.get("/tables/main.default.my_table").json()
    assert info["comment"] == "Updated table description"
    # The seed sample's columns are Delta StructFields; the entry answers with ColumnInfos built from them.
    assert info["columns"] == [
        {"name": "id", "type_name": "LONG", "type_text": "bigint", "nullable": False, "position": 0,
         "type_json": '{"name":"id","type":"long","nullable":false,"metadata":{}}'},
        {"name": "name", "type_name": "STRING", "type_text": "string", "nullable": True, "position": 1,
         "type_json": '{"name":"name","type":"string","nullable":true,"metadata":{}}'}]
    assert info["properties"] == {**metadata["properties"], "delta.lastCommitTimestamp": str(c2["timestamp"])}
    assert info["updated_at"] >= table["updated_at"]

    # Sample 4: UniForm Iceberg info, stored with the table.
    c3 = commit_info(3)
    uniform = {"iceberg": {"metadata_location": uri + "/metadata/00003-x.metadata.json",
                           "converted_delta_version": 3, "converted_delta_timestamp": "2026-02-09T17:00:00.000000Z"}}
    r = uc.post("/delta/commit", json={"table_id": tid, "table_uri": uri, "commit_info": c3, "uniform": uniform})
    assert r.status_code == 200, r.text
    assert uc.get("/tables/main.default.my_table").json()["uniform"] == uniform

    assert uc.commits(table) == {"commits": [c1, c2, c3], "latest_table_version": 3}
    # Get Commits with a version range; latest_table_version ignores end_version.
    assert uc.commits(table, start_version=2, end_version=2) == {"commits": [c2], "latest_table_version": 3}
    assert uc.commits(table, start_version=3) == {"commits": [c3], "latest_table_version": 3}
    assert uc.commits(table, start_version=7) == {"commits": [], "latest_table_version": 3}

    # Sample 3: the published version; commits at or below it leave GET answers.
    r = uc.post("/delta/commit", json={"table_id": tid, "table_uri": uri, "latest_published_version": 2})
    assert r.status_code == 200, r.text
    assert uc.commits(table) == {"commits": [c3], "latest_table_version": 3}
    # An older report changes nothing; the same report again changes nothing.
    assert uc.commit(table, None, published=1).status_code == 200
    assert uc.commit(table, None, published=2).status_code == 200
    assert uc.commits(table) == {"commits": [c3], "latest_table_version": 3}
    assert uc.commit(table, None, published=3).status_code == 200
    assert uc.commits(table) == {"commits": [], "latest_table_version": 3}
    # A commit can carry the published version too (Delta's client always sends its last known one).
    c4 = commit_info(4)
    r = uc.post("/delta/commit", json={"table_id": tid, "table_uri": uri + "/", "commit_info": c4,
                                       "latest_published_version": 3})
    assert r.status_code == 200, r.text
    assert uc.commits(table) == {"commits": [c4], "latest_table_version": 4}


def _commit_error_rows(table: dict):
    tid, uri = table["table_id"], table["storage_location"]
    base = {"table_id": tid, "table_uri": uri}
    ci = commit_info(3)

    def with_ci(**change):
        if "version" in change and "file_name" not in change and isinstance(change["version"], int):
            change["file_name"] = f"{max(change['version'], 0):020d}.{uuid.uuid4()}.json"  # named as Delta does
        return {**base, "commit_info": {**ci, **change}}

    yield "unknown table", {**base, "table_id": str(uuid.uuid4()), "commit_info": ci}, 404, "TABLE_DOES_NOT_EXIST"
    yield "table id not a uuid", {**base, "table_id": "nope", "commit_info": ci}, 400, "INVALID_PARAMETER_VALUE"
    yield "missing table_id", {"table_uri": uri, "commit_info": ci}, 400, "INVALID_PARAMETER_VALUE"
    yield "missing table_uri", {"table_id": tid, "commit_info": ci}, 400, "INVALID_PARAMETER_VALUE"
    yield "other table_uri", {**base, "table_uri": uri + "x", "commit_info": ci}, 400, "INVALID_PARAMETER_VALUE"
    yield "nothing to do", base, 400, "INVALID_PARAMETER_VALUE"
    yield "metadata alone", {**base, "metadata": {"description": "x"}}, 400, "INVALID_PARAMETER_VALUE"
    for field in ("version", "timestamp", "file_size", "file_modification_timestamp"):
        yield f"{field} zero", with_ci(**{field: 0}), 400, "INVALID_PARAMETER_VALUE"
        yield f"{field} negative", with_ci(**{field: -5}), 400, "INVALID_PARAMETER_VALUE"
        yield f"{field} missing", {**base, "commit_info": {k: v for k, v in ci.items() if k != field}}, 400, \
            "INVALID_PARAMETER_VALUE"
        yield f"{field} a string", with_ci(**{field: str(ci[field])}), 400, "INVALID_PARAMETER_VALUE"
    yield "file name missing", with_ci(file_name=""), 400, "INVALID_PARAMETER_VALUE"
    yield "file name a path", with_ci(file_name="../00003.x.json"), 400, "INVALID_PARAMETER_VALUE"
    yield "file name dot-dot", with_ci(file_name=".."), 400, "INVALID_PARAMETER_VALUE"
    yield "file name with slash", with_ci(file_name="a/b.json"), 400, "INVALID_PARAMETER_VALUE"
    yield "file name too long", with_ci(file_name="a" * 300 + ".json"), 400, "INVALID_PARAMETER_VALUE"
    yield "file name not JSON", with_ci(file_name="not-a-commit.txt"), 400, "INVALID_PARAMETER_VALUE"
    yield "file name names another version", with_ci(file_name=f"{7:020d}.{uuid.uuid4()}.json"), 400, \
        "INVALID_PARAMETER_VALUE"
    yield "version skips ahead", with_ci(version=5), 400, "INVALID_PARAMETER_VALUE"
    yield "version taken", with_ci(version=2), 409, "ALREADY_EXISTS"
    yield "version taken, published", with_ci(version=1), 409, "ALREADY_EXISTS"
    yield "published beyond the table", {**base, "latest_published_version": 9}, 400, "INVALID_PARAMETER_VALUE"
    yield "published negative", {**base, "latest_published_version": -1}, 400, "INVALID_PARAMETER_VALUE"
    yield "published the version being committed", {**base, "commit_info": ci, "latest_published_version": 3}, \
        400, "INVALID_PARAMETER_VALUE"
    yield "published beyond the version being committed", {**base, "commit_info": ci,
                                                           "latest_published_version": 4}, \
        400, "INVALID_PARAMETER_VALUE"
    yield "published spellings disagree", {**base, "latest_published_version": 1,
                                           "latest_backfilled_version": 2}, 400, "INVALID_PARAMETER_VALUE"
    yield "metadata drops the table id", {**base, "commit_info": ci, "metadata": {"properties": {"a": "b"}}}, \
        400, "INVALID_PARAMETER_VALUE"
    yield "metadata names another table", {**base, "commit_info": ci, "metadata": {
        "properties": table_properties(str(uuid.uuid4()))}}, 400, "INVALID_PARAMETER_VALUE"
    for key, props in _bad_required_properties(tid, on_commit=True):
        yield f"metadata without {key}", {**base, "commit_info": ci, "metadata": {"properties": props}}, 400, \
            "INVALID_PARAMETER_VALUE"
        yield f"metadata without {key}, UC OSS shape", {**base, "commit_info": ci, "metadata": {
            "properties": {"properties": props}}}, 400, "INVALID_PARAMETER_VALUE"
    yield "metadata with no properties", {**base, "commit_info": ci, "metadata": {"properties": {}}}, 400, \
        "INVALID_PARAMETER_VALUE"
    ice = {"metadata_location": uri + "/metadata/v3.json", "converted_delta_version": 3,
           "converted_delta_timestamp": "2026-02-09T17:00:00.000000Z"}
    yield "uniform without commit", {**base, "latest_published_version": 1, "uniform": {"iceberg": ice}}, 400, \
        "INVALID_PARAMETER_VALUE"
    yield "uniform outside the table", {**base, "commit_info": ci, "uniform": {"iceberg": {
        **ice, "metadata_location": "file:///elsewhere/v3.json"}}}, 400, "INVALID_PARAMETER_VALUE"
    yield "uniform escapes the table", {**base, "commit_info": ci, "uniform": {"iceberg": {
        **ice, "metadata_location": uri + "/../other/v3.json"}}}, 400, "INVALID_PARAMETER_VALUE"
    yield "uniform bad timestamp", {**base, "commit_info": ci, "uniform": {"iceberg": {
        **ice, "converted_delta_timestamp": "yesterday"}}}, 400, "INVALID_PARAMETER_VALUE"
    yield "uniform naive timestamp", {**base, "commit_info": ci, "uniform": {"iceberg": {
        **ice, "converted_delta_timestamp": "2026-02-09T17:00:00"}}}, 400, "INVALID_PARAMETER_VALUE"
    yield "uniform other version", {**base, "commit_info": ci, "uniform": {"iceberg": {
        **ice, "converted_delta_version": 2}}}, 400, "INVALID_PARAMETER_VALUE"
    yield "uniform missing field", {**base, "commit_info": ci, "uniform": {"iceberg": {
        "metadata_location": ice["metadata_location"]}}}, 400, "INVALID_PARAMETER_VALUE"


def test_commit_error_rows(uc):
    table = uc.create_managed("t")
    assert uc.commit(table, 1).status_code == 200
    assert uc.commit(table, 2, published=1).status_code == 200
    before = snapshot(uc, table)
    for route in ("/delta/commit", "/delta/preview/commits"):
        for what, body, status, code in _commit_error_rows(table):
            r = uc.post(route, json=body)
            assert r.status_code == status and r.json()["error_code"] == code, (route, what, r.text)
            assert snapshot(uc, table) == before, (route, what)
    for raw in (b"", b"not json", b"[1, 2]"):
        error(uc.post("/delta/commit", content=raw), 400, "INVALID_PARAMETER_VALUE")
    assert snapshot(uc, table) == before


def test_conflicts_and_replays(uc):
    table = uc.create_managed("t")
    c1 = commit_info(1)
    assert uc.post("/delta/commit", json={"table_id": table["table_id"], "table_uri": table["storage_location"],
                                          "commit_info": c1}).status_code == 200
    # A client that lost the answer resends the same commit: 200, and nothing changes.
    assert uc.commit(table, 1, file_name=c1["file_name"]).status_code == 200
    assert uc.commits(table) == {"commits": [c1], "latest_table_version": 1}
    # Another writer's commit for the same version loses.
    e = error(uc.commit(table, 1), 409, "ALREADY_EXISTS")
    assert "version 1" in e["message"] and "retry at version 2" in e["message"]
    # Once published (and out of the GET answers), a replay still gets 200 and a rival still gets 409.
    for v in range(2, 5):
        assert uc.commit(table, v, published=v - 1).status_code == 200
    assert uc.commit(table, None, published=4).status_code == 200
    assert uc.commit(table, 1, file_name=c1["file_name"]).status_code == 200
    error(uc.commit(table, 1), 409, "ALREADY_EXISTS")
    error(uc.commit(table, 4), 409, "ALREADY_EXISTS")
    assert uc.commits(table) == {"commits": [], "latest_table_version": 4}


def test_published_version_is_checked_before_the_commit(uc):
    """Seed, Write a Commit, INVALID_PARAMETER_VALUE (4): last published version > current table version. The
    version a request ratifies is not published yet; counting it as published would hide it from GET commits."""
    table = uc.create_managed("t")
    assert uc.commit(table, 1).status_code == 200
    before = snapshot(uc, table)
    for route in ("/delta/commit", "/delta/preview/commits"):
        for published in (2, 3):
            e = error(uc.commit(table, 2, published=published, route=route), 400, "INVALID_PARAMETER_VALUE")
            assert "current version 1" in e["message"], e["message"]
            assert snapshot(uc, table) == before, (route, published)
    c2 = commit_info(2)
    r = uc.post("/delta/preview/commits", json={"table_id": table["table_id"],
                                                "table_uri": table["storage_location"], "commit_info": c2,
                                                "latest_backfilled_version": 1})
    assert r.status_code == 200, r.text
    assert uc.commits(table) == {"commits": [c2], "latest_table_version": 2}


def stamp_of(uc: UC, table: dict, version: int) -> dict[str, str]:
    """What a metadata change ratified at `version` stamps on the table's properties. UC managed tables spec:
    `delta.lastUpdateVersion` is "the version of the last commit that changed table metadata" and
    `delta.lastCommitTimestamp` its timestamp, "catalog bookkeeping ... no Delta log representation"."""
    commit = next(c for c in uc.commits(table)["commits"] if c["version"] == version)
    return {"delta.lastUpdateVersion": str(version), "delta.lastCommitTimestamp": str(commit["timestamp"])}


def test_metadata_keeps_required_properties(uc):
    """Seed, Write a Commit, `metadata.properties`: "When updating, always includes all the required properties".
    A metadata update that drops or contradicts one is refused whole, in either metadata shape; the stamps of
    the last metadata change are the catalog's, whatever the client sends."""
    table = uc.create_managed("t")
    tid = table["table_id"]
    for route in ("/delta/commit", "/delta/preview/commits"):
        for key, props in _bad_required_properties(tid, on_commit=True):
            for shape in (props, {"properties": props}):
                before = snapshot(uc, table)
                e = error(uc.commit(table, 1, route=route, metadata={"description": "changed", "properties": shape}),
                          400, "INVALID_PARAMETER_VALUE")
                assert key in e["message"], (key, e["message"])
                assert snapshot(uc, table) == before, (route, key)
    props = {**table_properties(tid), "delta.lastUpdateVersion": "1", "delta.lastCommitTimestamp": "1804067300000",
             "delta.feature.deletionVectors": "supported", "delta.enableDeletionVectors": "true"}
    r = uc.commit(table, 1, route="/delta/preview/commits", metadata={"properties": {"properties": props}})
    assert r.status_code == 200, r.text
    assert uc.get("/tables/main.default.t").json()["properties"] == {**props, **stamp_of(uc, table, 1)}
    assert uc.commits(table)["latest_table_version"] == 1


def test_commit_metadata_from_the_delta_log_configuration(uc):
    """Delta's UC client sends the log's `metaData.configuration` as the properties: the table id and the
    in-commit-timestamp setting, not the features and versions Delta keeps in the protocol. Those stay as they
    were; the rest is the sent map."""
    table = uc.create_managed("t")
    tid = table["table_id"]
    configuration = {"io.unitycatalog.tableId": tid, "delta.enableInCommitTimestamps": "true",
                     "delta.appendOnly": "true"}
    r = uc.commit(table, 1, metadata={"properties": configuration})
    assert r.status_code == 200, r.text
    props = uc.get("/tables/main.default.t").json()["properties"]
    assert props == {**configuration, **{k: table_properties(tid)[k] for k in DERIVED_PROPERTIES},
                     **stamp_of(uc, table, 1)}


def test_server_fault_is_internal_error(uc, monkeypatch):
    """A failure the service did not foresee is a 500 INTERNAL_ERROR, not the client's INVALID_PARAMETER_VALUE;
    other framework-raised statuses get their own UC codes."""
    table = uc.create_managed("t")

    async def broken(self, full):
        raise RuntimeError("a bug")

    monkeypatch.setattr(coordinator.delta.DeltaService, "get_table", broken)
    e = error(uc.get("/tables/main.default.t"), 500, "INTERNAL_ERROR")
    assert "a bug" not in e["message"]
    monkeypatch.undo()
    assert uc.get("/tables/main.default.t").json() == table
    error(uc.request("OPTIONS", "/tables/main.default.t"), 405, "METHOD_NOT_ALLOWED")
    error(uc.get(""), 404, "ENDPOINT_NOT_FOUND")


def test_too_many_unpublished_commits(uc):
    table = uc.create_managed("t")
    for v in range(1, 11):
        assert uc.commit(table, v).status_code == 200
    before = snapshot(uc, table)
    e = error(uc.commit(table, 11), 429, "RESOURCE_EXHAUSTED")
    assert "backfill" in e["message"]
    assert snapshot(uc, table) == before
    # A backfill report that still leaves too many is refused as a whole, backfill included.
    error(uc.commit(table, 11, published=0), 429, "RESOURCE_EXHAUSTED")
    assert snapshot(uc, table) == before
    # Backfill frees room; the same commit goes through.
    assert uc.commit(table, 11, published=1).status_code == 200
    body = uc.commits(table)
    assert [c["version"] for c in body["commits"]] == list(range(2, 12)) and body["latest_table_version"] == 11


def test_get_commits_parameters(uc):
    table = uc.create_managed("t")
    cs = [commit_info(v) for v in range(1, 4)]
    for c in cs:
        assert uc.post("/delta/commit", json={"table_id": table["table_id"], "table_uri": table["storage_location"],
                                              "commit_info": c}).status_code == 200
    q = {"table_id": table["table_id"], "table_uri": table["storage_location"]}
    # Query parameters (what unitycatalog-client can send on a GET), on both spellings of the route.
    for route in ("/delta/commits", "/delta/preview/commits"):
        r = uc.get(route, params={**q, "start_version": 2})
        assert r.status_code == 200 and r.json() == {"commits": cs[1:], "latest_table_version": 3}
        assert uc.get_json(route, q).json() == {"commits": cs, "latest_table_version": 3}
    # Body and query mixed; the same value twice is fine, different values are not.
    assert uc.get_json("/delta/commits", q, params={"end_version": 1}).json()["commits"] == cs[:1]
    assert uc.get_json("/delta/commits", {**q, "start_version": 1}, params={"start_version": 1}).status_code == 200
    error(uc.get_json("/delta/commits", {**q, "start_version": 1}, params={"start_version": 2}), 400,
          "INVALID_PARAMETER_VALUE")

    bad = [({**q, "start_version": -1}, 400, "INVALID_PARAMETER_VALUE"),
           ({**q, "start_version": 3, "end_version": 2}, 400, "INVALID_PARAMETER_VALUE"),
           ({**q, "end_version": -1}, 400, "INVALID_PARAMETER_VALUE"),
           ({**q, "start_version": "1"}, 400, "INVALID_PARAMETER_VALUE"),
           ({"table_uri": q["table_uri"]}, 400, "INVALID_PARAMETER_VALUE"),
           ({"table_id": q["table_id"]}, 400, "INVALID_PARAMETER_VALUE"),
           ({**q, "table_uri": "file:///elsewhere"}, 400, "INVALID_PARAMETER_VALUE"),
           ({**q, "table_id": str(uuid.uuid4())}, 404, "TABLE_DOES_NOT_EXIST"),
           ({**q, "table_id": "not-a-uuid"}, 400, "INVALID_PARAMETER_VALUE")]
    for body, status, code in bad:
        error(uc.get_json("/delta/commits", body), status, code)
    error(uc.get("/delta/commits", params={**q, "start_version": "x"}), 400, "INVALID_PARAMETER_VALUE")
    error(uc.get("/delta/commits"), 400, "INVALID_PARAMETER_VALUE")
    error(uc.request("GET", "/delta/commits", content=b"[]"), 400, "INVALID_PARAMETER_VALUE")


def test_get_commits_pages(config):
    """A short page means "ask again from the next version"; `latest_table_version` says how far to go."""
    with EmbeddedService(replace(config, delta_commits_page_size=3)) as base:
        uc = UC(base)
        table = uc.create_managed("t")
        for v in range(1, 9):
            assert uc.commit(table, v).status_code == 200
        seen, start = [], 0
        while True:
            body = uc.commits(table, start_version=start)
            assert len(body["commits"]) <= 3 and body["latest_table_version"] == 8
            if not body["commits"]:
                break
            seen += [c["version"] for c in body["commits"]]
            start = seen[-1] + 1
        assert seen == list(range(1, 9))
        uc.http.close()


def test_metadata_in_unity_catalog_oss_shape(uc):
    """unitycatalog-client's DeltaMetadata: `schema.columns` and `properties.properties`."""
    table = uc.create_managed("t")
    props = {**table_properties(table["table_id"]), "owner.team": "growth"}
    metadata = {"description": "oss shaped", "schema": {"columns": COLUMNS[:1]}, "properties": {"properties": props}}
    r = uc.commit(table, 1, route="/delta/preview/commits", metadata=metadata)
    assert r.status_code == 200, r.text
    info = uc.get("/tables/main.default.t").json()
    assert info["comment"] == "oss shaped" and info["columns"] == COLUMNS[:1]
    assert info["properties"] == {**props, **stamp_of(uc, table, 1)}
    # Fields left out keep their values; the change is stamped all the same.
    assert uc.commit(table, 2, metadata={"description": "only the comment"}).status_code == 200
    info2 = uc.get("/tables/main.default.t").json()
    assert info2["comment"] == "only the comment" and info2["columns"] == COLUMNS[:1]
    assert info2["properties"] == {**props, **stamp_of(uc, table, 2)}


def test_metadata_changes_are_stamped_and_data_commits_are_not(uc):
    """The stamps say which commit last changed the metadata: a data-only commit leaves them (UC managed tables
    spec: "Data-only commits do not update this value"), and a commit that changes the metadata sets them to its
    own version and timestamp, also when the client sends only the log's configuration, which never holds them."""
    table = uc.create_managed("t")
    tid = table["table_id"]
    created = uc.get("/tables/main.default.t").json()["properties"]
    assert uc.commit(table, 1).status_code == 200
    assert uc.get("/tables/main.default.t").json()["properties"] == created
    configuration = {"io.unitycatalog.tableId": tid, "delta.enableInCommitTimestamps": "true"}
    r = uc.commit(table, 2, route="/delta/preview/commits", metadata={"properties": {"properties": configuration}})
    assert r.status_code == 200, r.text
    props = uc.get("/tables/main.default.t").json()["properties"]
    assert {k: props[k] for k in stamp_of(uc, table, 2)} == stamp_of(uc, table, 2)
    assert uc.commit(table, 3).status_code == 200
    assert uc.get("/tables/main.default.t").json()["properties"] == props


def test_delta_4_0_metadata_with_created_time_as_a_string(uc):
    """Delta 4.0's UC client (`UCRestClientPayload.Metadata.fromAbstractMetadata`) sends `created_time` as a
    string (`Long.toString()`), with `delta_table_id` and `format_options`; the seed types it int64. Both are
    accepted; anything but an integer is still refused."""
    table = uc.create_managed("t")
    metadata = {"delta_table_id": str(uuid.uuid4()), "provider": "delta", "format_options": {"options": {}},
                "partition_columns": [], "description": "from Delta 4.0",
                "properties": {"properties": table_properties(table["table_id"])}, "created_time": "1704067200000"}
    r = uc.commit(table, 1, route="/delta/preview/commits", metadata=metadata)
    assert r.status_code == 200, r.text
    assert uc.get("/tables/main.default.t").json()["comment"] == "from Delta 4.0"
    for bad in ("soon", "1.5", ""):
        before = snapshot(uc, table)
        error(uc.commit(table, 2, route="/delta/preview/commits", metadata={**metadata, "created_time": bad}),
              400, "INVALID_PARAMETER_VALUE")
        assert snapshot(uc, table) == before


def test_metrics(uc, database_url):
    table = uc.create_managed("t")
    assert uc.commit(table, 1).status_code == 200
    base = {"table_id": table["table_id"], "table_uri": table["storage_location"]}
    report = {"num_files_added": 10, "num_bytes_added": 104857600, "num_clustered_bytes_added": 52428800,
              "num_files_removed": 2, "num_bytes_removed": 8192, "num_clustered_bytes_removed": 4096,
              "file_size_histogram": {"sorted_bin_boundaries": [0, 1024, 2048], "file_counts": [100, 40, 5],
                                      "total_bytes": [104857600, 167772160, 83886080]},
              "num_rows_inserted": 1000000, "num_rows_removed": 50000, "num_rows_updated": 25000,
              "commit_version": 1}
    r = uc.post("/delta/metrics", json={**base, "report": {"commit_report": report}})
    assert r.status_code == 200 and r.json() == {}
    assert uc.post("/delta/metrics", json=base).status_code == 200
    # Version 0, the table's creation (a CTAS's 0.json adds files), has metrics like any commit.
    r = uc.post("/delta/metrics", json={**base, "report": {"commit_report": {**report, "commit_version": 0}}})
    assert r.status_code == 200, r.text

    hist = report["file_size_histogram"]
    rows = [
        ({**base, "table_id": str(uuid.uuid4()), "report": {"commit_report": report}}, 404, "TABLE_DOES_NOT_EXIST"),
        ({"table_uri": base["table_uri"]}, 400, "INVALID_PARAMETER_VALUE"),
        ({**base, "table_uri": "file:///x"}, 400, "INVALID_PARAMETER_VALUE"),
        ({**base, "report": {"commit_report": {k: v for k, v in report.items() if k != "commit_version"}}},
         400, "INVALID_PARAMETER_VALUE"),
        ({**base, "report": {"commit_report": {**report, "commit_version": 7}}}, 400, "INVALID_PARAMETER_VALUE"),
        ({**base, "report": {"commit_report": {**report, "commit_version": -1}}}, 400, "INVALID_PARAMETER_VALUE"),
        ({**base, "report": {"commit_report": {**report, "num_files_added": -1}}}, 400, "INVALID_PARAMETER_VALUE"),
        ({**base, "report": {"commit_report": {**report, "num_rows_updated": "many"}}}, 400,
         "INVALID_PARAMETER_VALUE"),
        ({**base, "report": {"commit_report": {**report, "file_size_histogram": {**hist, "file_counts": [1, 2]}}}},
         400, "INVALID_PARAMETER_VALUE"),
        ({**base, "report": {"commit_report": {**report, "file_size_histogram": {
            **hist, "sorted_bin_boundaries": [1, 1024, 2048]}}}}, 400, "INVALID_PARAMETER_VALUE"),
        ({**base, "report": {"commit_report": {**report, "file_size_histogram": {
            "sorted_bin_boundaries": [0, 1]}}}}, 400, "INVALID_PARAMETER_VALUE"),
    ]
    for body, status, code in rows:
        error(uc.post("/delta/metrics", json=body), status, code)
    # what was kept: the two reports accepted (a request without one keeps nothing), as sent, and no refused one
    stored = sql(database_url, "SELECT table_id, commit_version, report FROM delta_commit_metrics ORDER BY created_at")
    assert [(str(r["table_id"]), r["commit_version"], json.loads(r["report"])) for r in stored] == [
        (table["table_id"], 1, report), (table["table_id"], 0, {**report, "commit_version": 0})]



def assert_expires_later(answer: dict) -> None:
    """UC's `expiration_time`: epoch milliseconds, an int64, in the future (delta-rs refuses an answer without
    one, and caches the credentials until then)."""
    expires = answer["expiration_time"]
    assert type(expires) is int and time.time() * 1000 < expires < (time.time() + 86_400) * 1000, answer


def test_temporary_credentials(uc):
    """UC OSS temporary credentials: none are needed for local files, so the answer names the location only; an
    unknown table is 404, an operation that asks for nothing or a relative path 400, and an object store 400
    FAILED_PRECONDITION (no cloud credentials are vended here)."""
    table = uc.create_managed("t")
    staging = uc.staging("u")
    for table_id, location in [(table["table_id"], table["storage_location"]),
                               (staging["id"], staging["staging_location"])]:
        for operation in ("READ", "READ_WRITE"):
            r = uc.post("/temporary-table-credentials", json={"table_id": table_id, "operation": operation})
            assert r.status_code == 200 and r.json() == {"url": location, "expiration_time": ANY}, r.text
            assert_expires_later(r.json())
    error(uc.post("/temporary-table-credentials", json={"table_id": str(uuid.uuid4()), "operation": "READ"}),
          404, "TABLE_DOES_NOT_EXIST")
    for body in [{"table_id": table["table_id"], "operation": "UNKNOWN_TABLE_OPERATION"},
                 {"table_id": table["table_id"], "operation": "WRITE"}, {"operation": "READ"},
                 {"table_id": "not-a-uuid", "operation": "READ"}]:
        error(uc.post("/temporary-table-credentials", json=body), 400, "INVALID_PARAMETER_VALUE")

    r = uc.post("/temporary-path-credentials", json={"url": table["storage_location"], "operation": "PATH_READ"})
    assert r.status_code == 200 and r.json() == {"url": table["storage_location"], "expiration_time": ANY}, r.text
    assert_expires_later(r.json())
    body = error(uc.post("/temporary-path-credentials", json={"url": "s3://bucket/x", "operation": "PATH_READ"}),
                 400, "FAILED_PRECONDITION")
    assert "s3://" in body["message"]
    for bad in [{"url": "relative/x", "operation": "PATH_READ"}, {"url": "", "operation": "PATH_READ"},
                {"url": "/tmp/x", "operation": "UNKNOWN_PATH_OPERATION"}, {"url": "/tmp/x"}]:
        error(uc.post("/temporary-path-credentials", json=bad), 400, "INVALID_PARAMETER_VALUE")


def test_temporary_credentials_for_an_s3_warehouse_are_its_static_keys_while_auth_is_off(config):
    """As Iceberg's /credentials: the configured static S3 keys, for the warehouse only; elsewhere a refusal."""
    keys = {"access_key_id": "AKIAEXAMPLE", "secret_access_key": "secret", "session_token": "token",
            "region": "eu-west-1"}
    s3 = replace(config, warehouse="s3://bucket/wh", s3_options=keys)
    with EmbeddedService(s3) as base:
        uc = UC(base)
        r = uc.post("/temporary-path-credentials", json={"url": "s3a://bucket/wh/t", "operation": "PATH_READ"})
        assert r.status_code == 200, r.text
        assert r.json() == {"url": "s3a://bucket/wh/t", "expiration_time": ANY, "aws_temp_credentials": {
            "access_key_id": "AKIAEXAMPLE", "secret_access_key": "secret", "session_token": "token"}}
        assert_expires_later(r.json())
        error(uc.post("/temporary-path-credentials", json={"url": "s3://other/t", "operation": "PATH_READ"}),
              400, "FAILED_PRECONDITION")

def test_state_survives_restart(config):
    """The actor's memory is rebuilt from the table row and the commit log alone."""
    with EmbeddedService(config) as base:
        uc = UC(base)
        table = uc.create_managed("t")
        kept = [commit_info(v) for v in range(1, 6)]
        for c in kept:
            r = uc.post("/delta/commit", json={"table_id": table["table_id"], "table_uri": table["storage_location"],
                                               "commit_info": c})
            assert r.status_code == 200
        assert uc.commit(table, None, published=2).status_code == 200
        metadata = {"description": "v6", "properties": table_properties(table["table_id"])}
        assert uc.commit(table, 6, metadata=metadata).status_code == 200
        before = snapshot(uc, table)
        uc.http.close()
    with EmbeddedService(config) as base:
        uc = UC(base)
        assert snapshot(uc, table) == before
        assert [c["version"] for c in before[2]["commits"]] == [3, 4, 5, 6]
        assert uc.commit(table, 3, file_name=kept[2]["file_name"]).status_code == 200   # replay, in memory
        assert uc.commit(table, 1, file_name=kept[0]["file_name"]).status_code == 200   # replay, from the log
        error(uc.commit(table, 6), 409, "ALREADY_EXISTS")
        assert uc.commit(table, 7, published=6).status_code == 200
        assert uc.commits(table)["commits"][0]["version"] == 7
        uc.http.close()


def test_other_formats_tables_are_not_delta_tables(uc, service):
    """A table id of another protocol's table is "no such table" here (realms are separate)."""
    assert httpx.post(service + "/v1/namespaces", json={"namespace": ["ns"]}).status_code == 200
    r = httpx.post(service + "/v1/namespaces/ns/tables", json={"name": "ice", "schema": {
        "type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "a", "type": "long", "required": False}]}})
    assert r.status_code == 200, r.text
    ice = r.json()
    error(uc.post("/delta/commit", json={"table_id": ice["metadata"]["table-uuid"],
                                         "table_uri": ice["metadata"]["location"], "commit_info": commit_info(1)}),
          404, "TABLE_DOES_NOT_EXIST")
    assert httpx.get(service + "/v1/namespaces/ns/tables/ice").status_code == 200


def test_unknown_endpoint(uc):
    error(uc.get("/functions"), 404, "ENDPOINT_NOT_FOUND")
    error(uc.post("/delta/v2/whatever", json={}), 404, "ENDPOINT_NOT_FOUND")
    r = uc.post("/delta/v1/whatever", json={})   # the Delta API v1.0 answers in its own error model
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundException", r.text


def test_a_known_endpoint_with_another_method_is_405(uc):
    for method, path, allowed in [("PUT", "/delta/preview/commits", "GET, HEAD, POST"),
                                  ("GET", "/delta/metrics", "POST"), ("DELETE", "/delta/commit", "POST"),
                                  ("PATCH", "/staging-tables", "POST")]:
        r = uc.http.request(method, path, json={})
        e = error(r, 405, "METHOD_NOT_ALLOWED")
        assert r.headers["Allow"] == allowed and method in e["message"], (method, path, r.headers, e)



def test_commit_columns_are_column_infos_checked_as_delta_checks_a_schema(uc):
    """Columns sent as Delta StructFields (the seed's commit sample) come back as UC ColumnInfos, nested types
    included; a column without a name, two names equal but for case, or a type Delta does not have is refused
    with nothing changed; keys ColumnInfo does not define are not kept."""
    table = uc.create_managed("t")
    props = table_properties(table["table_id"])
    nested = {"type": "struct", "fields": [
        {"name": "amount", "type": "decimal(10,2)", "nullable": True, "metadata": {}},
        {"name": "tags", "type": {"type": "array", "elementType": "string", "containsNull": True},
         "nullable": True, "metadata": {}},
        {"name": "attrs", "type": {"type": "map", "keyType": "string", "valueType": "integer",
                                   "valueContainsNull": False}, "nullable": True, "metadata": {}}]}
    schema = [{"name": "id", "type": "long", "nullable": False, "metadata": {"comment": "the key"}},
              {"name": "detail", "type": nested, "nullable": True},
              {"name": "price", "type": "decimal(12, 3)", "nullable": True, "bogus": 1}]
    r = uc.commit(table, 1, metadata={"schema": schema, "properties": props})
    assert r.status_code == 200, r.text
    columns = uc.get("/tables/main.default.t").json()["columns"]
    assert [(c["name"], c["type_name"], c["type_text"], c["position"]) for c in columns] == [
        ("id", "LONG", "bigint", 0),
        ("detail", "STRUCT", "struct<amount:decimal(10,2),tags:array<string>,attrs:map<string,int>>", 1),
        ("price", "DECIMAL", "decimal(12,3)", 2)]
    assert columns[0]["comment"] == "the key" and columns[0]["nullable"] is False
    assert json.loads(columns[1]["type_json"]) == {"name": "detail", "type": nested, "nullable": True,
                                                   "metadata": {}}
    assert (columns[2]["type_precision"], columns[2]["type_scale"]) == (12, 3) and "bogus" not in columns[2]

    before = snapshot(uc, table)
    for bad, says in [
        ([{"name": "id", "type": "long"}, {"name": "ID", "type": "string"}], "case-insensitive"),
        ([{"type": "long"}], "name is required"),
        ([{"name": "", "type": "long"}], "name is required"),
        ([{"name": "id", "type": "bigint"}], "is not a Delta type"),
        ([{"name": "id", "type": "decimal(40,2)"}], "is not a Delta type"),
        ([{"name": "s", "type": {"type": "struct", "fields": [{"name": "a", "type": "long"},
                                                              {"name": "A", "type": "long"}]}}], "twice"),
        ([{"name": "s", "type": {"type": "array", "elementType": "nope"}}], "elementType"),
        ([{"name": "id", "type": "long", "nullable": "yes"}], "nullable"),
    ]:
        body = error(uc.commit(table, 2, metadata={"schema": bad, "properties": props}), 400,
                     "INVALID_PARAMETER_VALUE")
        assert says in body["message"], body
        assert snapshot(uc, table) == before

def test_seed_samples_parse():
    """The seed's request samples are valid requests for our models, as written."""
    from coordinator.delta import CommitRequest, MetricsRequest
    sample = {"table_id": "abcdef12-3456-7890-abcd-ef1234567890", "table_uri": "s3://my-bucket/main/default/t",
              "commit_info": {"version": 43, "timestamp": 1704067300000, "file_name": "v.uuid1.json",
                              "file_size": 3072, "file_modification_timestamp": 1704067300000},
              "metadata": {"id": "12345678-1234-5678-1234-567812345678", "name": "my_table",
                           "description": "Updated table description",
                           "format": {"provider": "parquet", "options": {}},
                           "schema": [{"name": "id", "type": "long", "nullable": False}],
                           "properties": {"io.unitycatalog.tableId": "abcdef12-3456-7890-abcd-ef1234567890"},
                           "created_time": 1804067300000}}
    req = CommitRequest.model_validate(copy.deepcopy(sample))
    assert req.metadata.schema_[0].to_json() == {"name": "id", "type": "long", "nullable": False}
    MetricsRequest.model_validate(json.loads('{"table_id": "x", "table_uri": "y", "report": {"commit_report": '
                                             '{"commit_version": 6}}}'))


def test_error_codes_by_class():
    """Unity Catalog's code for each typed outcome, read from the class alone."""
    from api.delta import ERRORS as error_code
    from coordinator import errors as e
    expected = [(e.NoSuchCatalog, 404, "CATALOG_DOES_NOT_EXIST"), (e.NoSuchNamespace, 404, "SCHEMA_DOES_NOT_EXIST"),
                (e.NoSuchTable, 404, "TABLE_DOES_NOT_EXIST"), (e.CatalogExists, 409, "CATALOG_ALREADY_EXISTS"),
                (e.NamespaceExists, 409, "SCHEMA_ALREADY_EXISTS"), (e.TableExists, 400, "TABLE_ALREADY_EXISTS"),
                (e.NamespaceNotEmpty, 400, "SCHEMA_NOT_EMPTY"), (e.CatalogNotEmpty, 400, "CATALOG_NOT_EMPTY"),
                (e.CommitConflict, 409, "ALREADY_EXISTS"), (e.VersionPublished, 409, "ALREADY_EXISTS"),
                (e.TooManyRequests, 429, "RESOURCE_EXHAUSTED"), (e.Unavailable, 503, "TEMPORARILY_UNAVAILABLE"),
                (e.OutcomeUnknown, 500, "INTERNAL_ERROR"), (e.FailedPrecondition, 400, "FAILED_PRECONDITION"),
                (e.BadRequest, 400, "INVALID_PARAMETER_VALUE"), (e.Unauthorized, 401, "UNAUTHENTICATED"),
                (e.Forbidden, 403, "PERMISSION_DENIED")]
    for cls, status, code in expected:
        assert error_code(cls("x")) == (status, code), cls
