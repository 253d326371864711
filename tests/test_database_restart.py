"""PostgreSQL stopped under commit load and started again: retryable answers while it is down, recovery by
itself afterwards, and no acknowledged commit lost."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.support import ServerProcess, throwaway_cluster

pytestmark = pytest.mark.crash

OUTAGE_S = 10  # the figure: PostgreSQL stopped for 10 s under load

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


@pytest.fixture
def own_postgres():
    with throwaway_cluster() as pg:
        yield pg


def test_database_restart_under_load(own_postgres, tmp_path):
    server = ServerProcess(own_postgres.dsn, tmp_path / "srv")
    base = server.start()
    acked: list[str] = []
    statuses: dict[int, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def writer(w: int) -> None:
        n = 0
        with httpx.Client(base_url=base, timeout=30) as http:
            while not stop.is_set():
                key = f"w{w}-{n}"
                r = http.post("/v1/namespaces/db/tables/t", json={"requirements": [], "updates": [
                    {"action": "set-properties", "updates": {key: "1"}}]})
                with lock:
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if r.status_code == 200:
                    acked.append(key)
                    n += 1
                else:
                    if r.status_code == 503:
                        assert r.headers.get("Retry-After"), "503 without Retry-After"
                    assert r.status_code in (500, 503), r.text
                    time.sleep(0.1)
    try:
        with httpx.Client(base_url=base) as http:
            assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
            assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.5)
        before_outage = len(acked)
        own_postgres.stop("fast")
        time.sleep(OUTAGE_S)
        during = len(acked)
        own_postgres.start()
        time.sleep(4)
        stop.set()
        for t in threads:
            t.join()
        assert before_outage > 0
        assert len(acked) > during, "the service did not recover by itself after the database came back"
        assert statuses.get(503, 0) > 0, statuses
        with httpx.Client(base_url=base) as http:
            props = http.get("/v1/namespaces/db/tables/t").json()["metadata"]["properties"]
        lost = [k for k in acked if k not in props]
        print(f"database down {OUTAGE_S} s under 4 writers: {len(acked)} commits acknowledged, answers {statuses}, "
              f"lost {len(lost)}")
        assert not lost, f"{len(lost)} acknowledged commits lost: {lost[:5]}"
    finally:
        stop.set()
        server.stop()
