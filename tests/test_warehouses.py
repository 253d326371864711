"""Named warehouses: managed over REST and the CLI, and Iceberg clients placed in the one they name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import BadRequestError, NoSuchTableError, RESTError
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from api.server import EmbeddedService
from storage.files import to_local_path
from tests.support import fetch_token, write_auth_file

API = "/api/coordinator/v1/warehouses"
SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))


def create(base: str, name: str, location: str, storage: dict | None = None, **kw) -> httpx.Response:
    body = {"name": name, "location": location, **({"storage": storage} if storage is not None else {})}
    return httpx.post(base + API, json=body, **kw)


def test_warehouses_are_created_listed_shown_and_dropped(service, config, tmp_path):
    lake = (tmp_path / "lake").as_uri()
    r = create(service, "lake", lake)
    assert r.status_code == 201, r.text
    assert r.json() == {"name": "lake", "location": lake, "storage": {"credentials": "environment"}}
    listed = httpx.get(service + API).json()["warehouses"]
    assert [(w["name"], w["location"]) for w in listed] == [("default", config.warehouse_uri), ("lake", lake)]
    assert httpx.get(f"{service}{API}/lake").json()["location"] == lake
    assert httpx.delete(f"{service}{API}/lake").status_code == 204
    missing = httpx.get(f"{service}{API}/lake")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "NoSuchWarehouse"
    assert "POST /api/coordinator/v1/warehouses" in missing.json()["error"]["message"]


@pytest.mark.parametrize("name, location, storage, status, says", [
    ("x", "relative/path", None, 400, "file:///path or s3://"),
    ("x", "http://host/p", None, 400, "file:///path or s3://"),
    ("x", "s3:///p", None, 400, "names no bucket"),
    ("x", "file:///tmp/a/../b", None, 400, "'..'"),
    ("bad name", "s3://b/p", None, 400, "name must be"),
    ("x", "s3://b/p", {"credentials": "keys"}, 400, "access_key_id"),
    ("x", "s3://b/p", {"credentials": "profile"}, 400, "storage.profile"),
    ("x", "s3://b/p", {"acces_key": "k"}, 400, "acces_key"),
    ("x", "s3://b/p", {"access_key_id": "k", "secret_access_key": "s"}, 400, 'only with storage.credentials "keys"'),
    ("default", "s3://b/p", None, 409, "service's own root"),
    ("namespace", "s3://b/p", None, 400, "reserved"),
])
def test_bad_warehouses_are_refused_in_the_services_format(service, name, location, storage, status, says):
    r = create(service, name, location, storage)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"]
    assert [w["name"] for w in httpx.get(service + API).json()["warehouses"]] == ["default"]


def test_a_name_or_a_root_is_taken_once_and_roots_do_not_overlap(service, config, tmp_path):
    assert create(service, "a", (tmp_path / "a").as_uri()).status_code == 201
    again = create(service, "a", (tmp_path / "other").as_uri())
    assert again.status_code == 409 and again.json()["error"]["type"] == "WarehouseExists"
    for overlapping in [(tmp_path / "a" / "below").as_uri(), tmp_path.as_uri(), config.warehouse_uri + "/x"]:
        r = create(service, "b", overlapping)
        assert r.status_code == 400 and "overlaps warehouse" in r.json()["error"]["message"], overlapping


def test_an_iceberg_prefix_in_use_is_not_taken_over(service, tmp_path):
    assert httpx.post(f"{service}/v1/sales/namespaces", json={"namespace": ["db"]}).status_code == 200
    r = create(service, "sales", (tmp_path / "sales").as_uri())
    assert r.status_code == 409 and "catalog prefix" in r.json()["error"]["message"], r.text


def test_secret_keys_are_never_shown(service):
    keys = {"credentials": "keys", "access_key_id": "AKIAEXAMPLE", "secret_access_key": "very-secret",
            "session_token": "token-secret", "endpoint": "http://127.0.0.1:9", "region": "eu-west-1",
            "path_style": True}
    created = create(service, "s3wh", "s3://bucket/prefix", keys)
    assert created.status_code == 201, created.text
    for answer in (created.text, httpx.get(service + API).text, httpx.get(f"{service}{API}/s3wh").text):
        assert "very-secret" not in answer and "token-secret" not in answer
    shown = httpx.get(f"{service}{API}/s3wh").json()["storage"]
    assert shown["access_key_id"] == "AKIAEXAMPLE" and shown["secret_access_key"] == "********"
    assert shown["endpoint"] == "http://127.0.0.1:9" and shown["path_style"] is True


def test_pyiceberg_tables_land_in_the_warehouse_they_name(service, config, tmp_path):
    lake_dir = tmp_path / "lake"
    assert create(service, "lake", lake_dir.as_uri()).status_code == 201
    by_name = load_catalog("n", type="rest", uri=service, warehouse="lake")
    by_root = load_catalog("r", type="rest", uri=service, warehouse=lake_dir.as_uri())
    plain = load_catalog("p", type="rest", uri=service)
    by_name.create_namespace("db")
    table = by_name.create_table("db.t", schema=SCHEMA)
    table.append(pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    assert table.location().startswith(lake_dir.as_uri() + "/db/t-")
    assert to_local_path(by_root.load_table("db.t").metadata_location).is_file()
    assert Path(to_local_path(table.metadata_location)).is_relative_to(lake_dir)
    assert by_root.load_table("db.t").scan().to_arrow().num_rows == 3
    # The default warehouse is another catalog: the table is not there, and its own tables stay in its root.
    with pytest.raises(NoSuchTableError):
        plain.load_table("db.t")
    plain.create_namespace("db")
    assert plain.create_table("db.t", schema=SCHEMA).location().startswith(config.warehouse_uri + "/db/t-")
    # A client may not choose a place outside the warehouse it named.
    with pytest.raises(BadRequestError, match="warehouse"):
        by_name.create_table("db.elsewhere", schema=SCHEMA, location=config.warehouse_uri + "/elsewhere")
    # While it holds anything, the warehouse stays.
    refused = httpx.delete(f"{service}{API}/lake")
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "WarehouseNotEmpty"
    by_name.drop_table("db.t")
    by_name.drop_namespace("db")
    assert httpx.delete(f"{service}{API}/lake").status_code == 204


def test_an_unknown_warehouse_is_a_404_never_the_default(service):
    r = httpx.get(service + "/v1/config", params={"warehouse": "nowhere"})
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "NotFoundException"
    assert "POST /api/coordinator/v1/warehouses" in r.json()["error"]["message"]
    with pytest.raises(RESTError):
        load_catalog("x", type="rest", uri=service, warehouse="s3://some-bucket/lake")
    # Naming the default warehouse, or nothing, answers no prefix.
    for params in ({"warehouse": "default"}, {}):
        assert "prefix" not in httpx.get(service + "/v1/config", params=params).json()["overrides"]


def test_the_cli_wraps_the_rest_api(service, tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "api.cli", "warehouse", "--url", service, *args],
                              capture_output=True, text=True, timeout=60)
    made = cli("create", "lake", (tmp_path / "lake").as_uri())
    assert made.returncode == 0 and "created warehouse lake" in made.stdout, made.stderr
    made = cli("create", "s3wh", "s3://bucket/p", "--endpoint", "http://127.0.0.1:9", "--path-style",
               "--access-key-id", "AK", "--secret-access-key", "SK")
    assert made.returncode == 0, made.stderr
    assert httpx.get(f"{service}{API}/s3wh").json()["storage"]["path_style"] is True
    listed = cli("list")
    assert listed.returncode == 0 and listed.stdout.splitlines()[1:] == [
        f"lake\t{(tmp_path / 'lake').as_uri()}", "s3wh\ts3://bucket/p"]
    again = cli("create", "lake", (tmp_path / "x").as_uri())
    assert again.returncode == 1 and "already exists" in again.stderr
    assert cli("drop", "lake").returncode == 0
    gone = cli("drop", "lake")
    assert gone.returncode == 1 and "does not exist" in gone.stderr
    unreachable = subprocess.run([sys.executable, "-m", "api.cli", "warehouse", "--url", "http://127.0.0.1:9",
                                  "list"], capture_output=True, text=True, timeout=60)
    assert unreachable.returncode == 1 and "cannot reach" in unreachable.stderr


def test_only_an_admin_manages_warehouses(config, tmp_path):
    config.auth_file = write_auth_file(tmp_path / "auth.toml", {
        "admin": ("admin-secret", [("*", ["admin"])]),
        "writer": ("writer-secret", [("*", ["read", "write", "create", "drop"])]),
    })
    with EmbeddedService(config) as base:
        admin = {"Authorization": "Bearer " + fetch_token(base, "admin", "admin-secret")}
        writer = {"Authorization": "Bearer " + fetch_token(base, "writer", "writer-secret")}
        assert create(base, "lake", (tmp_path / "lake").as_uri()).status_code == 401
        refused = create(base, "lake", (tmp_path / "lake").as_uri(), headers=writer)
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "Forbidden"
        assert httpx.get(base + API, headers=writer).status_code == 403
        assert httpx.delete(f"{base}{API}/default", headers=writer).status_code == 403
        assert create(base, "lake", (tmp_path / "lake").as_uri(), headers=admin).status_code == 201
        assert [w["name"] for w in httpx.get(base + API, headers=admin).json()["warehouses"]] == ["default", "lake"]


def test_lance_namespaces_place_tables_in_the_warehouse_they_name(service, config, tmp_path):
    import lance
    import lance_namespace
    from lance_namespace import CreateNamespaceRequest, DescribeTableRequest
    lake_dir = tmp_path / "lake"
    assert create(service, "lake", lake_dir.as_uri()).status_code == 201
    ns = lance_namespace.connect("rest", {"uri": service})
    ns.create_namespace(CreateNamespaceRequest(id=["sales"], properties={"warehouse": "lake"}))
    ns.create_namespace(CreateNamespaceRequest(id=["sales", "eu"]))
    ns.create_namespace(CreateNamespaceRequest(id=["plain"]))
    for t in (["sales", "orders"], ["sales", "eu", "orders"]):
        lance.write_dataset(pa.table({"a": [1, 2]}), namespace_client=ns, table_id=t, mode="create")
        ds = lance.write_dataset(pa.table({"a": [3]}), namespace_client=ns, table_id=t, mode="append")
        assert ds.count_rows() == 3
        location = ns.describe_table(DescribeTableRequest(id=t)).location
        assert location.startswith(lake_dir.as_uri() + "/" + "/".join(t[:-1]) + "/orders-"), location
        assert Path(to_local_path(location)).is_dir()
    lance.write_dataset(pa.table({"a": [1]}), namespace_client=ns, table_id=["plain", "t"], mode="create")
    assert ns.describe_table(DescribeTableRequest(id=["plain", "t"])).location.startswith(
        config.warehouse_uri + "/plain/t-")
    # An unknown warehouse, or one named below the top level, is refused in Lance's format; nothing is created.
    for ident, named in ((["x"], "nowhere"), (["sales", "x"], "lake")):
        r = httpx.post(f"{service}/v1/namespace/{'$'.join(ident)}/create", json={"properties": {"warehouse": named}})
        assert r.status_code == 400 and r.json()["code"] == 13, r.text
        assert httpx.post(f"{service}/v1/namespace/{'$'.join(ident)}/exists", json={}).status_code == 404
    refused = httpx.delete(f"{service}{API}/lake")
    assert refused.status_code == 409, refused.text


def test_unity_catalog_catalogs_with_a_storage_root_place_managed_tables_there(service, config, tmp_path):
    from tests.delta.conftest import UC
    lake_dir = tmp_path / "lake"
    assert create(service, "lake", lake_dir.as_uri()).status_code == 201
    uc = UC(service)
    made = uc.post("/catalogs", json={"name": "sales", "storage_root": lake_dir.as_uri() + "/uc"})
    assert made.status_code == 200 and made.json()["storage_root"] == lake_dir.as_uri() + "/uc", made.text
    table = uc.create_managed("orders", catalog="sales")
    assert table["storage_location"].startswith(lake_dir.as_uri() + "/uc/__unitystorage/tables/")
    assert uc.commit(table, 1).status_code == 200
    plain = uc.create_managed("orders")   # a catalog with no storage_root: the default warehouse, as before
    assert plain["storage_location"].startswith(config.warehouse_uri + "/__unitystorage/tables/")
    # A staging location of one catalog is not a managed location of another.
    st = uc.staging("other", catalog="sales")
    wrong = uc.post("/tables", json={"name": "other", "catalog_name": "main", "schema_name": "default",
                                     "table_type": "MANAGED", "data_source_format": "DELTA", "columns": [],
                                     "storage_location": st["staging_location"]})
    assert wrong.status_code == 400, wrong.text
    for outside in ((tmp_path / "nowhere").as_uri(), "s3://bucket/x", "relative"):
        r = uc.post("/catalogs", json={"name": "bad", "storage_root": outside})
        assert r.status_code == 400 and r.json()["error_code"] == "INVALID_PARAMETER_VALUE", r.text
        assert "must lie within a warehouse" in r.json()["message"]
    assert uc.get("/catalogs/bad").status_code == 404
    assert httpx.delete(f"{service}{API}/lake").status_code == 409
