"""The web console at /ui/ in a real browser: headless Chromium driven by selenium against a live service
holding tables of all three formats. Screenshots go under pytest's tmp path, and also to $CONSOLE_SCREENSHOT_DIR
if set."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import httpx
import lance
import lance_namespace
import pyarrow as pa
import pytest
from lance_namespace import CreateNamespaceRequest

from api.server import EmbeddedService
from tests.delta.conftest import UC
from tests.support import fetch_token, write_auth_file

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver: apt-get install -y chromium chromium-driver")

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "x", "type": "long", "required": False}]}
WAIT_S = 30


@pytest.fixture
def browser():
    from selenium import webdriver
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.implicitly_wait(WAIT_S)
    yield driver
    driver.quit()


def screenshot(driver, tmp_path: Path, name: str) -> None:
    driver.save_screenshot(str(tmp_path / f"{name}.png"))
    extra = os.environ.get("CONSOLE_SCREENSHOT_DIR")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(extra) / f"{name}.png"))


def iceberg_table(base_url: str, namespace: str, name: str, commits: int, headers: dict | None = None) -> None:
    with httpx.Client(base_url=base_url, timeout=30, headers=headers or {}) as http:
        if http.get(f"/v1/namespaces/{namespace}").status_code == 404:
            assert http.post("/v1/namespaces", json={"namespace": [namespace]}).status_code == 200
        created = http.post(f"/v1/namespaces/{namespace}/tables", json={"name": name, "schema": SCHEMA})
        assert created.status_code == 200, created.text
        uuid = created.json()["metadata"]["table-uuid"]
        for i in range(commits):
            r = http.post(f"/v1/namespaces/{namespace}/tables/{name}", json={
                "requirements": [{"type": "assert-table-uuid", "uuid": uuid}],
                "updates": [{"action": "set-properties", "updates": {"step": str(i)}}]})
            assert r.status_code == 200, r.text
        # a conflict, for the live panel
        assert http.post(f"/v1/namespaces/{namespace}/tables/{name}", json={
            "requirements": [{"type": "assert-current-schema-id", "current-schema-id": 9}], "updates": []}
        ).status_code == 409


def rebased_appends(base_url: str, namespace: str, name: str) -> None:
    """Three appends to a table with rebasing on, the last two from the same snapshot: one of them is rebased."""
    from tests import iceberg_appends
    with httpx.Client(base_url=base_url, timeout=30) as http:
        created = http.post(f"/v1/namespaces/{namespace}/tables", json={
            "name": name, "schema": SCHEMA, "properties": {"commit.rebase-appends.enabled": "true"}})
        assert created.status_code == 200, created.text
        first = http.post(f"/v1/namespaces/{namespace}/tables/{name}",
                          json=iceberg_appends.append(created.json()["metadata"]))
        base = first.json()["metadata"]
        for _ in range(2):
            r = http.post(f"/v1/namespaces/{namespace}/tables/{name}", json=iceberg_appends.append(base))
            assert r.status_code == 200, r.text


def test_console_shows_every_format_and_a_tables_history(service, browser, tmp_path):
    from selenium.webdriver.common.by import By
    iceberg_table(service, "db", "events", commits=25)
    rebased_appends(service, "db", "clicks")
    uc = UC(service)
    delta = uc.create_managed("orders")
    assert uc.commit(delta, 1).status_code == 200
    refused = uc.commit(delta, 1)   # version 1 again, another commit file: a conflict
    assert refused.status_code == 409, refused.text
    ns = lance_namespace.connect("rest", {"uri": service})
    ns.create_namespace(CreateNamespaceRequest(id=["vec"]))
    lance.write_dataset(pa.table({"a": [1, 2]}), namespace_client=ns, table_id=["vec", "embeddings"], mode="create")
    lance.write_dataset(pa.table({"a": [3]}), namespace_client=ns, table_id=["vec", "embeddings"], mode="append")

    browser.get(f"{service}/")   # the service's address alone leads to the console
    assert browser.current_url == f"{service}/ui/"
    warehouses = browser.find_element(By.ID, "warehouses").text
    assert "default" in warehouses and "warehouse" in warehouses
    tree = browser.find_element(By.ID, "tables").text
    for word in ("iceberg", "delta", "lance", "events", "orders", "embeddings", "main", "vec"):
        assert word in tree, (word, tree)
    # the live panel fills from the service's counters
    deadline = time.monotonic() + WAIT_S
    while "28" not in browser.find_element(By.ID, "live-iceberg").text and time.monotonic() < deadline:
        time.sleep(0.2)
    live = browser.find_element(By.ID, "live-iceberg").text.split()
    assert live[0] == "iceberg" and live[4:6] == ["28", "1"], live   # applied, conflicts
    assert live[-1] == "1", live   # rebased
    assert browser.find_element(By.ID, "live-delta").text.split()[4:6] == ["1", "1"]
    assert browser.find_element(By.ID, "live-lance").text.split()[4:6] == ["2", "0"]
    screenshot(browser, tmp_path, "console-home")

    browser.find_element(By.CSS_SELECTOR, 'a.table-link[data-name="db.events"]').click()
    assert browser.find_element(By.ID, "table-name").text == "db.events"
    assert browser.find_element(By.ID, "table-format").text == "iceberg"
    assert "/db/events" in browser.find_element(By.ID, "table-location").text
    current = int(browser.find_element(By.ID, "current-version").text)
    versions = [int(e.text) for e in browser.find_elements(By.CSS_SELECTOR, "#commits tr.commit td.version")]
    assert len(versions) == 20 and versions[0] == current and versions == sorted(versions, reverse=True)
    history = browser.find_element(By.ID, "commits").text
    assert "metadata-location" in history and time.strftime("%Y-%m-%dT", time.gmtime()) in history
    screenshot(browser, tmp_path, "console-iceberg-table")
    browser.find_element(By.ID, "older").click()   # the next page: the rest of the 26 entries
    older = [int(e.text) for e in browser.find_elements(By.CSS_SELECTOR, "#commits tr.commit td.version")]
    assert len(older) == 6 and older[0] == versions[-1] - 1

    browser.get(f"{service}/ui/")
    browser.find_element(By.CSS_SELECTOR, 'a.table-link[data-name="vec.embeddings"]').click()
    assert browser.find_element(By.ID, "table-format").text == "lance"
    assert browser.find_element(By.ID, "current-version").text == "2"
    assert time.strftime("%Y-%m-%dT", time.gmtime()) in browser.find_element(By.ID, "commits").text
    screenshot(browser, tmp_path, "console-lance-table")
    browser.get(f"{service}/ui/")
    browser.find_element(By.CSS_SELECTOR, 'a.table-link[data-name="main.default.orders"]').click()
    assert browser.find_element(By.ID, "table-format").text == "delta"
    assert delta["storage_location"].rstrip("/").rsplit("/", 1)[-1] in browser.find_element(By.ID, "table-location").text
    assert browser.find_element(By.ID, "current-version").text == "1"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#commits tr.commit")) == 2
    screenshot(browser, tmp_path, "console-delta-table")


def test_console_with_authentication_asks_for_a_token_and_shows_only_granted_tables(config, browser, tmp_path):
    from selenium.webdriver.common.by import By
    config.auth_file = write_auth_file(tmp_path / "auth.toml", {
        "admin": ("admin-secret", [("*", ["admin"])]),
        "analyst": ("analyst-secret", [("iceberg//db", ["read"])])})
    with EmbeddedService(config) as base_url:
        admin = {"Authorization": f"Bearer {fetch_token(base_url, 'admin', 'admin-secret')}"}
        iceberg_table(base_url, "db", "shared", commits=1, headers=admin)
        iceberg_table(base_url, "hr", "salaries", commits=1, headers=admin)

        browser.get(f"{base_url}/ui/")
        assert browser.current_url.endswith("/ui/login")
        browser.find_element(By.ID, "client_id").send_keys("analyst")
        browser.find_element(By.ID, "client_secret").send_keys("wrong")
        browser.find_element(By.ID, "sign-in").click()
        assert browser.find_element(By.ID, "login-error").text and browser.current_url.endswith("/ui/login")
        screenshot(browser, tmp_path, "console-login-refused")
        browser.find_element(By.ID, "client_id").send_keys("analyst")
        browser.find_element(By.ID, "client_secret").send_keys("analyst-secret")
        browser.find_element(By.ID, "sign-in").click()
        assert browser.find_element(By.ID, "who").text == "analyst"
        tree = browser.find_element(By.ID, "tables").text
        assert "shared" in tree and "salaries" not in tree and "hr" not in tree
        screenshot(browser, tmp_path, "console-limited-client")
        # a table the client may not read is not there, even by its id (as an admin's console links it)
        with httpx.Client(base_url=base_url, timeout=30) as as_admin:
            as_admin.post("/ui/login", data={"client_id": "admin", "client_secret": "admin-secret"},
                          headers={"Origin": base_url})   # the form is taken from the console's own origin only
            page = as_admin.get("/ui/").text
        link = re.search(r'href="(/ui/tables/[0-9a-f-]+)" data-name="hr.salaries"', page)
        assert link, page
        browser.get(base_url + link.group(1))
        assert "No such table" in browser.page_source
        assert httpx.get(base_url + link.group(1), timeout=30, follow_redirects=False).status_code == 302


def test_an_iceberg_commits_history_names_its_snapshots_operation(service):
    """What a commit did, in the history: the operation of the snapshot it made current (append, overwrite...)."""
    iceberg_table(service, "ops", "t", commits=0)
    with httpx.Client(base_url=service, timeout=30) as http:
        location = http.get("/v1/namespaces/ops/tables/t").json()["metadata-location"]
        r = http.post("/v1/namespaces/ops/tables/t", json={"requirements": [], "updates": [
            {"action": "add-snapshot", "snapshot": {
                "snapshot-id": 7, "sequence-number": 1, "timestamp-ms": int(time.time() * 1000),
                "manifest-list": location.rsplit("/", 1)[0] + "/snap-7.avro", "summary": {"operation": "append"},
                "schema-id": 0}},
            {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": 7}]})
        assert r.status_code == 200, r.text
        home = http.get("/ui/").text
        table_id = re.search(r'href="/ui/tables/([0-9a-f-]+)" data-name="ops.t"', home).group(1)
        page = http.get(f"/ui/tables/{table_id}").text
    assert "operation=append" in page
