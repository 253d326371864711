"""Crash safety: SIGKILL the server under commit load, restart it, and check every acknowledged commit."""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest

from tests.support import ServerProcess

pytestmark = pytest.mark.crash

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


def _commit_loop(base: str, table: str, writer: int, acked: list, stop: threading.Event) -> None:
    """Each commit sets a property unique to it; a 200 means it must survive any crash."""
    n = 0
    with httpx.Client(base_url=base, timeout=10) as http:
        while not stop.is_set():
            key = f"w{writer}-{n}"
            try:
                r = http.post(f"/v1/namespaces/db/tables/{table}",
                              json={"requirements": [], "updates": [
                                  {"action": "set-properties", "updates": {key: "1"}}]})
            except httpx.HTTPError:
                time.sleep(0.05)  # server down: retry the same key after restart
                continue
            if r.status_code == 200:
                acked.append((key, r.json()["metadata-location"]))
                n += 1
            elif r.status_code >= 500 and r.status_code != 503:
                time.sleep(0.05)  # state unknown: a later commit with the same key is harmless
            else:
                time.sleep(0.01)


def test_sigkill_under_load_loses_no_acknowledged_commit(database_url, tmp_path):
    server = ServerProcess(database_url, tmp_path / "srv")
    base = server.start()
    try:
        with httpx.Client(base_url=base) as http:
            assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
            for t in ("t0", "t1"):
                r = http.post("/v1/namespaces/db/tables", json={"name": t, "schema": SCHEMA, "properties": {
                    "write.metadata.previous-versions-max": "1000000"}})
                assert r.status_code == 200, r.text
        acked: list = []
        stop = threading.Event()
        threads = [threading.Thread(target=_commit_loop, args=(base, f"t{w % 2}", w, acked, stop)) for w in range(6)]
        for t in threads:
            t.start()
        rng = random.Random(7)
        for _ in range(2):
            time.sleep(rng.uniform(0.8, 2.0))
            before = len(acked)
            server.kill()
            time.sleep(0.3)
            server.start()
            assert before > 0, "no commit was acknowledged before the kill"
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join()

        with httpx.Client(base_url=base) as http:
            for table in ("t0", "t1"):
                meta = http.get(f"/v1/namespaces/db/tables/{table}").json()["metadata"]
                props = meta["properties"]
                mine = [k for k, loc in acked if int(k.split("-")[0][1:]) % 2 == int(table[1])]
                missing = [k for k in mine if k not in props]
                assert not missing, f"{len(missing)} acknowledged commits lost on {table}: {missing[:5]}"
                # Versions are contiguous: metadata-log holds every earlier file, numbered 0..n-1.
                versions = [int(e["metadata-file"].rsplit("/", 1)[1].split("-")[0]) for e in meta["metadata-log"]]
                assert versions == list(range(len(versions)))
        assert len(acked) > 20
    finally:
        server.stop()
