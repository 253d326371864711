"""The read-only Iceberg REST catalog over Unity Catalog's namespace (`/api/2.1/unity-catalog/iceberg`), serving a
table whose writer converts to Iceberg itself and sends `uniform.iceberg` with its commits."""

from __future__ import annotations

import httpx
import pytest
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

from .conftest import MOUNT, iceberg_catalog
from .support import ManagedDelta, PyicebergWriter, batch, iceberg_rows


@pytest.fixture
def writer_table(uc, tmp_path) -> ManagedDelta:
    """A table whose writer converts each version to Iceberg with pyiceberg and sends `uniform.iceberg`."""
    md = ManagedDelta(uc, "events", tmp_path, properties={"delta.universalFormat.enabledFormats": "iceberg"},
                      uniform=PyicebergWriter(tmp_path))
    md.create(batch(range(0, 3)))
    return md


def test_config_answers_the_unity_catalog_prefix_and_only_read_endpoints(service, uc):
    uc.setup_schema("main", "default")
    r = httpx.get(service + MOUNT + "/v1/config", params={"warehouse": "main"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["overrides"]["prefix"] == "catalogs/main"
    assert all(e.split()[0] in ("GET", "HEAD") or e.endswith("/metrics") for e in body["endpoints"])
    r = httpx.get(service + MOUNT + "/v1/config")
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestException"
    r = httpx.get(service + MOUNT + "/v1/config", params={"warehouse": "nope"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundException", r.text


def test_a_writer_converted_table_reads_as_iceberg_after_each_kind_of_commit(service, writer_table):
    md = writer_table
    catalog = iceberg_catalog(service)
    assert catalog.list_namespaces() == [("default",)]
    md.append(batch(range(3, 6)))
    assert catalog.list_tables("default") == [("default", "events")]
    for step in (lambda: md.append(batch(range(6, 9), "b")), lambda: md.delete_file(0),
                 lambda: md.overwrite(batch(range(100, 104), "c")), lambda: md.append(batch(range(200, 202), "d"))):
        version = step()
        table = catalog.load_table("default.events")
        assert table.properties["delta-version"] == str(version)
        assert iceberg_rows(table) == md.rows(version)
    assert table.metadata_location.startswith(md.location + "/metadata/")


def test_a_table_without_iceberg_metadata_is_not_shown(service, uc, tmp_path):
    plain = ManagedDelta(uc, "plain", tmp_path, properties={})
    plain.create(batch(range(3)))
    catalog = iceberg_catalog(service)
    assert catalog.list_tables("default") == []
    with pytest.raises(NoSuchTableError, match="without Iceberg metadata"):
        catalog.load_table("default.plain")
    with pytest.raises(NoSuchNamespaceError):
        catalog.list_tables("nope")


def test_writes_are_refused_in_icebergs_format_naming_the_delta_api(service, writer_table):
    md = writer_table
    md.append(batch(range(3, 6)))
    base = service + MOUNT + "/v1/catalogs/main"
    cases = [("POST", "/namespaces", {"namespace": ["x"]}),
             ("POST", "/namespaces/default/tables", {"name": "t", "schema": {"type": "struct", "fields": []}}),
             ("POST", "/namespaces/default/tables/events", {"requirements": [], "updates": []}),
             ("DELETE", "/namespaces/default/tables/events", None), ("POST", "/tables/rename", {}),
             ("POST", "/transactions/commit", {"table-changes": []}), ("DELETE", "/namespaces/default", None)]
    for method, path, body in cases:
        r = httpx.request(method, base + path, json=body)
        assert r.status_code == 406, (method, path, r.text)
        error = r.json()["error"]
        assert error["type"] == "UnsupportedOperationException" and error["code"] == 406
        assert "Unity Catalog's Delta API" in error["message"]
    # pyiceberg reads the advertised endpoints and does not even send what the catalog does not serve.
    catalog = iceberg_catalog(service)
    with pytest.raises(NotImplementedError, match="does not support endpoint"):
        catalog.create_namespace("x")
    with pytest.raises(NotImplementedError, match="does not support endpoint"):
        catalog.drop_table("default.events")
    assert iceberg_rows(catalog.load_table("default.events")) == md.rows()


def test_with_authentication_the_delta_tables_grants_apply(config, tmp_path):
    """pyiceberg authenticates at the mount's own token endpoint (`<uri>/v1/oauth/tokens`); a table is read with
    the grants of the Delta table it shows, and a listing shows only what the caller may see."""
    from api.server import EmbeddedService
    from tests.delta.conftest import UC
    from tests.support import fetch_token, write_auth_file
    clients = {"admin": ("admin-secret", [("*", ["admin"])]),
               "reader": ("reader-secret", [{"table": "delta/main/default/events", "privileges": ["read"]}]),
               "nobody": ("nobody-secret", [])}
    config.auth_file = write_auth_file(tmp_path / "auth.toml", clients)
    with EmbeddedService(config) as base:
        uc = UC(base)
        uc.http.headers["Authorization"] = "Bearer " + fetch_token(base, "admin", "admin-secret")
        writer = PyicebergWriter(tmp_path)
        tables = {}
        for name in ("events", "hidden"):
            tables[name] = ManagedDelta(uc, name, tmp_path, properties={
                "delta.universalFormat.enabledFormats": "iceberg"}, uniform=writer)
            tables[name].create(batch(range(3)))
            tables[name].append(batch(range(3, 5)))
        reader = iceberg_catalog(base, credential="reader:reader-secret")
        assert reader.list_tables("default") == [("default", "events")]
        assert iceberg_rows(reader.load_table("default.events")) == tables["events"].rows()
        r = httpx.get(base + MOUNT + "/v1/catalogs/main/namespaces/default/tables/hidden",
                      headers={"Authorization": "Bearer " + fetch_token(base, "reader", "reader-secret")})
        assert r.status_code == 403 and r.json()["error"]["type"] == "ForbiddenException", r.text
        nobody = fetch_token(base, "nobody", "nobody-secret")
        r = httpx.get(base + MOUNT + "/v1/catalogs/main/namespaces/default/tables/events",
                      headers={"Authorization": f"Bearer {nobody}"})
        assert r.status_code == 403, r.text
        r = httpx.get(base + MOUNT + "/v1/config", params={"warehouse": "main"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "NotAuthorizedException"
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        uc.http.close()


def test_head_etags_snapshots_refs_and_credentials_work_as_on_the_iceberg_catalog(service, writer_table):
    md = writer_table
    md.append(batch(range(3, 6)))
    path = service + MOUNT + "/v1/catalogs/main/namespaces/default/tables/events"
    assert httpx.head(path).status_code == 204
    assert httpx.head(service + MOUNT + "/v1/catalogs/main/namespaces/default/tables/nope").status_code == 404
    assert httpx.head(service + MOUNT + "/v1/catalogs/main/namespaces/default").status_code == 204
    r = httpx.get(path)
    assert r.status_code == 200 and r.headers["ETag"]
    assert r.json()["metadata-location"].startswith(md.location + "/metadata/")
    assert httpx.get(path, headers={"If-None-Match": r.headers["ETag"]}).status_code == 304
    refs = httpx.get(path, params={"snapshots": "refs"})
    assert refs.status_code == 200 and refs.headers["ETag"] != r.headers["ETag"]
    md.append(batch(range(6, 9)))   # a new version: a new metadata file, a new ETag
    assert httpx.get(path, headers={"If-None-Match": r.headers["ETag"]}).status_code == 200
    snapshots = httpx.get(path).json()["metadata"]["snapshots"]
    refs = httpx.get(path, params={"snapshots": "refs"}).json()["metadata"]
    assert len(snapshots) > 1 and refs["snapshots"] == snapshots[-1:], snapshots   # main's only
    r = httpx.get(path + "/credentials")
    assert r.status_code == 200 and r.json() == {"storage-credentials": []}   # a local warehouse: none needed
    scan = {"report-type": "scan-report", "table-name": "default.events", "snapshot-id": 1, "metrics": {},
            "filter": True, "schema-id": 0, "projected-field-ids": [1], "projected-field-names": ["id"]}
    assert httpx.post(path + "/metrics", json=scan).status_code == 204


@pytest.fixture
def small_metadata(config):
    config.uniform_max_metadata_bytes = 1024
    return config


def test_a_writers_metadata_file_beyond_the_limit_is_refused_with_its_size(small_metadata, service, writer_table):
    writer_table.append(batch(range(3, 6)))   # (a commit that brings the writer's conversion)
    r = httpx.get(service + MOUNT + "/v1/catalogs/main/namespaces/default/tables/events")
    assert r.status_code == 406, r.text[:500]
    message = r.json()["error"]["message"]
    assert "bytes, more than the 1024 this service serves (uniform_max_metadata_bytes)" in message, message
