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
