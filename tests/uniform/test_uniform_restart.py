"""After a restart the service catches up with the Delta commits it did not convert (here: converted by nobody
while conversion was off), without waiting for a new commit; and a killed worker process is replaced."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from tests.delta.conftest import UC
from tests.support import ServerProcess

from .conftest import iceberg_catalog, wait_converted
from .support import ManagedDelta

pytestmark = pytest.mark.crash


def _rows(table) -> list[dict]:
    return sorted(table.scan().to_arrow().to_pylist(), key=lambda r: json.dumps(r, sort_keys=True, default=str))


def batch(ids: range) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "name": [f"n{i}" for i in ids]})


def test_a_restart_converts_what_was_committed_meanwhile(database_url, tmp_path):
    server = ServerProcess(database_url, tmp_path / "service")
    server.extra_env = {"COORDINATOR_UNIFORM_WORKERS": "1"}
    server.start()
    try:
        uc = UC(server.base_url)
        md = ManagedDelta(uc, "events", tmp_path).create(batch(range(3)))
        version = md.append(batch(range(3, 5)))
        wait_converted(iceberg_catalog(server.base_url), "default.events", version)
        server.kill()
        server.extra_env = {"COORDINATOR_UNIFORM_WORKERS": "0"}   # commits go on, nobody converts them
        server.start()
        for i in range(3):
            version = md.append(batch(range(10 * i + 10, 10 * i + 12)))
        md.optimize()
        version = md.version
        assert iceberg_catalog(server.base_url).load_table("default.events").properties["delta-version"] == "1"
        server.kill()
        server.extra_env = {"COORDINATOR_UNIFORM_WORKERS": "1"}
        server.start()
        table = wait_converted(iceberg_catalog(server.base_url), "default.events", version)
        assert _rows(table) == md.rows(version)
        uc.http.close()
    finally:
        server.stop()
