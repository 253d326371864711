"""What an operator sees: the service's JSON log lines and its Prometheus metrics, read from a served process."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import jwt
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import ServerProcess, fetch_token, write_auth_file

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "x", "type": "long", "required": False}]}
CLIENTS = {
    "writer": ("writer-secret", [("*", ["admin"])]),
}
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def request_lines(log_path: Path) -> list[dict]:
    out = []
    for line in log_path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("msg") == "request":
            out.append(record)
    return out


def line_for(log_path: Path, request_id: str, timeout_s: float = 30) -> dict:
    """The log line of the request with this X-Request-Id (a line is written as its answer leaves)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [r for r in request_lines(log_path) if r.get("request_id") == request_id]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no log line for request {request_id} in {log_path}")


@pytest.fixture
def served(database_url, tmp_path):
    """`coordinator serve` at log level info with authentication on; yields (server, admin token)."""
    auth = write_auth_file(tmp_path / "auth.toml", CLIENTS)
    server = ServerProcess(database_url, tmp_path / "srv", log_level="info",
                           extra_env={"COORDINATOR_AUTH_FILE": str(auth)})
    with server:
        yield server, fetch_token(server.base_url, "writer", "writer-secret")


def test_log_lines_say_what_was_committed_refused_and_by_whom(served):
    server, token = served
    base = server.base_url
    with httpx.Client(base_url=base, timeout=30, headers=bearer(token)) as http:
        assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
        created = http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA})
        assert created.status_code == 200
        uuid = created.json()["metadata"]["table-uuid"]
        commit = http.post("/v1/namespaces/db/tables/t", headers={"X-Request-Id": "commit-1"}, json={
            "requirements": [{"type": "assert-table-uuid", "uuid": uuid}],
            "updates": [{"action": "set-properties", "updates": {"k": "v"}}]})
        assert commit.status_code == 200
        conflict = http.post("/v1/namespaces/db/tables/t", headers={"X-Request-Id": "conflict-1"}, json={
            "requirements": [{"type": "assert-current-schema-id", "current-schema-id": 7}],
            "updates": [{"action": "set-properties", "updates": {"k": "w"}}]})
        assert conflict.status_code == 409
    # a token this service never issued, claiming to be `mallory`
    forged = jwt.encode({"sub": "mallory", "iss": "x", "exp": int(time.time()) + 60}, "not-the-key" * 4)
    assert httpx.get(f"{base}/v1/namespaces", headers={**bearer(forged), "X-Request-Id": "forged-1"},
                     timeout=30).status_code == 401
    assert httpx.get(f"{base}/v1/namespaces", headers={"X-Request-Id": "anon-1"}, timeout=30).status_code == 401
    assert httpx.get(f"{base}/healthz", headers={"X-Request-Id": "probe-1"}, timeout=30).status_code == 200

    line = line_for(server.log_path, "commit-1")
    assert ISO_UTC.match(line["ts"]), line
    assert line["level"] == "info" and line["status"] == 200
    assert line["client_id"] == "writer"
    assert line["format"] == "iceberg" and line["table"] == "db.t" and isinstance(line["version"], int)
    assert "error" not in line

    line = line_for(server.log_path, "conflict-1")
    assert line["status"] == 409 and line["error_type"] == "CommitFailedException"
    assert "schema" in line["error"].lower(), line
    assert line["client_id"] == "writer" and "table" not in line

    line = line_for(server.log_path, "forged-1")
    assert line["status"] == 401 and line["error_type"] == "NotAuthorizedException"
    assert line["client_id"] == "mallory" and line["error"]
    line = line_for(server.log_path, "anon-1")
    assert line["status"] == 401 and "client_id" not in line and "Bearer" in line["error"]
    # a probe is logged at debug: not at all at level info
    time.sleep(0.5)
    assert not [r for r in request_lines(server.log_path) if r.get("request_id") == "probe-1"]


def exported(base_url: str) -> dict[str, object]:
    """The service's /metrics, parsed by prometheus_client's own parser: {family name: family}."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families: dict, name: str, **labels) -> float:
    for s in (s for f in families.values() for s in f.samples):
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {name}{labels}")


def test_metrics_follow_prometheus_conventions_and_count_commits_by_outcome(service):
    with httpx.Client(base_url=service, timeout=30) as http:
        assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
        uuid = http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).json()["metadata"][
            "table-uuid"]
        for i in range(3):
            assert http.post("/v1/namespaces/db/tables/t", json={
                "requirements": [{"type": "assert-table-uuid", "uuid": uuid}],
                "updates": [{"action": "set-properties", "updates": {"k": str(i)}}]}).status_code == 200
        assert http.post("/v1/namespaces/db/tables/t", json={
            "requirements": [{"type": "assert-current-schema-id", "current-schema-id": 7}],
            "updates": []}).status_code == 409
        assert http.post("/v1/namespaces/db/tables/t", json={
            "requirements": [], "updates": [{"action": "upgrade-format-version", "format-version": 1}]}
        ).status_code == 400
    families = exported(service)

    assert sample(families, "coordinator_commits_total", format="iceberg", outcome="applied") == 3
    assert sample(families, "coordinator_commits_total", format="iceberg", outcome="conflict") == 1
    assert sample(families, "coordinator_commits_total", format="iceberg", outcome="rejected") == 1
    for fmt in ("delta", "lance"):  # every series exists before its first commit
        for outcome in ("applied", "conflict", "rejected", "unknown"):
            assert sample(families, "coordinator_commits_total", format=fmt, outcome=outcome) == 0
    assert families["coordinator_commits"].type == "counter"
    assert sample(families, "coordinator_commit_seconds_count", format="iceberg") == 5
    assert sample(families, "coordinator_db_write_seconds_count") >= 4   # the create and three commits
    assert sample(families, "coordinator_file_write_seconds_count") >= 4
    assert families["coordinator_mailbox_depth"].type == "gauge"

    for name, family in families.items():
        assert name.startswith("coordinator_"), name
        # `_total` only on counters (the parser drops it from a counter's family name)
        names = {s.name for s in family.samples}
        if family.type == "counter":
            assert all(n.endswith(("_total", "_created")) for n in names), (name, names)
        else:
            assert not name.endswith("_total"), f"{name} is a {family.type} named like a counter"
        if family.type == "histogram":
            assert name.endswith(("_seconds", "_commits")), f"histogram {name} names no unit"
        # HELP explains: not the name again in words
        assert family.documentation and family.documentation.lower() != name.replace("_", " "), name
        assert len(family.documentation.split()) >= 5, (name, family.documentation)


DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana-dashboard.json"


def test_grafana_dashboard_queries_only_exported_metrics(service):
    """Each panel's PromQL names metrics this service exports (a renamed metric would leave a panel empty)."""
    families = exported(service)
    series = {s.name for f in families.values() for s in f.samples}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 6
    named = set()
    for expr in exprs:
        for word in re.findall(r"\b(coordinator_[a-z_]+)\b", expr):
            named.add(word)
            assert word in series, f"dashboard query {expr!r} names {word}, which /metrics does not export"
    for wanted in ("coordinator_commits_total", "coordinator_commit_seconds_bucket",
                   "coordinator_db_write_seconds_bucket", "coordinator_file_write_seconds_bucket",
                   "coordinator_mailbox_depth"):
        assert wanted in named, f"the dashboard has no panel on {wanted}"


def test_a_browser_at_the_root_is_sent_to_the_console_and_api_clients_get_json_404(service):
    browser_accept = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
    for accept in (browser_accept, "text/html"):
        r = httpx.get(f"{service}/", headers={"Accept": accept}, follow_redirects=False)
        assert r.status_code == 302 and r.headers["Location"] == "/ui/", (accept, r.status_code, r.headers)
    assert httpx.get(f"{service}/", headers={"Accept": "text/html"}, follow_redirects=True).url.path == "/ui/"
    unknown = httpx.get(f"{service}/no-such-path").json()
    with httpx.Client() as client:
        del client.headers["Accept"]   # httpx's default */*: sent below, and left out once
        for accept in ("*/*", "application/json", None):
            r = client.get(f"{service}/", headers={"Accept": accept} if accept else None)
            assert r.status_code == 404 and r.headers["Content-Type"] == "application/json", (accept, r.text)
            assert r.json()["error"]["code"] == 404 and r.json().keys() == unknown.keys(), r.text
