"""Crash safety for Delta commits: SIGKILL the server while writers commit, restart it, and check that every
acknowledged commit is still ratified (served by GET commits, or published and in the commit log) and that no
version and no staged file was ratified twice."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest

from tests.support import ServerProcess

from .conftest import PREFIX, UC, commit_log

pytestmark = pytest.mark.crash


def _writer(base: str, table: dict, acked: dict, lock: threading.Lock, stop: threading.Event,
            statuses: list) -> None:
    q = {"table_id": table["table_id"], "table_uri": table["storage_location"]}
    with httpx.Client(base_url=base + PREFIX, timeout=10) as http:
        while not stop.is_set():
            try:
                latest = http.get("/delta/commits", params=q).json()["latest_table_version"]
                v = latest + 1
                name = f"{v:020d}.{uuid.uuid4()}.json"
                now = int(time.time() * 1000)
                # Report the previous version as published with each commit, as Delta's client does.
                r = http.post("/delta/commit", json={**q, "latest_published_version": latest, "commit_info": {
                    "version": v, "timestamp": now, "file_name": name, "file_size": 10,
                    "file_modification_timestamp": now}})
            except (httpx.HTTPError, ValueError, KeyError):
                time.sleep(0.05)  # server down (or answered while dying): no answer is no acknowledgement
                continue
            statuses.append(r.status_code)
            if r.status_code == 200:
                with lock:
                    acked[v] = name


def test_sigkill_under_commit_load_loses_no_acknowledged_commit(database_url, tmp_path):
    server = ServerProcess(database_url, tmp_path / "srv")
    base = server.start()
    try:
        uc = UC(base)
        table = uc.create_managed("t")
        acked: dict[int, str] = {}
        lock, stop, statuses = threading.Lock(), threading.Event(), []
        threads = [threading.Thread(target=_writer, args=(base, table, acked, lock, stop, statuses))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for _ in range(2):
            time.sleep(1.0)
            before = len(acked)
            server.kill()
            assert before > 0, "no commit was acknowledged before the crash"
            time.sleep(0.3)
            server.start()
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        uc.http.close()
        uc = UC(base)

        body = uc.commits(table)
        assert len(acked) >= 20
        latest, served = body["latest_table_version"], {c["version"]: c["file_name"] for c in body["commits"]}
        rows = commit_log(database_url, table["table_id"])
        assert max(acked) <= latest == max(rows)
        assert sorted(rows) == list(range(0, latest + 1))          # each version once, none missing
        names = [n for v, n in rows.items() if v > 0]
        assert len(names) == len(set(names))                       # no staged file ratified twice
        for v, name in acked.items():
            assert rows[v] == name, v                              # acknowledged means ratified as that file
            if v in served:
                assert served[v] == name
        assert list(served) == list(range(min(served, default=latest + 1), latest + 1))
        assert all(s in (200, 409, 429, 503) for s in statuses), sorted(set(statuses))
        assert uc.commit(table, latest + 1, published=latest).status_code == 200
        uc.http.close()
    finally:
        stop.set()
        server.stop()

