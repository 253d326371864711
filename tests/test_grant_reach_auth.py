"""A client with a narrow grant (or none) reaches no further than its grant: not the service's memory or its
`/metrics`, not its database through metrics reports, not a namespace named like its table, not past a revoked
secret, not another origin's console sign-in, not a named warehouse's root, not the secret checks of others; and
an unforeseen failure on the commit path is reported as unknown, never as "not applied" (issue 32, items 3 and
5-9). Each test goes over HTTP as such a client would, then checks the state it must not have changed."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import jwt
import pytest

import storage.errors
from api.server import EmbeddedService
from coordinator.auth import AuthConfig
from coordinator.formats import FORMATS
from coordinator.config import ConfigError
from tests.delta.conftest import COLUMNS, PREFIX, UC
from tests.support import fetch_token, sql, write_auth_file

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "a", "type": "long", "required": False}]}
ADMIN = ("admin-secret", [("*", ["admin"])])


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def uc_as(base: str, token: str) -> UC:
    uc = UC(base)
    uc.http.headers.update(bearer(token))
    return uc


def create_warehouse(base: str, token: str, name: str, root: Path) -> Path:
    r = httpx.post(f"{base}/api/coordinator/v1/warehouses", headers=bearer(token),
                   json={"name": name, "location": root.as_uri()})
    assert r.status_code == 201, r.text
    return root


@pytest.fixture
def auth(config, tmp_path):
    """`start(clients, **auth-file settings)` (re)starts the service with these clients; it returns the base URL
    and a token of each client."""
    running: list[EmbeddedService] = []

    def start(clients: dict, **settings) -> tuple[str, dict[str, str]]:
        while running:
            running.pop().stop()
        config.auth_file = write_auth_file(tmp_path / "auth.toml", clients, **settings)
        service = EmbeddedService(config)
        base = service.start()
        running.append(service)
        return base, {cid: fetch_token(base, cid, secret) for cid, (secret, _) in clients.items()}
    yield start
    while running:
        running.pop().stop()


# -- item 3: what a client sends never becomes a metric label -------------------------------------------------------


def raw_request(base: str, method: str, path: str) -> bytes:
    """One request with a method token of the caller's choosing (any token is valid HTTP), as an attacker sends it."""
    address = urlsplit(base)
    with socket.create_connection((address.hostname, address.port), timeout=30) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


def test_no_request_an_anonymous_client_sends_grows_the_metrics(auth):
    base, _ = auth({"admin": ADMIN})
    before = httpx.get(f"{base}/metrics").text
    tokens = [f"X{uuid.uuid4().hex.upper()}{'M' * 8000}" for _ in range(24)]
    for i, token in enumerate(tokens):
        path = ("/v1/namespaces", "/api/2.1/unity-catalog/catalogs", f"/nowhere/{uuid.uuid4()}")[i % 3]
        assert raw_request(base, token, path).startswith(b"HTTP/1.1 4")   # 401 or 405: refused, not served
    after = httpx.get(f"{base}/metrics").text
    assert not any(token[:33] in after for token in tokens)
    # The only new series: one per (protocol, route, status class), the method told as "other".
    assert len(after) - len(before) < 20_000, len(after) - len(before)
    assert 'route="other unmatched"' in after or 'route="other /v1/namespaces"' in after


# -- item 5: metrics reports are bounded in size and count, and expire -------------------------------------------------


def iceberg_report(snapshot_id: int, **extra) -> dict:
    return {"report-type": "commit-report", "table-name": "db.t", "snapshot-id": snapshot_id, "sequence-number": 1,
            "operation": "append", "metrics": {}, **extra}


def stored_iceberg_reports(database_url: str) -> list[dict]:
    rows = sql(database_url, "SELECT report FROM iceberg_metric_reports ORDER BY created_at")
    return [r["report"] if isinstance(r["report"], dict) else json.loads(r["report"]) for r in rows]


def test_a_read_grant_cannot_fill_the_database_with_iceberg_metrics_reports(auth, config, database_url):
    config.metrics_reports_per_table = 5
    base, tokens = auth({"admin": ADMIN, "reader": ("reader-secret", [("iceberg//db", ["read"])])})
    admin = httpx.Client(base_url=base, headers=bearer(tokens["admin"]), timeout=30)
    assert admin.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    assert admin.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    reader = httpx.Client(base_url=base, headers=bearer(tokens["reader"]), timeout=30)
    huge = reader.post("/v1/namespaces/db/tables/t/metrics", json=iceberg_report(1, padding="x" * 8 * 1024 * 1024))
    assert huge.status_code == 400 and "metrics_report_max_bytes" in huge.json()["error"]["message"], huge.text
    assert stored_iceberg_reports(database_url) == []
    for snapshot_id in range(1, 13):
        assert reader.post("/v1/namespaces/db/tables/t/metrics", json=iceberg_report(snapshot_id)).status_code == 204
    assert [r["snapshot-id"] for r in stored_iceberg_reports(database_url)] == [8, 9, 10, 11, 12]   # the newest 5


def test_metrics_reports_expire(auth, config, database_url):
    config.metrics_report_retain_s = 1.0
    base, tokens = auth({"admin": ADMIN})
    admin = httpx.Client(base_url=base, headers=bearer(tokens["admin"]), timeout=30)
    assert admin.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    assert admin.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    assert admin.post("/v1/namespaces/db/tables/t/metrics", json=iceberg_report(1)).status_code == 204
    assert len(stored_iceberg_reports(database_url)) == 1
    deadline = time.monotonic() + 15
    while stored_iceberg_reports(database_url) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stored_iceberg_reports(database_url) == []


def test_delta_metrics_are_bounded_in_size_and_count(auth, config, database_url):
    config.metrics_reports_per_table = 3
    base, tokens = auth({"admin": ADMIN, "writer": ("writer-secret", [("delta/main", ["read", "write"])])})
    admin = uc_as(base, tokens["admin"])
    table = admin.create_managed("t")
    writer = httpx.Client(base_url=base + PREFIX, headers=bearer(tokens["writer"]), timeout=30)

    def report(**fields) -> dict:
        return {"table_id": table["table_id"], "table_uri": table["storage_location"],
                "report": {"commit_report": {"commit_version": 0, **fields}}}
    huge = report(file_size_histogram={"sorted_bin_boundaries": list(range(200_000)),
                                       "file_counts": [1] * 200_000, "total_bytes": [1] * 200_000})
    r = writer.post("/delta/metrics", json=huge)
    assert r.status_code == 400 and r.json()["error_code"] == "INVALID_PARAMETER_VALUE", r.text
    assert sql(database_url, "SELECT count(*) AS n FROM delta_commit_metrics")[0]["n"] == 0
    for files in range(1, 9):
        assert writer.post("/delta/metrics", json=report(num_files_added=files)).status_code == 200
    rows = sql(database_url, "SELECT report FROM delta_commit_metrics ORDER BY created_at")
    assert [json.loads(r["report"])["num_files_added"] for r in rows] == [6, 7, 8]


# -- item 6: a grant names a table or a namespace, never both ------------------------------------------------------------


def test_a_table_grant_reaches_neither_a_namespace_of_its_name_nor_what_is_in_it(auth):
    base, tokens = auth({
        "admin": ADMIN,
        "orders": ("orders-secret", [{"table": "iceberg//sales/orders", "privileges": ["admin"]},
                                     {"table": "lance/sales/orders", "privileges": ["admin"]}]),
        # a namespace grant reaches the namespace of that name, not a table of that name
        "nsgrant": ("nsgrant-secret", [("iceberg//sales/orders", ["admin"])]),
    })
    admin = httpx.Client(base_url=base, headers=bearer(tokens["admin"]), timeout=30)
    for ns in (["sales"], ["sales", "orders"]):
        assert admin.post("/v1/namespaces", json={"namespace": ns}).status_code == 200
    assert admin.post("/v1/namespaces/sales/tables", json={"name": "orders", "schema": SCHEMA}).status_code == 200
    assert admin.post("/v1/namespaces/sales%1Forders/tables", json={"name": "secret", "schema": SCHEMA}).status_code \
        == 200
    for ident in ("sales", "sales$orders"):
        assert admin.post(f"/v1/namespace/{ident}/create", json={}).status_code == 200
    for ident in ("sales$orders", "sales$orders$secret"):
        assert admin.post(f"/v1/table/{ident}/declare", json={}).status_code == 200

    orders = httpx.Client(base_url=base, headers=bearer(tokens["orders"]), timeout=30)
    assert orders.get("/v1/namespaces/sales/tables/orders").status_code == 200          # its own table
    assert orders.post("/v1/table/sales$orders/describe", json={}).status_code == 200
    refused = [
        orders.get("/v1/namespaces/sales%1Forders/tables/secret"),
        orders.get("/v1/namespaces/sales%1Forders"),
        orders.get("/v1/namespaces/sales%1Forders/tables"),
        orders.post("/v1/namespaces/sales%1Forders/tables", json={"name": "planted", "schema": SCHEMA}),
        orders.post("/v1/namespaces/sales%1Forders/tables/secret", json={"requirements": [], "updates": [
            {"action": "set-properties", "updates": {"owned": "yes"}}]}),
        orders.delete("/v1/namespaces/sales%1Forders/tables/secret"),
        orders.post("/v1/table/sales$orders$secret/describe", json={}),
        orders.post("/v1/table/sales$orders$planted/declare", json={}),
        orders.post("/v1/table/sales$orders$secret/drop", json={}),
        orders.post("/v1/namespace/sales$orders$sub/create", json={}),
    ]
    assert [r.status_code for r in refused] == [403] * len(refused), [r.text for r in refused]
    # the namespace of its table's name is not even listed to it
    assert orders.get("/v1/namespaces", params={"parent": "sales"}).json()["namespaces"] == []
    assert orders.get("/v1/namespace/sales/list").json()["namespaces"] == []
    # and nothing changed there
    secret = admin.get("/v1/namespaces/sales%1Forders/tables/secret").json()["metadata"]
    assert "owned" not in secret["properties"]
    assert [i["name"] for i in admin.get("/v1/namespaces/sales%1Forders/tables").json()["identifiers"]] == ["secret"]
    assert admin.get("/v1/namespace/sales$orders/table/list").json()["tables"] == ["secret"]
    assert admin.get("/v1/namespace/sales$orders/list").json()["namespaces"] == []

    nsgrant = httpx.Client(base_url=base, headers=bearer(tokens["nsgrant"]), timeout=30)
    assert nsgrant.get("/v1/namespaces/sales%1Forders/tables/secret").status_code == 200
    assert nsgrant.get("/v1/namespaces/sales/tables/orders").status_code == 403
    assert nsgrant.delete("/v1/namespaces/sales/tables/orders").status_code == 403
    assert admin.get("/v1/namespaces/sales/tables/orders").status_code == 200


def test_the_auth_file_says_what_each_grant_names(tmp_path):
    def load(grant: str) -> None:
        path = tmp_path / "auth.toml"
        path.write_text(f'[roles.r]\ngrants = [{grant}]\n')
        AuthConfig.load(path, FORMATS.grants)
    load('{ table = "iceberg//ns/t", privileges = ["read"] }')
    load('{ table = "delta/c/s/t", privileges = ["read"] }')
    load('{ table = "lance/t", privileges = ["read"] }')
    for bad, says in [('{ on = "iceberg//ns", table = "iceberg//ns/t", privileges = ["read"] }', "one of the two"),
                      ('{ privileges = ["read"] }', "one of the two"),
                      ('{ on = "delta/c/s/t", privileges = ["read"] }', "table = "),
                      ('{ table = "delta/c/t", privileges = ["read"] }', "names no table"),
                      ('{ table = "iceberg//t", privileges = ["read"] }', "names no table"),
                      ('{ on = "icberg//ns", privileges = ["read"] }', "starts with the format")]:
        with pytest.raises(ConfigError, match=says):
            load(bad)


# -- item 7: tokens are revocable and exchanges end; the console's cookie and sign-in; warehouses; throttling -----------


def token_form(**fields) -> dict:
    return {"grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "subject_token_type": "urn:ietf:params:oauth:token-type:access_token", **fields}


def test_a_new_secret_revokes_the_tokens_issued_before(auth, config, tmp_path):
    base, tokens = auth({"admin": ADMIN, "etl": ("old-secret", [("*", ["read"])])})
    old = tokens["etl"]
    assert httpx.get(f"{base}/v1/namespaces", headers=bearer(old)).status_code == 200
    # the operator gives etl a new secret and restarts the service
    base, _ = auth({"admin": ADMIN, "etl": ("new-secret", [("*", ["read"])])})
    r = httpx.get(f"{base}/v1/namespaces", headers=bearer(old))
    assert r.status_code == 401 and "revoked" in r.json()["error"]["message"], r.text
    r = httpx.post(f"{base}/v1/oauth/tokens", data=token_form(subject_token=old))
    assert r.status_code == 401 and r.json()["error"] == "invalid_client", r.text
    assert httpx.get(f"{base}/v1/namespaces", headers=bearer(fetch_token(base, "etl", "new-secret"))).status_code \
        == 200


def test_a_token_exchange_cannot_renew_a_token_forever(auth):
    """Each exchange answers a token expiring no later than `token_exchange_max_s` after the client proved its
    secret: renewing one token after another ends there."""
    base, tokens = auth({"etl": ("etl-secret", [("*", ["read"])])}, token_exchange_max_s=4)
    url = f"{base}/v1/oauth/tokens"
    claims = jwt.decode(tokens["etl"], options={"verify_signature": False})
    proved = claims.get("auth_time", claims["iat"])
    token, renewals = tokens["etl"], 0
    while True:
        r = httpx.post(url, data=token_form(subject_token=token))
        if r.status_code != 200:
            break
        token, renewals = r.json()["access_token"], renewals + 1
        assert jwt.decode(token, options={"verify_signature": False})["exp"] <= proved + 4
        assert time.time() < proved + 30, "token exchange went on renewing"
        time.sleep(0.5)
    assert r.status_code == 401 and r.json()["error"] == "invalid_client" and renewals >= 1, r.text
    # as Iceberg's Java client refreshes a token once it has expired: the exchange sent with its credentials
    r = httpx.post(url, data=token_form(subject_token=token), auth=("etl", "etl-secret"))
    assert r.status_code == 200, r.text
    assert httpx.get(f"{base}/v1/namespaces", headers=bearer(r.json()["access_token"])).status_code == 200
    assert httpx.post(url, data=token_form(subject_token=token), auth=("etl", "wrong")).status_code == 401


def sign_in(base: str, **headers) -> httpx.Response:
    return httpx.post(f"{base}/ui/login", data={"client_id": "admin", "client_secret": "admin-secret"},
                      headers=headers, follow_redirects=False)


def test_the_console_signs_in_only_from_its_own_origin(auth):
    base, _ = auth({"admin": ADMIN})
    for headers in ({"Origin": "http://evil.example"}, {"Referer": "http://evil.example/login.html"}, {},
                    {"Origin": "null"}, {"Origin": base.replace("http://", "https://")}):
        r = sign_in(base, **headers)
        assert r.status_code == 403 and "set-cookie" not in r.headers, (headers, r.status_code)
        assert "own page" in r.text
    r = sign_in(base, Origin=base)
    assert r.status_code == 302 and "coordinator_console_token=" in r.headers["set-cookie"]
    assert "secure" not in r.headers["set-cookie"].lower()   # plain HTTP: a Secure cookie would never come back
    assert sign_in(base, Referer=f"{base}/ui/login").status_code == 302


def test_behind_a_tls_proxy_the_console_cookie_is_secure(auth, config):
    config.tls_proxy = True
    base, _ = auth({"admin": ADMIN})
    host = urlsplit(base).netloc
    assert sign_in(base, Origin=f"http://{host}").status_code == 403   # the browser's page was https
    r = sign_in(base, Origin=f"https://{host}")
    assert r.status_code == 302
    cookie = r.headers["set-cookie"].lower()
    assert "secure" in cookie and "httponly" in cookie and "samesite=strict" in cookie


def test_an_external_delta_table_cannot_claim_a_named_warehouse(auth, tmp_path):
    base, tokens = auth({"admin": ADMIN, "writer": ("writer-secret", [("delta/main", ["admin"])])})
    lake = create_warehouse(base, tokens["admin"], "lake", tmp_path / "lake")
    admin = uc_as(base, tokens["admin"])
    admin.setup_schema("main", "s")
    writer = httpx.Client(base_url=base + PREFIX, headers=bearer(tokens["writer"]), timeout=30)
    body = {"catalog_name": "main", "schema_name": "s", "table_type": "EXTERNAL", "data_source_format": "PARQUET",
            "columns": COLUMNS}
    for name, location in (("inside", (lake / "ns").as_uri()), ("root", lake.as_uri()),
                           ("around", tmp_path.as_uri())):
        r = writer.post("/tables", json={**body, "name": name, "storage_location": location})
        assert r.status_code == 400 and "outside every warehouse" in r.json()["message"], (location, r.text)
        assert admin.get(f"/tables/main.s.{name}").status_code == 404
    # Lance's namespaces still take that warehouse's root
    lance = httpx.Client(base_url=base, headers=bearer(tokens["admin"]), timeout=30)
    assert lance.post("/v1/namespace/lakens/create", json={"properties": {"warehouse": "lake"}}).status_code == 200
    declared = lance.post("/v1/table/lakens$t/declare", json={})
    assert declared.status_code == 200 and declared.json()["location"].startswith(lake.as_uri()), declared.text


def test_token_requests_are_throttled_per_client_with_a_bounded_queue(auth, config):
    config.token_requests_per_s, config.token_requests_burst = 0.01, 3
    config.token_failures_per_s, config.token_failures_burst = 0.01, 2
    base, _ = auth({"admin": ADMIN, "etl": ("etl-secret", [("*", ["read"])])})   # one token each, from 127.0.0.1
    url = f"{base}/v1/oauth/tokens"
    right = {"grant_type": "client_credentials", "client_id": "etl", "client_secret": "etl-secret"}
    # etl's right secret spends its tokens: 2 left
    assert [httpx.post(url, data=right).status_code for _ in range(2)] == [200, 200]
    r = httpx.post(url, data=right)
    assert r.status_code == 429 and r.json()["error"] == "temporarily_unavailable", r.text
    assert int(r.headers["Retry-After"]) >= 1
    # another client is not held back by etl's requests; wrong secrets from its address run out of checks
    admin = {"grant_type": "client_credentials", "client_id": "admin", "client_secret": "admin-secret"}
    assert httpx.post(url, data=admin).status_code == 200
    guesses = [httpx.post(url, data={**admin, "client_secret": f"g{i}"}).status_code for i in range(3)]
    assert guesses == [401, 401, 429], guesses
    # the console's sign-in checks the same secrets, under the same limits (asked before the Retry-After etl was
    # given, its refusal is held, for at most 10 s)
    r = httpx.post(f"{base}/ui/login", data={"client_id": "etl", "client_secret": "etl-secret"},
                   headers={"Origin": base}, timeout=30)
    assert r.status_code == 200 and "too many" in r.text


def test_secret_checks_wait_in_a_bounded_queue(auth, config):
    config.token_requests_per_s, config.token_requests_burst, config.token_requests_queued = 1000, 1000, 1
    base, _ = auth({"admin": ADMIN})
    statuses: list[int] = []
    start = threading.Barrier(16)

    def guess(i: int) -> None:
        start.wait()
        r = httpx.post(f"{base}/v1/oauth/tokens", timeout=60, data={
            "grant_type": "client_credentials", "client_id": f"nobody-{i}", "client_secret": "x"})
        statuses.append(r.status_code)
        if r.status_code == 503:
            assert r.headers["Retry-After"] and r.json()["error"] == "temporarily_unavailable"
    threads = [threading.Thread(target=guess, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(statuses) == 16 and set(statuses) <= {401, 503} and 503 in statuses, statuses


def test_a_delta_listing_shows_a_table_it_may_not_read_by_name_only(auth):
    base, tokens = auth({"admin": ADMIN,
                         "writer": ("writer-secret", [{"table": "delta/main/s/t", "privileges": ["write"]}])})
    admin = uc_as(base, tokens["admin"])
    full = admin.create_managed("t", "main", "s")
    admin.create_managed("other", "main", "s")
    writer = httpx.Client(base_url=base + PREFIX, headers=bearer(tokens["writer"]), timeout=30)
    listed = writer.get("/tables", params={"catalog_name": "main", "schema_name": "s"})
    assert listed.status_code == 200, listed.text
    assert listed.json()["tables"] == [{"name": "t", "catalog_name": "main", "schema_name": "s",
                                        "table_type": "MANAGED", "table_id": full["table_id"]}]
    assert writer.get("/tables/main.s.t").status_code == 403
    assert admin.get("/tables", params={"catalog_name": "main", "schema_name": "s"}).json()["tables"][1]["columns"]


def test_the_console_shows_a_client_only_the_warehouses_it_uses(auth, tmp_path):
    base, tokens = auth({"admin": ADMIN, "analyst": ("analyst-secret", [("iceberg//db", ["read"])])})
    create_warehouse(base, tokens["admin"], "lake", tmp_path / "secret-lake")
    console = httpx.Client(base_url=base, timeout=30)
    assert console.post("/ui/login", data={"client_id": "analyst", "client_secret": "analyst-secret"},
                        headers={"Origin": base}).status_code == 302
    page = console.get("/ui/").text
    assert "secret-lake" not in page and ">lake<" not in page
    assert ">default<" in page   # its grant is in the default warehouse's Iceberg catalog
    admin = httpx.Client(base_url=base, timeout=30)
    assert admin.post("/ui/login", data={"client_id": "admin", "client_secret": "admin-secret"},
                      headers={"Origin": base}).status_code == 302
    assert "secret-lake" in admin.get("/ui/").text


# -- item 8: an unforeseen failure while writing a commit is an unknown outcome --------------------------------------------


def test_every_storage_error_has_a_meaning_given_on_purpose():
    from coordinator.errors import STORAGE_MEANINGS
    classes = {c for c in vars(storage.errors).values()
               if isinstance(c, type) and issubclass(c, storage.errors.StorageError)}
    assert classes == set(STORAGE_MEANINGS), classes ^ set(STORAGE_MEANINGS)


def test_a_commit_that_failed_unexpectedly_after_the_store_applied_it_is_unknown(service, monkeypatch):
    from storage.postgres import PostgresStore
    http = httpx.Client(base_url=service, timeout=30)
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    write = PostgresStore.write

    async def applied_then_failed(self, group):
        await write(self, group)
        raise RuntimeError("the answer could not be read")   # a fault nobody foresaw, after the store applied it
    monkeypatch.setattr(PostgresStore, "write", applied_then_failed)
    r = http.post("/v1/namespaces/db/tables/t", json={"requirements": [], "updates": [
        {"action": "set-properties", "updates": {"k": "v"}}]})
    monkeypatch.setattr(PostgresStore, "write", write)
    assert r.status_code == 500 and r.json()["error"]["type"] == "CommitStateUnknownException", r.text
    assert "Retry-After" not in r.headers
    assert http.get("/v1/namespaces/db/tables/t").json()["metadata"]["properties"]["k"] == "v"   # it had applied
