"""A database that stalls for longer than `db_timeout_s` (a row lock held elsewhere, a frozen server): the writer
gives up on its statement, but the statement is still queued in its server process and would commit once the
stall ends. Every answer must still match the final state: 200 means applied, a 503 ("nothing applied, retry")
means not applied, and only an answer saying the outcome is unknown may go either way."""

from __future__ import annotations

import asyncio
import threading
import time

import asyncpg
import httpx
import pytest

from api.server import EmbeddedService
from tests.support import sql

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
STALL_S = 3.0


@pytest.fixture
def impatient_service(config):
    config.db_timeout_s = 1.0   # the writer gives up on a statement after 1 s; the stall lasts 3
    with EmbeddedService(config) as base_url:
        yield base_url


def hold_row_lock(dsn: str, table_id, held: threading.Event) -> None:
    """Another session holds the table's row FOR UPDATE for STALL_S, as a slow transaction or a stuck server."""
    async def run():
        con = await asyncpg.connect(dsn)
        try:
            async with con.transaction():
                await con.execute("SELECT 1 FROM tables WHERE table_id = $1 FOR UPDATE", table_id)
                held.set()
                await asyncio.sleep(STALL_S)
        finally:
            await con.close()
    asyncio.run(run())


def row_versions(dsn: str) -> dict[str, int]:
    return {r["name"]: r["row_version"] for r in sql(dsn, "SELECT name, row_version FROM tables")}


def test_answers_after_a_stall_match_the_final_state(impatient_service, database_url):
    with httpx.Client(base_url=impatient_service, timeout=60) as http:
        assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
        for name in ("stalled", "bystander"):
            assert http.post("/v1/namespaces/db/tables", json={"name": name, "schema": SCHEMA}).status_code == 200
        stalled_id = sql(database_url, "SELECT table_id FROM tables WHERE name = 'stalled'")[0]["table_id"]
        before = row_versions(database_url)

        held = threading.Event()
        locker = threading.Thread(target=hold_row_lock, args=(database_url, stalled_id, held))
        locker.start()
        assert held.wait(10)
        answers: dict[str, httpx.Response] = {}

        def commit(name: str) -> None:
            with httpx.Client(base_url=impatient_service, timeout=60) as client:
                answers[name] = client.post(f"/v1/namespaces/db/tables/{name}", json={
                    "requirements": [], "updates": [{"action": "set-properties", "updates": {"k": name}}]})
        writers = [threading.Thread(target=commit, args=(name,)) for name in ("stalled", "bystander")]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        locker.join()
        time.sleep(0.5)   # had the abandoned statement survived, it would have committed by now

        assert answers["stalled"].status_code != 200, answers["stalled"].text   # it waited past the timeout
        after = row_versions(database_url)   # the database, not the service's memory of it
        for name, r in answers.items():
            if r.status_code == 200:
                assert after[name] == before[name] + 1, (name, r.text)
            elif r.status_code == 503:
                assert after[name] == before[name], (name, r.text)   # "nothing applied": it must not have applied
            else:
                assert r.json()["error"]["type"] == "CommitStateUnknownException", (name, r.text)
        # and the table serves commits again
        r = http.post("/v1/namespaces/db/tables/stalled", json={
            "requirements": [], "updates": [{"action": "set-properties", "updates": {"after": "1"}}]})
        assert r.status_code == 200, r.text
