"""The group-commit storage writer, on the store's asyncio thread.

Group commit: every write group waiting when the writer becomes free goes to PostgreSQL in ONE statement (or,
when some groups insert/delete/rename rows, one transaction with a savepoint per such group). Each table's row
is a compare-and-set on (row_version, epoch) with `RETURNING`, so a stale group changes nothing instead of
failing everyone else's. `synchronous_commit` stays on: an answered commit is on disk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable
from uuid import UUID

import asyncpg

from . import faults
from .connections import APPLICATION_NAME, CONNECTION_ERRORS, sent_nothing, server_refused, why
from .errors import OutcomeLost, StoreUnavailable
from .paths import location_key
from .queries import LOCATIONS_LOCK, location_in_use, put_idempotency
from .records import UNFENCED, Refusal, TableWrite, WriteGroup, WriteResult, shard_of

log = logging.getLogger(__name__)


class NotApplied(Exception):
    """A write group's compare-and-set did not hold; `refusal` says which check failed."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.value)
        self.refusal = refusal


# Both write statements record the Idempotency-Keys of the rows they changed, in the same statement as the change.
_IDEMPOTENCY_CTE = """idem AS (
    INSERT INTO idempotency_keys (key, route, status, body, body_ref)
    SELECT k.key, k.route, k.status, k.body, k.body_ref
    FROM unnest($9::uuid[], $10::uuid[], $11::text[], $12::int[], $13::bytea[], $14::text[])
        AS k(table_id, key, route, status, body, body_ref)
    WHERE k.table_id IN (SELECT table_id FROM upd)
    ON CONFLICT (key) DO NOTHING
)"""


# The commit feed's outbox (migration 013): each applied row's events, in the same statement as the row.
_EVENTS_COLUMNS = "seq, table_id, id, type, subject, catalog, securable, data"


def _events_unnest(first: int) -> str:
    types = ("int", "uuid", "uuid", "text", "text", "text", "text", "jsonb")
    return f"unnest({', '.join(f'${first + i}::{t}[]' for i, t in enumerate(types))}) AS e({_EVENTS_COLUMNS})"


def _events_cte(first: int) -> str:
    return f"""ev AS (
    INSERT INTO events ({_EVENTS_COLUMNS}) SELECT e.* FROM {_events_unnest(first)}
    WHERE e.table_id IN (SELECT table_id FROM upd)
)"""


# Members sharing the database wake each other's waiting feed readers (LISTEN in storage/events.py). A NOTIFY is
# sent at commit, so only if the transaction commits; repeated in one transaction, it is sent once.
EVENTS_CHANNEL = "coordinator_events"
_NOTIFY = f"pg_notify('{EVENTS_CHANNEL}', '')"

_SIMPLE_WRITE_SQL = f"""
WITH u AS (
    SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::bigint[], $5::jsonb[])
        AS u(table_id, expected, epoch, new_version, state)
), upd AS (
    UPDATE tables t SET row_version = u.new_version, state = COALESCE(u.state, t.state), updated_at = now()
    FROM u WHERE t.table_id = u.table_id AND t.row_version = u.expected AND t.epoch = u.epoch
    RETURNING t.table_id
), log AS (
    INSERT INTO commits (table_id, version, payload)
    SELECT l.table_id, l.version, l.payload
    FROM unnest($6::uuid[], $7::bigint[], $8::jsonb[]) AS l(table_id, version, payload)
    WHERE l.table_id IN (SELECT table_id FROM upd)
), {_IDEMPOTENCY_CTE}, {_events_cte(15)}
SELECT table_id FROM upd
"""

# The same write when several members share the database (coordinator/cluster): each row's compare-and-set also
# requires its shard's lease to still carry the epoch the writing actor serves under. FOR SHARE makes the check
# hold until commit: a takeover (an UPDATE of the lease row) waits for this write, and this write, if the takeover
# came first, sees the new epoch (READ COMMITTED re-reads a locked row's latest version) and applies nothing.
_FENCED_WRITE_SQL = f"""
WITH u AS (
    SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::bigint[], $5::jsonb[], $15::int[])
        AS u(table_id, expected, epoch, new_version, state, shard)
), fence AS (
    -- In shard order, as every statement that locks several lease rows does: no two can deadlock.
    SELECT l.shard, l.epoch FROM shard_leases l WHERE l.shard = ANY($15::int[]) ORDER BY l.shard FOR SHARE
), upd AS (
    UPDATE tables t SET row_version = u.new_version, epoch = u.epoch, state = COALESCE(u.state, t.state),
                        updated_at = now()
    FROM u JOIN fence f ON f.shard = u.shard AND f.epoch = u.epoch
    WHERE t.table_id = u.table_id AND t.row_version = u.expected
    RETURNING t.table_id, u.epoch
), log AS (
    INSERT INTO commits (table_id, version, payload, epoch)
    SELECT l.table_id, l.version, l.payload, upd.epoch
    FROM unnest($6::uuid[], $7::bigint[], $8::jsonb[]) AS l(table_id, version, payload)
    JOIN upd ON upd.table_id = l.table_id
), {_IDEMPOTENCY_CTE}, {_events_cte(16)}
SELECT u.table_id, upd.table_id IS NOT NULL AS applied,
       NOT EXISTS (SELECT 1 FROM fence f WHERE f.shard = u.shard AND f.epoch = u.epoch) AS fenced, {_NOTIFY}
FROM u LEFT JOIN upd ON upd.table_id = u.table_id
"""

_INSERT_EVENTS_SQL = f"INSERT INTO events ({_EVENTS_COLUMNS}) SELECT e.* FROM {_events_unnest(1)}"
_INSERT_EVENTS_NOTIFY_SQL = f"WITH ev AS ({_INSERT_EVENTS_SQL}) SELECT {_NOTIFY}"


def _event_columns(writes: list[TableWrite], first_seq: int) -> list[list]:
    """The events of `writes` as the outbox's column arrays, numbered from `first_seq` in the transaction."""
    cols: list[list] = [[], [], [], [], [], [], [], []]
    seq = first_seq
    for w in writes:
        for e in w.events:
            for col, value in zip(cols, (seq, w.table_id, e.id, e.type, e.subject, e.catalog, e.securable, e.data)):
                col.append(value)
            seq += 1
    return cols


# The server process that ran an interrupted write, if it still runs on the server we reach now. After a failover
# (or a restart) that is another server, where the process cannot be; its pid could only match one of our own
# sessions there by chance, never another program's.
_BACKEND_ALIVE_SQL = "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND application_name = $2)"


class GroupCommitWriter:
    """Runs on the asyncio thread. Coalesces every waiting WriteGroup into one database round trip."""

    def __init__(self, pool: asyncpg.Pool, resolve_timeout_s: float, fenced: bool = False):
        self.pool = pool
        self.resolve_timeout_s = resolve_timeout_s
        self.fenced = fenced  # several members share the database: check the shard lease's epoch on every write
        self.fenced_writes = 0  # groups refused because their writer's lease had moved
        # Alone, the row's epoch must equal the writer's; fenced, the lease check (_check_leases) decides and a
        # row may carry any earlier epoch of its shard.
        self._epoch_cas = "epoch <= $3" if fenced else "epoch = $3"
        self._pending: list[tuple[WriteGroup, asyncio.Future]] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._con: asyncpg.Connection | None = None   # see _connection
        # Figures for /metrics and the benchmark.
        self.flushes = 0
        self.groups_written = 0
        self.last_batch_size = 0
        # Told each flush's wall time in seconds (the service's latency histogram); called on the asyncio thread.
        self.on_flush: Callable[[float], None] | None = None
        # Called on the asyncio thread after a flush that applied something: the feed's waiting readers wake.
        self.on_applied: Callable[[], None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        con, self._con = self._con, None
        if con is not None:
            await self.pool.release(con)

    def submit(self, group: WriteGroup) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((group, fut))
        self._wakeup.set()
        return fut

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            items, self._pending = self._pending, []
            if not items:
                continue
            self.flushes += 1
            self.groups_written += len(items)
            self.last_batch_size = len(items)
            started = time.perf_counter()
            try:
                await self._flush(items)
            except Exception as exc:  # never let the writer die: fail this flush, keep serving
                log.exception("storage writer flush failed")
                for _, fut in items:
                    if not fut.done():
                        fut.set_exception(OutcomeLost(f"storage writer failed: {exc}"))
            if self.on_flush is not None:
                self.on_flush(time.perf_counter() - started)

    async def _connection(self) -> asyncpg.Connection:
        """The writer's connection: kept from one flush to the next (a pool's acquire and release cost ~23 us of
        this thread's CPU per flush), taken from the pool again once it is closed or a write failed on it."""
        con, self._con = self._con, None
        if con is not None:
            if not con.is_closed():
                self._con = con
                return con
            await self.pool.release(con)   # (the pool replaces a closed connection on its next acquire)
        self._con = await asyncio.wait_for(self.pool.acquire(), self.resolve_timeout_s)
        return self._con

    async def _flush(self, items: list[tuple[WriteGroup, asyncio.Future]]) -> None:
        try:
            con = await self._connection()
        except (*CONNECTION_ERRORS, asyncpg.PostgresError, asyncpg.exceptions.InternalClientError) as exc:
            # Nothing was sent: every group is known NOT applied.
            err = StoreUnavailable(f"database unavailable: {why(exc)}")
            for _, fut in items:
                fut.set_exception(err)
            return
        try:
            backend = con.get_server_pid()   # asyncpg detaches a connection that dies: ask now
        except asyncpg.InterfaceError as exc:
            # The connection died between the pool handing it out and now (the pool took it back): nothing was
            # sent on it, so every group is known NOT applied.
            self._con = None
            await self._discard(con)
            err = StoreUnavailable(f"database connection lost: {why(exc)}; nothing applied")
            for _, fut in items:
                fut.set_exception(err)
            return
        try:
            results = await self._write(con, [g for g, _ in items])
        except Exception as exc:
            self._con = None   # released or discarded by _after_failed_write
            results = await self._after_failed_write(con, backend, items, exc)
            if results is None:
                return
        for (_, fut), result in zip(items, results):
            fut.set_result(result)
        if self.on_applied is not None and any(r.applied for r in results):
            self.on_applied()

    async def _after_failed_write(self, con: asyncpg.Connection, backend: int,
                                  items: list[tuple[WriteGroup, asyncio.Future]],
                                  exc: Exception) -> list[WriteResult] | None:
        """What a failed flush means for each group: its results, or None once every future has its error. A 503
        ("nothing applied") only where that is proven; where the transaction's COMMIT may have reached the server,
        the outcome is read back from the rows (`_resolve`), and only if that fails is it unknown."""
        if sent_nothing(exc):
            # The failing statement never left, so neither did the COMMIT after it: nothing applied.
            log.warning("database connection lost before the group write was sent (%s)", why(exc))
            await self._discard(con)
            err = StoreUnavailable(f"database connection lost: {why(exc)}; nothing applied")
            for _, fut in items:
                fut.set_exception(err)
            return None
        if server_refused(exc):
            # The server refused the statement as a whole (e.g. a duplicate commit-log version): nothing applied.
            # Write the groups one by one so one bad group cannot fail the others.
            await self.pool.release(con)
            if len(items) == 1:
                items[0][1].set_exception(StoreUnavailable(f"write refused by the database: {exc}"))
                return None
            log.warning("group write refused (%s); retrying %d groups one by one", exc, len(items))
            for item in items:
                await self._flush([item])
            return None
        # The connection died (or asyncpg failed) after the statement was sent: it may have committed.
        log.warning("connection lost during group write (%s); resolving outcome", why(exc))
        await self._discard(con)
        try:
            return await self._resolve([g for g, _ in items], backend)
        except OutcomeLost as unknown:
            for _, fut in items:
                fut.set_exception(unknown)
            return None

    async def _discard(self, con: asyncpg.Connection) -> None:
        try:
            con.terminate()
        except asyncpg.InterfaceError:
            pass   # asyncpg already took back a connection it saw close
        finally:
            await self.pool.release(con)

    async def _write(self, con: asyncpg.Connection, groups: list[WriteGroup]) -> list[WriteResult]:
        simple = [g for g in groups if g.is_simple]
        complex_results: dict[int, WriteResult] = {}
        if len(simple) == len(groups):
            applied, fenced = await self._write_simple(con, simple)
        else:
            async with con.transaction():
                if self.fenced:
                    await self._share_leases(con, groups)
                applied, fenced = await self._write_simple(con, simple) if simple else (set(), set())
                # Each group's events are numbered on from the simple groups' (their place in the transaction).
                seq = 1 + sum(len(g.writes[0].events) for g in simple)
                for g in groups:
                    if not g.is_simple:
                        complex_results[id(g)] = await self._write_complex(con, g, seq)
                        seq += sum(len(w.events) for w in g.writes)
                # (three tables or more in the transaction: with a cross-format commit, all three formats)
                if faults.ARMED and len({w.table_id for g in groups for w in g.writes}) >= 3:
                    faults.hit("group-commit-mid")
        results = []
        for g in groups:
            if g.is_simple:
                ok = g.writes[0].table_id in applied
                results.append(WriteResult(ok, None if ok else Refusal.FENCED if g.writes[0].table_id in fenced
                                           else Refusal.STALE))
            else:
                results.append(complex_results[id(g)])
        self.fenced_writes += sum(1 for r in results if r.refusal is Refusal.FENCED)
        return results

    async def _write_simple(self, con: asyncpg.Connection, groups: list[WriteGroup]) -> tuple[set[UUID], set[UUID]]:
        """Returns the ids of the rows written, and of those refused because their lease had moved."""
        ids, expected, epochs, versions, states = [], [], [], [], []
        l_ids, l_versions, l_payloads = [], [], []
        k_ids, k_keys, k_routes, k_status, k_bodies, k_refs = [], [], [], [], [], []
        for g in groups:
            w = g.writes[0]
            ids.append(w.table_id)
            expected.append(w.expected_version)
            epochs.append(w.epoch)
            versions.append(w.new_version)
            states.append(w.state)
            for e in w.log:
                l_ids.append(w.table_id)
                l_versions.append(e.version)
                l_payloads.append(e.payload)
            for k in g.idempotency:
                k_ids.append(w.table_id)
                k_keys.append(k.key)
                k_routes.append(k.route)
                k_status.append(k.status)
                k_bodies.append(k.body)
                k_refs.append(k.body_ref)
        events = _event_columns([g.writes[0] for g in groups], 1)
        if self.fenced:
            rows = await con.fetch(_FENCED_WRITE_SQL, ids, expected, epochs, versions, states,
                                   l_ids, l_versions, l_payloads, k_ids, k_keys, k_routes, k_status, k_bodies, k_refs,
                                   [shard_of(i) for i in ids], *events)
            return ({r["table_id"] for r in rows if r["applied"]},
                    {r["table_id"] for r in rows if r["fenced"] and not r["applied"]})
        rows = await con.fetch(_SIMPLE_WRITE_SQL, ids, expected, epochs, versions, states,
                               l_ids, l_versions, l_payloads, k_ids, k_keys, k_routes, k_status, k_bodies, k_refs,
                               *events)
        return {r["table_id"] for r in rows}, set()

    async def _write_complex(self, con: asyncpg.Connection, group: WriteGroup, first_seq: int) -> WriteResult:
        try:
            async with con.transaction():  # a savepoint inside the flush's transaction
                if self.fenced:
                    await self._check_leases(con, group.writes)
                for i, w in enumerate(group.writes):
                    if faults.ARMED and i == 1:
                        faults.hit("cross-table-mid")
                    await self._write_one(con, w)
                for k in group.idempotency:
                    await put_idempotency(con, k)
                if any(w.events for w in group.writes):
                    await con.execute(_INSERT_EVENTS_NOTIFY_SQL if self.fenced else _INSERT_EVENTS_SQL,
                                      *_event_columns(group.writes, first_seq))
        except NotApplied as na:
            return WriteResult(False, na.refusal)
        except asyncpg.UniqueViolationError as exc:
            # A duplicate name is a lost race for that name; a duplicate commit-log version means our row moved.
            return WriteResult(False, Refusal.STALE if exc.constraint_name == "commits_pkey" else Refusal.NAME_TAKEN)
        return WriteResult(True)

    @staticmethod
    async def _location_taken(con: asyncpg.Connection, key: str, exclude: UUID | None = None) -> bool:
        """`_location_in_use`, for a write that places a table: such writes take one lock, held until their flush
        commits, so two cannot both pass."""
        await con.execute("SELECT pg_advisory_xact_lock($1)", LOCATIONS_LOCK)
        return await location_in_use(con, key, exclude)

    @staticmethod
    async def _share_leases(con: asyncpg.Connection, groups: list[WriteGroup]) -> None:
        """Every lease row the transaction's statements will hold FOR SHARE, taken first and in shard order. Each
        statement takes its own in shard order, but one group after another they came in any order, and a member's
        lease renewal (FOR UPDATE of its rows, in shard order) then deadlocked with them: holding shard 10 and
        waiting for 40 while this transaction held 40 and waited for 10."""
        shards = sorted({shard_of(w.table_id) for g in groups for w in g.writes if w.epoch != UNFENCED})
        if shards:
            await con.execute("SELECT 1 FROM shard_leases WHERE shard = ANY($1::int[]) ORDER BY shard FOR SHARE",
                              shards)

    async def _check_leases(self, con: asyncpg.Connection, writes: list[TableWrite]) -> None:
        """Every written table's shard lease must still carry its writer's epoch, held FOR SHARE until commit
        (see _FENCED_WRITE_SQL). Tables created by a multi-table transaction have no owner yet (UNFENCED)."""
        checked = {(shard_of(w.table_id), w.epoch) for w in writes if w.epoch != UNFENCED}
        if not checked:
            return
        rows = await con.fetch("SELECT shard, epoch FROM shard_leases WHERE shard = ANY($1::int[]) ORDER BY shard"
                               " FOR SHARE", sorted({s for s, _ in checked}))
        current = {r["shard"]: r["epoch"] for r in rows}
        if any(current.get(shard) != epoch for shard, epoch in checked):
            raise NotApplied(Refusal.FENCED)

    async def _write_one(self, con: asyncpg.Connection, w: TableWrite) -> None:
        if w.insert is not None:
            r = w.insert
            key = location_key(r.location) if r.location else None
            if key is not None and await self._location_taken(con, key):
                exists = await con.fetchval("SELECT 1 FROM tables WHERE realm=$1 AND catalog=$2 AND namespace=$3"
                                            " AND name=$4", r.realm, r.catalog, r.namespace, r.name)
                raise NotApplied(Refusal.NAME_TAKEN if exists else Refusal.LOCATION_TAKEN)   # the name first, as Registry.create_local
            # The namespace row is share-locked until the flush commits: a concurrent drop of the namespace waits,
            # then finds this table and refuses (or, if it came first, this finds no namespace).
            row = await con.fetchrow(
                "WITH ns AS (SELECT 1 FROM namespaces WHERE realm=$2 AND catalog=$3 AND path=$4 FOR KEY SHARE)"
                " INSERT INTO tables (table_id, realm, catalog, namespace, name, kind, format, location, row_version,"
                " epoch, state, location_key) SELECT $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12"
                " WHERE $4 = '' OR EXISTS (SELECT 1 FROM ns)"
                " ON CONFLICT (realm, catalog, namespace, name) DO NOTHING RETURNING table_id",
                r.table_id, r.realm, r.catalog, r.namespace, r.name, r.kind, r.format, r.location, w.new_version,
                max(w.epoch, 0), w.state if w.state is not None else r.state, key)
            if row is None:
                exists = await con.fetchval("SELECT 1 FROM tables WHERE realm=$1 AND catalog=$2 AND namespace=$3"
                                            " AND name=$4", r.realm, r.catalog, r.namespace, r.name)
                raise NotApplied(Refusal.NAME_TAKEN if exists else Refusal.NO_NAMESPACE)
        elif w.delete:
            row = await con.fetchrow(f"DELETE FROM tables WHERE table_id=$1 AND row_version=$2 AND {self._epoch_cas}"
                                     " RETURNING table_id", w.table_id, w.expected_version, w.epoch)
            if row is None:
                raise NotApplied(Refusal.STALE)
            await con.execute("DELETE FROM commits WHERE table_id=$1", w.table_id)
            if w.purge is not None:
                await con.execute("INSERT INTO purges (location_key, location, metadata_location, owner)"
                                  " VALUES ($1, $2, $3, $4) ON CONFLICT (location_key) DO NOTHING",
                                  location_key(w.purge.location), w.purge.location, w.purge.metadata_location,
                                  w.purge.owner)
            return
        else:
            if w.rename is not None:
                catalog, namespace, name = w.rename
                if namespace and not await con.fetchval(
                        "SELECT 1 FROM namespaces n JOIN tables t ON t.realm = n.realm WHERE t.table_id=$1"
                        " AND n.catalog=$2 AND n.path=$3 FOR KEY SHARE OF n", w.table_id, catalog, namespace):
                    raise NotApplied(Refusal.NO_NAMESPACE)
                row = await con.fetchrow(
                    "UPDATE tables SET row_version=$4, state=COALESCE($5, state), catalog=$6, namespace=$7, name=$8,"
                    f" epoch=$3, updated_at=now() WHERE table_id=$1 AND row_version=$2 AND {self._epoch_cas}"
                    " RETURNING table_id",
                    w.table_id, w.expected_version, w.epoch, w.new_version, w.state, catalog, namespace, name)
            else:
                row = await con.fetchrow(
                    "UPDATE tables SET row_version=$4, state=COALESCE($5, state), epoch=$3, updated_at=now()"
                    f" WHERE table_id=$1 AND row_version=$2 AND {self._epoch_cas} RETURNING table_id",
                    w.table_id, w.expected_version, w.epoch, w.new_version, w.state)
            if row is None:
                raise NotApplied(Refusal.STALE)
            if w.relocate is not None:
                key = location_key(w.relocate)
                if await self._location_taken(con, key, exclude=w.table_id):
                    raise NotApplied(Refusal.LOCATION_TAKEN)
                await con.execute("UPDATE tables SET location=$2, location_key=$3 WHERE table_id=$1", w.table_id,
                                  w.relocate, key)
        for start, end in w.log_delete:
            await con.execute("DELETE FROM commits WHERE table_id=$1 AND version >= $2 AND ($3 < 0 OR version < $3)",
                              w.table_id, start, end)
        if w.log:
            await con.executemany("INSERT INTO commits (table_id, version, payload, epoch) VALUES ($1,$2,$3,$4)",
                                  [(w.table_id, e.version, e.payload, w.epoch if self.fenced and w.epoch >= 0 else None)
                                   for e in w.log])

    async def _resolve(self, groups: list[WriteGroup], backend: int) -> list[WriteResult]:
        """After an interrupted write: each group's outcome, from its row's version. Dropping our end of the
        connection does not stop the server process that ran the write: a statement stalled (on a lock, a frozen
        server) goes on, and commits, after we gave up on it. So that process is ended first, and the rows are read
        once it is gone; then, the writing actors being their rows' only writers and still waiting, the versions
        are final. OutcomeLost if that cannot be made sure of within resolve_timeout_s."""
        deadline = time.monotonic() + self.resolve_timeout_s
        problem = f"its server process {backend} has not exited"
        while True:
            try:
                async with self.pool.acquire(timeout=max(deadline - time.monotonic(), 0.1)) as con:
                    if await con.fetchval(_BACKEND_ALIVE_SQL, backend, APPLICATION_NAME):
                        await con.fetchval("SELECT pg_terminate_backend($1)", backend)
                    else:
                        rows = await con.fetch("SELECT table_id, row_version FROM tables WHERE table_id = ANY($1)",
                                               [g.writes[0].table_id for g in groups])
                        versions = {r["table_id"]: r["row_version"] for r in rows}
                        applied = [g.writes[0].applied_at(versions.get(g.writes[0].table_id)) for g in groups]
                        return [WriteResult(a, None if a else Refusal.STALE) for a in applied]
            except (*CONNECTION_ERRORS, asyncpg.PostgresError, asyncpg.exceptions.InternalClientError) as exc:
                problem = why(exc)
            if time.monotonic() > deadline:
                raise OutcomeLost(f"the outcome of an interrupted write is unknown: {problem}")
            await asyncio.sleep(0.1)
