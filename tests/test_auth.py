"""Authentication and authorization: the token endpoint, every route guarded, 401/403 in each protocol's format,
and the real clients (pyiceberg, pylance, unitycatalog-client) authenticating end to end. Spark's is in
tests/spark (its module service runs with auth on)."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import jwt
import pyarrow as pa
import pytest

from api.access import POLICIES, PUBLIC, authenticated
from api.app import create_app
from api.protocols import PROTOCOLS
from api.server import EmbeddedService
from coordinator.auth import (AuthConfig, Grant, Principal, Privilege, format_path, hash_secret, parse_path,
                              verify_secret)
from coordinator.config import Config, ConfigError
from coordinator.service import Coordinator
from tests.delta.conftest import PREFIX, UC, commit_info
from tests.support import fetch_token, write_auth_file

CLIENTS = {
    "admin": ("admin-secret", [("*", ["admin"])]),
    # may work in Iceberg's default catalog's `db`, Unity Catalog's `main` and Lance's `db`, and read everything
    "writer": ("writer-secret", [("iceberg//db", ["read", "write", "create", "drop"]),
                                 ("delta/main", ["read", "write", "create", "drop"]),
                                 ("lance/db", ["read", "write", "create", "drop"]),
                                 ("*", ["read"])]),
    "reader": ("reader-secret", [("*", ["read"])]),
    # may change Iceberg's db tables but not make new ones; may make Lance namespaces and tables but drop none
    "updater": ("updater-secret", [("iceberg//db", ["read", "write"]), ("lance/db", ["read", "create"])]),
    "nobody": ("nobody-secret", []),
    # may read a few things here and there, and nothing at the top of any protocol
    "partial": ("partial-secret", [("iceberg//a", ["read"]), {"table": "iceberg//b/t", "privileges": ["read"]},
                                   ("delta/c1", ["read"]), ("delta/c2/s1", ["read"]), ("lance/a", ["read"]),
                                   {"table": "lance/b/t", "privileges": ["read"]}]),
}


@pytest.fixture
def auth_config(config, tmp_path) -> Config:
    config.auth_file = write_auth_file(tmp_path / "auth.toml", CLIENTS)
    return config


@pytest.fixture
def secured(auth_config):
    with EmbeddedService(auth_config) as base_url:
        yield base_url


@pytest.fixture
def tokens(secured) -> dict[str, str]:
    return {cid: fetch_token(secured, cid, secret) for cid, (secret, _) in CLIENTS.items()}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- the parts -------------------------------------------------------------------------------------------------


def test_secrets_are_hashed_and_verified():
    stored = hash_secret("s3cret")
    assert stored.startswith("scrypt$") and "s3cret" not in stored
    assert verify_secret("s3cret", stored)
    assert not verify_secret("s3cret!", stored)
    assert not verify_secret("s3cret", "plain")


def test_grants_are_inherited_downward():
    p = Principal("p", grants=(Grant(parse_path("iceberg//db"), frozenset({Privilege.WRITE})),
                               Grant(parse_path("lance"), frozenset({Privilege.ADMIN}))))
    assert p.may(Privilege.WRITE, ("iceberg", "", "db"))
    assert p.may(Privilege.WRITE, ("iceberg", "", "db", "sub", "t"))
    assert not p.may(Privilege.READ, ("iceberg", "", "db", "t"))        # write does not imply read
    assert not p.may(Privilege.WRITE, ("iceberg", "", "db2", "t"))      # a sibling is not below
    assert not p.may(Privilege.WRITE, ("iceberg", "wh", "db", "t"))     # another catalog
    assert p.may(Privilege.DROP, ("lance", "a", "b"))                   # admin implies every privilege
    assert parse_path("*") == () and parse_path("delta/a%2Fb") == ("delta", "a/b")
    assert format_path(()) == "*"


def test_auth_file_refuses_plain_secrets_and_unknown_roles(tmp_path):
    bad = tmp_path / "a.toml"
    bad.write_text('[[clients]]\nid = "x"\nsecret = "plaintext"\n')
    with pytest.raises(ConfigError, match="hash-secret"):
        AuthConfig.load(bad)
    bad.write_text(f'[[clients]]\nid = "x"\nsecret = "{hash_secret("s")}"\nroles = ["ghost"]\n')
    with pytest.raises(ConfigError, match="undefined roles"):
        AuthConfig.load(bad)
    bad.write_text('[roles.r]\ngrants = [{ on = "*", privileges = ["sudo"] }]\n')
    with pytest.raises(ConfigError, match="privileges"):
        AuthConfig.load(bad)


def test_no_auth_only_on_loopback(tmp_path):
    for host in ("127.0.0.1", "localhost", "::1"):
        Config(host=host).check_exposure()
    with pytest.raises(ConfigError, match="--auth-file"):
        Config(host="0.0.0.0").check_exposure()
    Config(host="0.0.0.0", insecure=True).check_exposure()
    Config(host="0.0.0.0", auth_file=tmp_path / "auth.toml").check_exposure()


def test_cli_refuses_to_expose_without_auth(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "api.cli", "serve", "--host", "0.0.0.0", "--data-dir",
                        str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--insecure" in r.stderr


# -- every route is guarded ----------------------------------------------------------------------------------------

_PLACEHOLDERS = {"prefix": "wh", "namespace": "db", "table": "t", "view": "v", "id": "db$t", "name": "main",
                 "full_name": "main.s.t", "rest": "x/y", "operation": "nope", "catalog": "main", "schema": "s",
                 "table_id": "5f115e00-a7b0-47ed-bccb-0850122f3e13"}


def _routes():
    app = create_app(Coordinator(Config()))
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static" or rule.rule.startswith("/static"):
            continue
        path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: _PLACEHOLDERS[m.group(1)], rule.rule)
        for method in sorted(rule.methods - {"OPTIONS"}):
            yield rule, method, path, app.view_functions[rule.endpoint]


def test_every_route_declares_an_access_policy():
    unguarded = [f"{m} {r.rule}" for r, m, _, view in _routes() if view not in POLICIES]
    assert not unguarded, f"routes without an access policy: {unguarded}"
    assert len(list(_routes())) > 60


def _assert_protocol_error(path: str, r: httpx.Response, status: int) -> None:
    assert r.status_code == status, (path, r.status_code, r.text)
    body = r.json() if r.request.method != "HEAD" else None
    if body is None:
        return
    protocol = PROTOCOLS.of(path)
    if path.startswith("/api/2.1/unity-catalog/delta/v1/"):   # the Delta API v1.0's own error model
        assert body["error"]["code"] == status and body["error"]["type"] == {
            401: "NotAuthorizedException", 403: "PermissionDeniedException"}[status], body
    elif protocol == "delta":
        assert body["error_code"] == {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED"}[status], body
    elif protocol == "lance":
        assert body["code"] == {401: 16, 403: 15}[status], body
    elif protocol == "coordinator":   # the service's own API (cross-format commits): the coordinator's names
        assert body["error"]["code"] == status and body["error"]["type"] == {
            401: "Unauthorized", 403: "Forbidden"}[status], body
    else:
        assert body["error"]["code"] == status and body["error"]["type"] == {
            401: "NotAuthorizedException", 403: "ForbiddenException"}[status], body


def test_every_route_refuses_requests_without_a_valid_token(secured):
    checked = 0
    expired = jwt.encode({"iss": "commit-coordinator", "sub": "admin", "exp": int(time.time()) - 5},
                         "a-key-this-service-never-signed-with", algorithm="HS256")
    with httpx.Client(base_url=secured, timeout=30) as http:
        for rule, method, path, view in _routes():
            r = http.request(method, path, json={} if method in ("POST", "DELETE") else None)
            if POLICIES[view] is PUBLIC:
                assert r.status_code != 401, (method, path)
                continue
            _assert_protocol_error(path, r, 401)
            assert r.headers["WWW-Authenticate"] == 'Bearer realm="coordinator"', (method, path)
            for refused in (expired, "garbage"):
                r = http.request(method, path, headers=bearer(refused))
                _assert_protocol_error(path, r, 401)
                # RFC 6750: a token was sent and refused
                assert r.headers["WWW-Authenticate"] == 'Bearer realm="coordinator", error="invalid_token"'
            checked += 1
    assert checked > 60


def test_every_guarded_route_refuses_a_principal_without_grants(secured, tokens):
    """`nobody` is authenticated but granted nothing: every route that names a securable answers 403 (or 400
    when the securable is in a body this probe leaves empty), never runs."""
    with httpx.Client(base_url=secured, timeout=30, headers=bearer(tokens["nobody"])) as http:
        for rule, method, path, view in _routes():
            if POLICIES[view] is PUBLIC:
                continue
            r = http.request(method, path)
            if POLICIES[view] is authenticated:
                assert r.status_code not in (401, 403), (method, path, r.text)
            elif r.status_code != 400:
                _assert_protocol_error(path, r, 403)


# -- the token endpoint ----------------------------------------------------------------------------------------


def test_token_endpoint(secured):
    url = f"{secured}/v1/oauth/tokens"
    r = httpx.post(url, data={"grant_type": "client_credentials", "client_id": "reader",
                              "client_secret": "reader-secret"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["token_type"] == "bearer" and body["expires_in"] == 3600
    assert body["issued_token_type"] == "urn:ietf:params:oauth:token-type:access_token"
    # HTTP Basic client authentication (RFC 6749 2.3.1) works too
    r = httpx.post(url, data={"grant_type": "client_credentials"}, auth=("reader", "reader-secret"))
    assert r.status_code == 200, r.text
    # token exchange: how Iceberg's Java client refreshes
    r = httpx.post(url, data={"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
                              "subject_token": body["access_token"],
                              "subject_token_type": "urn:ietf:params:oauth:token-type:access_token"})
    assert r.status_code == 200 and r.json()["access_token"] != body["access_token"]
    for data, status, error in [
        ({"grant_type": "client_credentials", "client_id": "reader", "client_secret": "wrong"}, 401,
         "invalid_client"),
        ({"grant_type": "client_credentials", "client_id": "ghost", "client_secret": "x"}, 401, "invalid_client"),
        ({"grant_type": "client_credentials", "client_id": "reader"}, 400, "invalid_request"),
        ({"grant_type": "password", "username": "u", "password": "p"}, 400, "unsupported_grant_type"),
        ({"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange", "subject_token": "junk"}, 401,
         "invalid_client"),
    ]:
        r = httpx.post(url, data=data)
        assert (r.status_code, r.json()["error"]) == (status, error), r.text
    # the config endpoint advertises where tokens come from
    config = httpx.get(f"{secured}/v1/config", headers=bearer(body["access_token"])).json()
    assert config["defaults"]["oauth2-server-uri"] == f"{secured}/v1/oauth/tokens"


def test_expired_token_is_refused(auth_config):
    write_auth_file(auth_config.auth_file, CLIENTS, token_ttl_s=2)
    with EmbeddedService(auth_config) as base_url:
        token = fetch_token(base_url, "reader", "reader-secret")
        assert httpx.get(f"{base_url}/v1/namespaces", headers=bearer(token)).status_code == 200
        time.sleep(3.1)
        r = httpx.get(f"{base_url}/v1/namespaces", headers=bearer(token))
        assert r.status_code == 401 and "expired" in r.json()["error"]["message"]


def test_token_signed_by_the_database_key_works_across_restarts(auth_config):
    """No signing key in the auth file: the first start stores one in the database, and a restarted (or
    another) process accepts the tokens issued before."""
    with EmbeddedService(auth_config) as base_url:
        token = fetch_token(base_url, "reader", "reader-secret")
    with EmbeddedService(auth_config) as base_url:
        assert httpx.get(f"{base_url}/v1/namespaces", headers=bearer(token)).status_code == 200


def test_a_garbage_token_is_told_what_to_do_in_our_words(secured):
    r = httpx.get(f"{secured}/v1/namespaces", headers=bearer("not.a-token"))
    message = r.json()["error"]["message"]
    assert r.status_code == 401 and "POST /v1/oauth/tokens" in message, message
    assert "segments" not in message.lower() and "decode" not in message.lower()  # never the JWT library's words


def test_auth_off_on_loopback_accepts_anonymous_requests(service):
    assert httpx.get(f"{service}/v1/namespaces").status_code == 200
    # With authentication off, whatever credential a client sends along is not looked at.
    for header in ({"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Bearer garbage"}):
        assert httpx.get(f"{service}/v1/namespaces", headers=header).status_code == 200
    r = httpx.post(f"{service}/v1/oauth/tokens", data={"grant_type": "client_credentials", "client_id": "a",
                                                       "client_secret": "b"})
    assert r.status_code == 400 and "no authentication" in r.json()["error_description"]


# -- 403 per protocol, through each protocol's own client -----------------------------------------------------------


def test_pyiceberg_with_client_credentials(secured):
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import ForbiddenError, OAuthError
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField

    writer = load_catalog("w", type="rest", uri=secured, credential="writer:writer-secret")
    admin = load_catalog("a", type="rest", uri=secured, credential="admin:admin-secret")
    reader = load_catalog("r", type="rest", uri=secured, credential="reader:reader-secret")
    admin.create_namespace("db")
    admin.create_namespace("other")
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    table = writer.create_table("db.events", schema)
    for i in range(3):
        table.append(pa.table({"id": pa.array([i], pa.int64())}))
    assert sorted(reader.load_table("db.events").scan().to_arrow()["id"].to_pylist()) == [0, 1, 2]
    with pytest.raises(ForbiddenError):
        reader.load_table("db.events").append(pa.table({"id": pa.array([9], pa.int64())}))
    with pytest.raises(ForbiddenError):
        writer.create_table("other.t", schema)          # writer may create in db only
    with pytest.raises(ForbiddenError):
        writer.drop_namespace("other")
    assert len(writer.load_table("db.events").scan().to_arrow()) == 3
    with pytest.raises(OAuthError):
        load_catalog("x", type="rest", uri=secured, credential="writer:wrong")


def test_pyiceberg_transaction_needs_write_on_every_table(secured, tokens):
    admin = httpx.Client(base_url=secured, headers=bearer(tokens["admin"]))
    for ns in ("db", "other"):
        admin.post("/v1/namespaces", json={"namespace": [ns]}).raise_for_status()
        admin.post(f"/v1/namespaces/{ns}/tables", json={"name": "t", "schema": {
            "type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "a", "type": "long",
                                                          "required": False}]}}).raise_for_status()
    change = lambda ns: {"identifier": {"namespace": [ns], "name": "t"}, "requirements": [],  # noqa: E731
                         "updates": [{"action": "set-properties", "updates": {"k": ns}}]}
    writer = httpx.Client(base_url=secured, headers=bearer(tokens["writer"]))
    r = writer.post("/v1/transactions/commit", json={"table-changes": [change("db"), change("other")]})
    _assert_protocol_error("/v1/transactions/commit", r, 403)
    props = admin.get("/v1/namespaces/db/tables/t").json()["metadata"]["properties"]
    assert "k" not in props  # nothing applied
    r = writer.post("/v1/transactions/commit", json={"table-changes": [change("db")]})
    assert r.status_code == 204, r.text


def test_pylance_with_authorization_header(secured, tokens):
    import lance
    import lance_namespace
    from lance_namespace import CreateNamespaceRequest, ListTableVersionsRequest

    def connect(token: str):
        return lance_namespace.connect("rest", {"uri": secured, "header.Authorization": f"Bearer {token}"})

    admin, writer, reader = connect(tokens["admin"]), connect(tokens["writer"]), connect(tokens["reader"])
    admin.create_namespace(CreateNamespaceRequest(id=["db"]))
    admin.create_namespace(CreateNamespaceRequest(id=["other"]))
    t = ["db", "events"]
    ds = lance.write_dataset(pa.table({"a": [1, 2]}), namespace_client=writer, table_id=t, mode="create")
    ds = lance.write_dataset(pa.table({"a": [3]}), namespace_client=writer, table_id=t, mode="append")
    assert ds.version == 2
    assert sorted(lance.dataset(namespace_client=reader, table_id=t).to_table()["a"].to_pylist()) == [1, 2, 3]
    # pylance reports a refused version/create as an unknown commit outcome (it cannot tell a 403 from a lost
    # answer); the version list shows nothing was applied
    with pytest.raises(Exception):
        lance.write_dataset(pa.table({"a": [4]}), namespace_client=reader, table_id=t, mode="append")
    with pytest.raises(Exception, match="(?i)forbidden|403|lacks"):
        lance.write_dataset(pa.table({"a": [1]}), namespace_client=writer, table_id=["other", "t"], mode="create")
    assert [v.version for v in reader.list_table_versions(ListTableVersionsRequest(id=t)).versions] == [1, 2]
    # the Lance spec's other identity header
    r = httpx.post(f"{secured}/v1/table/db$events/describe", json={}, headers={"x-api-key": tokens["reader"]})
    assert r.status_code == 200, r.text
    r = httpx.post(f"{secured}/v1/table/db$events/drop", json={}, headers={"x-api-key": tokens["reader"]})
    _assert_protocol_error("/v1/table/db$events/drop", r, 403)


def test_unitycatalog_client_with_token(secured, tokens):
    from unitycatalog.client import ApiClient, ApiException, CatalogsApi, Configuration, SchemasApi
    from unitycatalog.client.models import CreateCatalog, CreateSchema, UpdateCatalog

    def client(token: str | None) -> ApiClient:
        config = Configuration(host=secured + "/api/2.1/unity-catalog")
        if token is None:
            return ApiClient(config)
        return ApiClient(config, header_name="Authorization", header_value=f"Bearer {token}")

    async def run() -> None:
        async with client(tokens["admin"]) as admin, client(tokens["writer"]) as writer, \
                client(tokens["reader"]) as reader, client(None) as anonymous:
            made = await CatalogsApi(admin).create_catalog(CreateCatalog(name="main"))
            assert (made.owner, made.created_by, made.updated_by) == ("admin", "admin", "admin")
            await CatalogsApi(admin).create_catalog(CreateCatalog(name="other"))
            schema = await SchemasApi(writer).create_schema(CreateSchema(name="s", catalog_name="main"))
            assert (schema.owner, schema.created_by) == ("writer", "writer")   # each object records its maker
            updated = await CatalogsApi(writer).update_catalog("main", UpdateCatalog(comment="lake"))
            assert (updated.owner, updated.updated_by) == ("admin", "writer")
            assert [s.name for s in (await SchemasApi(reader).list_schemas("main")).schemas] == ["s"]
            with pytest.raises(ApiException) as exc:
                await SchemasApi(writer).create_schema(CreateSchema(name="s", catalog_name="other"))
            assert exc.value.status == 403 and "PERMISSION_DENIED" in exc.value.body
            with pytest.raises(ApiException) as exc:
                await SchemasApi(reader).delete_schema("main.s")
            assert exc.value.status == 403
            with pytest.raises(ApiException) as exc:
                await CatalogsApi(anonymous).list_catalogs()
            assert exc.value.status == 401 and "UNAUTHENTICATED" in exc.value.body

    asyncio.run(run())


def test_delta_commit_by_table_id_is_authorized_on_the_tables_name(secured, tokens):
    """Commits name a table by id only; the check is against its catalog.schema.table all the same."""
    import uuid
    admin = UC(secured)
    admin.http.headers.update(bearer(tokens["admin"]))
    admin.setup_schema("main", "s")
    staged = admin.staging("t", "main", "s")
    body = {"table_id": staged["id"], "table_uri": staged["staging_location"], "commit_info": commit_info(1, "x.json")}
    reader = httpx.Client(base_url=secured + PREFIX, headers=bearer(tokens["reader"]))
    r = reader.post("/delta/preview/commits", json=body)
    _assert_protocol_error("/api/2.1/unity-catalog/delta/preview/commits", r, 403)
    assert "main/s/t" in r.json()["message"]
    # an id that names no table is checked against the whole Delta realm: the writer may not probe it
    writer = httpx.Client(base_url=secured + PREFIX, headers=bearer(tokens["writer"]))
    r = writer.post("/delta/preview/commits", json={**body, "table_id": str(uuid.uuid4())})
    _assert_protocol_error("/api/2.1/unity-catalog/delta/preview/commits", r, 403)


def test_delta_v1_checks_grants_by_path_before_any_body_and_staging_tables_are_their_creators(secured, tokens):
    """Delta API v1.0: every route's grants are named by its path, so they are checked before a body is read (a
    malformed body from a reader is 403, not 400); a staging table's credentials and its finalizing are its
    creator's only (the spec), whatever else they may do."""
    from tests.delta.conftest import FIRST, first_commit, write_log_file
    v1 = "/api/2.1/unity-catalog/delta/v1/catalogs/main/schemas/s"
    admin = UC(secured)
    admin.http.headers.update(bearer(tokens["admin"]))
    admin.setup_schema("main", "s")
    writer = httpx.Client(base_url=secured, headers=bearer(tokens["writer"]), timeout=30)
    st = writer.post(f"{v1}/staging-tables", json={"name": "t"})
    assert st.status_code == 200, st.text
    st = st.json()
    other = httpx.Client(base_url=secured, headers=bearer(tokens["admin"]), timeout=30)
    path = f"/api/2.1/unity-catalog/delta/v1/staging-tables/{st['table-id']}/credentials"
    _assert_protocol_error(path, other.get(path), 403)
    assert writer.get(path).status_code == 200
    write_log_file(st["location"], FIRST, first_commit(st["table-id"]))
    create = {"name": "t", "location": st["location"], "table-type": "MANAGED", "protocol": st["required-protocol"],
              "columns": {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True,
                                                        "metadata": {}}]},
              "properties": st["required-properties"], "last-commit-timestamp-ms": int(time.time() * 1000)}
    _assert_protocol_error(f"{v1}/tables", other.post(f"{v1}/tables", json=create), 403)
    r = writer.post(f"{v1}/tables", json=create)
    assert r.status_code == 200, r.text
    reader = httpx.Client(base_url=secured, headers=bearer(tokens["reader"]), timeout=30)
    assert reader.get(f"{v1}/tables/t").status_code == 200
    for method, suffix in (("POST", ""), ("POST", "/rename"), ("POST", "/metrics"), ("DELETE", "")):
        r = reader.request(method, f"{v1}/tables/t{suffix}", content=b"{not json")
        _assert_protocol_error(f"{v1}/tables/t{suffix}", r, 403)
    _assert_protocol_error(f"{v1}/tables/t", httpx.post(secured + f"{v1}/tables/t", content=b"{not json"), 401)
    nobody = httpx.Client(base_url=secured, headers=bearer(tokens["nobody"]), timeout=30)
    r = nobody.head(f"{v1}/tables/t")
    assert r.status_code == 403 and r.content == b""


ICEBERG_CREATE_CHANGE = {"requirements": [{"type": "assert-create"}], "updates": [
    {"action": "assign-uuid", "uuid": "8b1a4c52-4b2e-4f43-9f0e-3c3c2c6a1a11"},
    {"action": "upgrade-format-version", "format-version": 2},
    {"action": "add-schema", "schema": {"type": "struct", "schema-id": 0, "fields": [
        {"id": 1, "name": "a", "type": "long", "required": False}]}},
    {"action": "set-current-schema", "schema-id": -1},
    {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}}, {"action": "set-default-spec", "spec-id": -1},
    {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
    {"action": "set-default-sort-order", "sort-order-id": -1}]}


def test_iceberg_create_transaction_needs_create(secured, tokens):
    """A commit with `assert-create` makes a table: `write` on the namespace's tables is not enough."""
    admin = httpx.Client(base_url=secured, headers=bearer(tokens["admin"]))
    admin.post("/v1/namespaces", json={"namespace": ["db"]}).raise_for_status()
    updater = httpx.Client(base_url=secured, headers=bearer(tokens["updater"]))
    _assert_protocol_error("/v1/namespaces/db/tables/sneaky",
                           updater.post("/v1/namespaces/db/tables/sneaky", json=ICEBERG_CREATE_CHANGE), 403)
    r = updater.post("/v1/transactions/commit", json={"table-changes": [
        {"identifier": {"namespace": ["db"], "name": "sneaky"}, **ICEBERG_CREATE_CHANGE}]})
    _assert_protocol_error("/v1/transactions/commit", r, 403)
    assert admin.get("/v1/namespaces/db/tables").json()["identifiers"] == []
    writer = httpx.Client(base_url=secured, headers=bearer(tokens["writer"]))
    assert writer.post("/v1/namespaces/db/tables/made", json=ICEBERG_CREATE_CHANGE).status_code == 200


def test_lance_overwrite_modes_need_drop(secured, tokens, tmp_path):
    """Mode overwrite drops what is there (a namespace with its tables and data, a table's registration): it
    needs `drop` on it besides `create` in the parent."""
    admin = httpx.Client(base_url=secured, headers=bearer(tokens["admin"]))
    admin.post("/v1/namespace/db/create", json={}).raise_for_status()
    admin.post("/v1/namespace/db$sub/create", json={}).raise_for_status()
    admin.post("/v1/table/db$sub$precious/declare", json={}).raise_for_status()
    admin.post("/v1/table/db$kept/declare", json={}).raise_for_status()
    updater = httpx.Client(base_url=secured, headers=bearer(tokens["updater"]))
    for mode in ("overwrite", "Overwrite", "over_write", "OVER_WRITE"):   # every spelling the handler reads
        r = updater.post("/v1/namespace/db$sub/create", json={"mode": mode})
        _assert_protocol_error("/v1/namespace/db$sub/create", r, 403)
    r = updater.post("/v1/table/db$kept/register", json={"location": (tmp_path / "elsewhere").as_uri(),
                                                          "mode": "Overwrite"})
    _assert_protocol_error("/v1/table/db$kept/register", r, 403)
    assert admin.get("/v1/namespace/db$sub/table/list").json() == {"tables": ["precious"]}
    assert updater.post("/v1/namespace/db$new/create", json={"mode": "create"}).status_code == 200


def test_delta_routes_do_not_name_other_protocols_tables(secured, tokens):
    """A Delta commit route given an Iceberg table's id treats it as unknown: the answer must not name it."""
    admin = httpx.Client(base_url=secured, headers=bearer(tokens["admin"]))
    admin.post("/v1/namespaces", json={"namespace": ["secret"]}).raise_for_status()
    admin.post("/v1/namespaces/secret/tables", json={"name": "payroll", "schema": {
        "type": "struct", "schema-id": 0, "fields": []}}).raise_for_status()
    iceberg_id = admin.get("/v1/namespaces/secret/tables/payroll").json()["metadata"]["table-uuid"]
    updater = httpx.Client(base_url=secured + PREFIX, headers=bearer(tokens["updater"]))  # no Delta grant
    r = updater.get("/delta/commits", params={"table_id": iceberg_id, "table_uri": "x"})
    _assert_protocol_error("/api/2.1/unity-catalog/delta/commits", r, 403)
    assert "payroll" not in r.text and "secret" not in r.text
    reader = httpx.Client(base_url=secured + PREFIX, headers=bearer(tokens["reader"]))  # may read all of Delta
    r = reader.get("/delta/commits", params={"table_id": iceberg_id, "table_uri": "x"})
    assert r.status_code == 404 and r.json()["error_code"] == "TABLE_DOES_NOT_EXIST", r.text
    assert "payroll" not in r.text and "secret" not in r.text


def test_with_grants_a_tables_location_stays_in_its_namespaces_directory(secured, tokens, auth_config, tmp_path):
    """Locations are exclusive, so a location is a claim: with authentication on, a client may place a table only
    inside its namespace's directory, never where another namespace's tables go (which would block them), and an
    EXTERNAL Delta table only outside the warehouse."""
    warehouse = auth_config.warehouse_uri
    admin = httpx.Client(base_url=secured, headers=bearer(tokens["admin"]))
    for ns in ("db", "victim"):
        admin.post("/v1/namespaces", json={"namespace": [ns]}).raise_for_status()
        admin.post(f"/v1/namespace/{ns}/create", json={}).raise_for_status()
    writer = httpx.Client(base_url=secured, headers=bearer(tokens["writer"]))
    schema = {"type": "struct", "schema-id": 0, "fields": []}
    for location in (f"{warehouse}/victim", f"{warehouse}/victim/t", f"{warehouse}/db", warehouse):
        r = writer.post("/v1/namespaces/db/tables", json={"name": "t", "schema": schema, "location": location})
        assert r.status_code == 400, (location, r.text)
        r = writer.post("/v1/table/db$t/declare", json={"location": location})
        assert r.status_code == 400, (location, r.text)
    assert writer.post("/v1/namespaces/db/tables", json={"name": "t", "schema": schema,
                                                         "location": f"{warehouse}/db/custom"}).status_code == 200
    assert writer.post("/v1/table/db$t/declare", json={"location": f"{warehouse}/db/lance"}).status_code == 200
    # and the victim namespace still takes tables
    assert admin.post("/v1/namespaces/victim/tables", json={"name": "v", "schema": schema}).status_code == 200
    admin_uc = UC(secured)
    admin_uc.http.headers.update(bearer(tokens["admin"]))
    admin_uc.setup_schema("main", "s")
    uc = httpx.Client(base_url=secured + PREFIX, headers=bearer(tokens["writer"]))
    body = {"catalog_name": "main", "schema_name": "s", "table_type": "EXTERNAL", "data_source_format": "PARQUET",
            "columns": []}
    r = uc.post("/tables", json={**body, "name": "inside", "storage_location": f"{warehouse}/wh2"})
    assert r.status_code == 400 and r.json()["error_code"] == "INVALID_PARAMETER_VALUE", r.text
    r = uc.post("/tables", json={**body, "name": "outside", "storage_location": (tmp_path / "ext").as_uri()})
    assert r.status_code == 200, r.text


def test_listings_show_a_partly_granted_client_what_it_may_see(secured, tokens):
    """As Polaris and Unity Catalog list: a client granted `a` and a table in `b` lists the root and sees `a` and
    `b` (the way down to its table), and in `b` only that table; a container it holds nothing within stays 403."""
    admin = httpx.Client(base_url=secured, timeout=30, headers=bearer(tokens["admin"]))
    partial = httpx.Client(base_url=secured, timeout=30, headers=bearer(tokens["partial"]))
    schema = {"type": "struct", "schema-id": 0, "fields": []}
    for ns in ("a", "b", "c"):
        assert admin.post("/v1/namespaces", json={"namespace": [ns]}).status_code == 200
        for t in ("t", "u"):
            assert admin.post(f"/v1/namespaces/{ns}/tables", json={"name": t, "schema": schema}).status_code == 200
        assert admin.post(f"/v1/namespace/{ns}/create", json={}).status_code == 200
        for t in ("t", "u"):
            assert admin.post(f"/v1/table/{ns}${t}/declare", json={}).status_code == 200
    for c in ("c1", "c2", "c3"):
        assert admin.post(f"{PREFIX}/catalogs", json={"name": c}).status_code == 200
        for s in ("s1", "s2"):
            assert admin.post(f"{PREFIX}/schemas", json={"name": s, "catalog_name": c}).status_code == 200

    assert partial.get("/v1/namespaces").json()["namespaces"] == [["a"], ["b"]]
    assert [i["name"] for i in partial.get("/v1/namespaces/a/tables").json()["identifiers"]] == ["t", "u"]
    assert [i["name"] for i in partial.get("/v1/namespaces/b/tables").json()["identifiers"]] == ["t"]
    assert partial.get("/v1/namespaces/c/tables").status_code == 403
    assert [c["name"] for c in partial.get(f"{PREFIX}/catalogs").json()["catalogs"]] == ["c1", "c2"]
    assert [s["name"] for s in partial.get(f"{PREFIX}/schemas", params={"catalog_name": "c2"}).json()["schemas"]] == \
        ["s1"]
    assert partial.get(f"{PREFIX}/schemas", params={"catalog_name": "c3"}).status_code == 403
    assert partial.get("/v1/namespace/$/list").json()["namespaces"] == ["a", "b"]
    assert partial.get("/v1/namespace/b/table/list").json()["tables"] == ["t"]
    assert partial.get("/v1/table/list").json()["tables"] == ["a$t", "a$u", "b$t"]
    assert partial.get("/v1/namespace/c/table/list").status_code == 403
    # a client granted everything still sees everything
    assert len(admin.get("/v1/namespaces").json()["namespaces"]) == 3
