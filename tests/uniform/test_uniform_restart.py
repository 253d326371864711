"""After a restart the service catches up with the Delta commits it did not convert (here: converted by nobody
while conversion was off), without waiting for a new commit; a killed worker process is replaced; and a version
whose conversion keeps ending the worker is refused."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from loadtest.attacks.uniform import conversion_workers
from tests.delta.conftest import UC
from tests.support import ServerProcess

from .conftest import iceberg_catalog, wait_converted
from .support import ManagedDelta, batch, iceberg_rows

pytestmark = pytest.mark.crash


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
        assert iceberg_rows(table) == md.rows(version)
        uc.http.close()
    finally:
        server.stop()


def test_a_killed_worker_is_replaced_and_none_outlives_the_service(database_url, tmp_path):
    server = ServerProcess(database_url, tmp_path / "service")
    server.start()
    try:
        uc = UC(server.base_url)
        md = ManagedDelta(uc, "events", tmp_path).create(batch(range(3)))
        catalog = iceberg_catalog(server.base_url)
        wait_converted(catalog, "default.events", md.append(batch(range(3, 5))))
        [worker] = conversion_workers(server.proc.pid)
        os.kill(worker, signal.SIGKILL)
        version = md.append(batch(range(5, 7)))
        assert iceberg_rows(wait_converted(catalog, "default.events", version)) == md.rows(version)
        [replacement] = conversion_workers(server.proc.pid)
        assert replacement != worker
        server.kill()   # a crash: the worker's stdin closes, and it ends
        for _ in range(100):
            if not Path(f"/proc/{replacement}").exists():
                break
            time.sleep(0.1)
        assert not Path(f"/proc/{replacement}").exists(), "a conversion worker outlived the service"
        uc.http.close()
    finally:
        server.stop()


def test_a_version_whose_conversion_ends_the_worker_three_times_is_refused(database_url, tmp_path):
    """A crash no exception handler sees (here SIGKILL, as the kernel's OOM killer sends it) while a version is
    converted: retried, and after the third in a row refused with the reason, not retried again."""
    import httpx

    from loadtest.attacks.uniform import ID_COLUMN, Writer, column

    server = ServerProcess(database_url, tmp_path / "service")
    server.extra_env = {"COORDINATOR_UNIFORM_WORKERS": "1"}
    server.start()
    try:
        http = httpx.Client(base_url=server.base_url, timeout=60)
        UC(server.base_url).setup_schema("main", "default")
        writer = Writer(http, "main", "default", "wide")
        writer.create([ID_COLUMN, *(column(i) for i in range(2, 20_000))])   # seconds to convert: time to kill it
        killed: set[int] = set()
        deadline = time.monotonic() + 90
        while len(killed) < 3 and time.monotonic() < deadline:
            for pid in set(conversion_workers(server.proc.pid)) - killed:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            time.sleep(0.05)
        assert len(killed) == 3
        path = "/api/2.1/unity-catalog/iceberg/v1/catalogs/main/namespaces/default/tables/wide"
        while time.monotonic() < deadline and (r := http.get(path)).status_code != 406:
            time.sleep(0.1)
        assert r.status_code == 406, r.text[:500]
        message = r.json()["error"]["message"]
        assert "Delta version 0 cannot be converted" in message and "ended the conversion worker 3 times" in message
        assert "signal 9" in message, message
        time.sleep(2)
        assert set(conversion_workers(server.proc.pid)) <= killed   # (none was started to retry it)
        http.close()
    finally:
        server.stop()
