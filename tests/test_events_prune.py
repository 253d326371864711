"""Feed retention (storage/events.py `EventLog.prune`) orders events by their transaction ids as numbers: with
events on both sides of a power of ten (xid 999 and 1000, say), a young event must keep every event after it,
whatever the ids' decimal digits. (Ordered as text, "1000" sorts before "999": retention took the younger events
of smaller ids for old ones and deleted them, which the chaos test's feed check found.)"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from storage.events import EventLog


def test_prune_orders_transaction_ids_as_numbers(database_url):
    async def go() -> tuple[int, list[int]]:
        con = await asyncpg.connect(database_url)
        try:
            async def event() -> None:
                await con.execute("INSERT INTO events (seq, id, table_id, type, subject, catalog, data) "
                                  "VALUES (1, $1, $2, 'iceberg.table.committed', 'db.t', '', '{}')",
                                  uuid.uuid4(), uuid.uuid4())
            await event()
            first = int(await con.fetchval("SELECT max(xid)::text FROM events"))
            digits = len(str(first))
            # transactions until the ids gain a digit, then one more event there
            while int(await con.fetchval("SELECT pg_current_xact_id()::text")) < 10 ** digits:
                pass
            await event()
            deleted = await EventLog._prune_batch(con, 3600, 1_000_000)   # nothing is old, nothing in excess
            left = [int(x) for x in await con.fetchval("SELECT array_agg(xid::text ORDER BY xid) FROM events")]
            return deleted, left
        finally:
            await con.close()
    deleted, left = asyncio.run(go())
    assert deleted == 0 and len(left) == 2, (deleted, left)
