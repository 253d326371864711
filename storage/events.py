"""The commit feed's outbox, read back: pages of events in feed order, retention, and cross-member wake-ups.

The group-commit writer inserts each event in the transaction of the commit it reports (storage/writer.py), keyed
by (xid, seq): the transaction's id and the event's place in it. Transaction ids are taken when a transaction
first writes, not when it commits, so a reader that handed out everything up to some xid could later find a
smaller one committed after it. So a page holds only events below the reading snapshot's `xmin`: every
transaction with a smaller id has ended, none can add a row there any more, and the part of the feed below
`xmin` never changes again except by retention. A position (xid, seq) then resumes exactly: nothing before it
can still appear, nothing after it was handed out. A table's commits are sequential (the next is written only once
the previous one is durable), so its events are in version order. The price: an event waits until every
transaction older than its own has ended, which is milliseconds for the service's own ones, but as long as
any writing transaction open on the same PostgreSQL server (say an operator's forgotten `BEGIN`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, TypeVar

import asyncpg

from .connections import APPLICATION_NAME, CONNECTION_ERRORS, why
from .records import EVERYTHING, EventPage, FeedScope, Position, StoredEvent
from .writer import EVENTS_CHANNEL

log = logging.getLogger(__name__)
T = TypeVar("T")

PRUNE_BATCH = 10_000         # events deleted per transaction by retention
LISTEN_CHECK_S = 10.0        # how often an idle listening connection is checked


# A page: the reading snapshot's horizon (xmin) and xmax, retention's floor, and the events after the position
# that the reader's scope (FeedScope) lets through, applied here so that no event it may not see is even read:
# everything (one walk of the primary key from the position), the tables named (each one range of the
# `events_securable` index, in feed order), and the containers named (each one range of keys, sorted).
_AFTER = """(e.xid, e.seq) > (s.at_xid, s.at_seq) AND e.xid < s.xmin
      AND ($3::text[] IS NULL OR split_part(e.type, '.', 1) = ANY($3::text[]))
      AND ($4::text[] IS NULL OR e.subject = ANY($4::text[]))"""
_READ_SQL = f"""
WITH f AS MATERIALIZED (
    SELECT pg_snapshot_xmin(c) AS xmin, pg_snapshot_xmax(c) AS xmax,
           (SELECT f.xid FROM events_floor f) AS floor_xid, (SELECT f.seq FROM events_floor f) AS floor_seq
    FROM pg_current_snapshot() c),
s AS MATERIALIZED (
    SELECT f.*, coalesce($1::text::xid8, f.floor_xid) AS at_xid,
           CASE WHEN $1::text IS NULL THEN f.floor_seq ELSE $2 END AS at_seq FROM f)
SELECT s.xmin::text AS horizon, s.xmax::text AS next_xid, s.floor_xid::text, s.floor_seq,
       coalesce((SELECT e.xid FROM events e ORDER BY e.xid DESC, e.seq DESC LIMIT 1) >= s.xmin, false) AS pending,
       p.xid::text AS xid, p.seq, p.id, p.type, p.subject, p.catalog, p.securable, p.data, p.time
FROM s LEFT JOIN LATERAL (
    (SELECT e.* FROM events e WHERE $6::bool AND {_AFTER} ORDER BY e.xid, e.seq LIMIT $5)
    UNION ALL
    (SELECT e.* FROM unnest($7::text[]) AS t(key) CROSS JOIN LATERAL (
        SELECT e.* FROM events e WHERE e.securable = t.key AND {_AFTER} ORDER BY e.xid, e.seq LIMIT $5) e)
    UNION ALL
    (SELECT e.* FROM unnest($8::text[], $9::text[]) AS r(low, high) CROSS JOIN LATERAL (
        SELECT e.* FROM events e WHERE e.securable >= r.low AND e.securable < r.high AND {_AFTER}
        ORDER BY e.xid, e.seq LIMIT $5) e)
    ORDER BY xid, seq LIMIT $5) p ON true
ORDER BY p.xid, p.seq
"""


def _range_end(prefix: str) -> str:
    """The first key after every key that starts with `prefix` (which ends in "/", the next byte being "0")."""
    return prefix[:-1] + "0"


Call = Callable[[Callable[[asyncpg.Connection], Awaitable[T]]], Awaitable[T]]   # runs it on the storage thread


class EventLog:
    """Reads and prunes the outbox through the feed's own connections, so that readers never wait for, or hold, a
    connection that commits need: `call` for readers' own reads and retention, `shared_call` for the one read
    that every waiting reader shares, which so never queues behind theirs."""

    def __init__(self, call: Call, shared_call: Call):
        self._call, self._shared_call = call, shared_call

    async def read(self, after: Position | None, limit: int, *, formats: list[str] | None = None,
                   subjects: list[str] | None = None, scope: FeedScope = EVERYTHING) -> EventPage:
        """Up to `limit` final events after `after` (None: from the oldest kept), in feed order, of those `scope`
        lets through, of the given formats (the type's first word) and subjects only, if given."""
        return await self._read(self._call, after, limit, formats, subjects, scope)

    async def read_shared(self, after: Position, limit: int) -> EventPage:
        """`read` of every event, for all the readers waiting at once (on a connection of its own)."""
        return await self._read(self._shared_call, after, limit, None, None, EVERYTHING)

    @staticmethod
    async def _read(call: Call, after: Position | None, limit: int, formats: list[str] | None,
                    subjects: list[str] | None, scope: FeedScope) -> EventPage:
        xid, seq = after if after is not None else (None, 0)
        rows = await call(lambda con: con.fetch(
            _READ_SQL, None if xid is None else str(xid), seq, formats, subjects, limit, scope.everything,
            list(scope.tables), list(scope.containers), [_range_end(c) for c in scope.containers]))
        first = rows[0]
        events = [StoredEvent((int(r["xid"]), r["seq"]), r["id"], r["type"], r["subject"], r["catalog"],
                              r["securable"], r["data"], r["time"]) for r in rows if r["xid"] is not None]
        return EventPage(events, int(first["horizon"]), int(first["next_xid"]),
                         (int(first["floor_xid"]), first["floor_seq"]), first["pending"])

    async def prune(self, max_age_s: float, max_count: int) -> int:
        """Delete the oldest events: those older than `max_age_s` up to the first younger one, and all but the
        newest `max_count`; only final ones (below every reader's horizon). Raises the floor past them. Returns
        how many were deleted. Several members may prune at once: the floor's row lock takes them in turn."""
        deleted = 0
        while True:
            count = await self._call(lambda con: self._prune_batch(con, max_age_s, max_count))
            deleted += count
            if count < PRUNE_BATCH:
                return deleted

    @staticmethod
    async def _prune_batch(con: asyncpg.Connection, max_age_s: float, max_count: int) -> int:
        async with con.transaction():
            await con.execute("SELECT 1 FROM events_floor FOR UPDATE")
            # Exclusive bounds: by age, the first young event (none: every event is old); by count, the one after
            # the newest of the excess (none: no excess). The greater one wins.
            # (Ordered by the columns, `e.xid`: a bare `xid` would be the output column, the text, and "10" < "9".)
            young = await con.fetchrow("SELECT e.xid::text, e.seq FROM events e WHERE e.time >= now() - "
                                       "make_interval(secs => $1) ORDER BY e.xid, e.seq LIMIT 1", float(max_age_s))
            excess = await con.fetchrow("SELECT e.xid::text, e.seq + 1 AS seq FROM events e"
                                        " ORDER BY e.xid DESC, e.seq DESC OFFSET $1 LIMIT 1", max_count)
            if young is not None:
                bounds = [(int(young["xid"]), young["seq"])]
                if excess is not None:
                    bounds.append((int(excess["xid"]), excess["seq"]))
                bound: Position | None = max(bounds)
            else:
                bound = None   # every event is older than max_age_s
            rows = await con.fetch(
                "DELETE FROM events WHERE (xid, seq) IN (SELECT xid, seq FROM events"
                " WHERE xid < pg_snapshot_xmin(pg_current_snapshot())"
                " AND ($1::text IS NULL OR (xid, seq) < ($1::text::xid8, $2))"
                " ORDER BY xid, seq LIMIT $3) RETURNING xid::text, seq",
                None if bound is None else str(bound[0]), 0 if bound is None else bound[1], PRUNE_BATCH)
            if rows:
                top = max((int(r["xid"]), r["seq"]) for r in rows)
                await con.execute("UPDATE events_floor SET xid = $1::text::xid8, seq = $2", str(top[0]), top[1])
            return len(rows)


async def listen(dsn: str, on_notify: Callable[[], None], connect_timeout_s: float, wanted: asyncio.Event) -> None:
    """Runs on the storage thread until cancelled: while `wanted` is set (readers wait on the feed here), LISTENs for
    other members' commits on one connection of its own and calls `on_notify` for each, and once whenever it
    starts listening or its connection is lost or restored (a notification may have been missed meanwhile). A
    reader's wait is bounded anyway (wait <= 60 s).

    Every transaction of a cluster sends a NOTIFY, and taking one costs the listening member ~90 us of CPU: with
    every member listening all the time, each commit would cost that once per member, readers or not. So a member
    listens only while a reader waits on it, and for LISTEN_CHECK_S to 2 x LISTEN_CHECK_S after the last one left
    (a reader that long-polls again at once finds it still listening)."""
    while True:
        await wanted.wait()
        con = None
        try:
            con = await asyncpg.connect(dsn, timeout=connect_timeout_s,
                                        server_settings={"application_name": APPLICATION_NAME})
            lost = asyncio.Event()
            con.add_termination_listener(lambda _con: lost.set())
            await con.add_listener(EVENTS_CHANNEL, lambda *_: on_notify())
            on_notify()
            unwanted = 0   # checks in a row that found no reader waiting
            while not lost.is_set() and unwanted < 2:
                try:
                    await asyncio.wait_for(lost.wait(), LISTEN_CHECK_S)
                except asyncio.TimeoutError:   # a silent network drops no connection: ask
                    await con.fetchval("SELECT 1", timeout=connect_timeout_s)
                unwanted = 0 if wanted.is_set() else unwanted + 1
            if not lost.is_set():
                continue   # no reader here for a while: stop listening until one comes (its connection closes)
        except (*CONNECTION_ERRORS, asyncpg.PostgresError, asyncpg.exceptions.InternalClientError) as exc:
            log.warning("feed listener: %s; reconnecting", why(exc))
        finally:
            if con is not None:
                con.terminate()
        on_notify()
        await asyncio.sleep(1.0)
