"""The PostgreSQL store: asyncpg on a dedicated asyncio thread, and the group-commit storage writer.

Group commit: every write group waiting when the writer becomes free goes to PostgreSQL in ONE statement (or,
when some groups insert/delete/rename rows, one transaction with a savepoint per such group). Each table's row
is a compare-and-set on (row_version, epoch) with `RETURNING`, so a stale group changes nothing instead of
failing everyone else's. `synchronous_commit` stays on: an answered commit is on disk.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from importlib import resources
from typing import Any, Awaitable, Callable, TypeVar
from uuid import UUID, uuid4

import asyncpg
import orjson

from .errors import NamespaceExists, NamespaceMissing, NamespaceNotEmpty, NamespaceRefilled, OutcomeLost, StoreUnavailable

from .bridge import AsyncioThread
from .files import location_key
from .records import (NAMESPACE_SEP, UNFENCED, IdempotencyRecord, LogEntry, Refusal, TableRow, TableWrite, WriteGroup,
                      WriteResult, shard_of)

log = logging.getLogger(__name__)
T = TypeVar("T")

# Each process's sessions say whose they are (pg_stat_activity): an embedded database is stopped on a graceful exit
# only when no other process's sessions use it (storage/embedded.py).
APPLICATION_NAME = f"coordinator-{os.getpid()}"
# Errors that mean "the connection is gone": the statement may or may not have reached the server.
CONNECTION_ERRORS = (OSError, ConnectionError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
                     asyncio.TimeoutError, asyncpg.exceptions.CannotConnectNowError,
                     asyncpg.exceptions.AdminShutdownError)


class NotApplied(Exception):
    """A write group's compare-and-set did not hold; `refusal` says which check failed."""

    def __init__(self, refusal: Refusal):
        super().__init__(refusal.value)
        self.refusal = refusal


def _why(exc: BaseException) -> str:
    """An error's text for a message: a timeout's is empty, so its type stands in."""
    return str(exc) or type(exc).__name__


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _connection_setup(idle_in_transaction_s: float):
    async def init(con: asyncpg.Connection) -> None:
        await con.set_type_codec("jsonb", encoder=_dumps, decoder=orjson.loads, schema="pg_catalog")
        # A process frozen (SIGSTOP, a stalled VM) in the middle of a transaction keeps its row locks, among them
        # shard-lease rows FOR SHARE: every member's lease renewal then waits on it, and the whole cluster stops
        # committing for as long as it stays frozen. The server ends such a session after this long instead (its
        # transaction rolls back: nothing it was writing applies). Our own transactions are never idle that long.
        await con.execute(f"SET idle_in_transaction_session_timeout = {int(idle_in_transaction_s * 1000)}")
    return init


async def _keep_session(con: asyncpg.Connection) -> None:
    """Pool release hook in place of asyncpg's default reset query (advisory unlock, CLOSE ALL, UNLISTEN, RESET ALL):
    that was one more database round trip per group-commit flush, ~a third of the writer thread's CPU at moderate
    load. Nothing here leaves session state behind: no LISTEN, cursors or session advisory locks (only
    pg_advisory_xact_lock), and the one SET, at connect, is meant to stay. asyncpg still rolls back a transaction
    left open before calling this."""


def _row(r: asyncpg.Record) -> TableRow:
    return TableRow(table_id=r["table_id"], realm=r["realm"], catalog=r["catalog"], namespace=r["namespace"],
                    name=r["name"], format=r["format"], location=r["location"], row_version=r["row_version"],
                    epoch=r["epoch"], state=r["state"], kind=r["kind"])


_TABLE_COLS = "table_id, realm, catalog, namespace, name, kind, format, location, row_version, epoch, state"

# Both write statements record the Idempotency-Keys of the rows they changed, in the same statement as the change.
_IDEMPOTENCY_CTE = """idem AS (
    INSERT INTO idempotency_keys (key, route, status, body, body_ref)
    SELECT k.key, k.route, k.status, k.body, k.body_ref
    FROM unnest($9::uuid[], $10::uuid[], $11::text[], $12::int[], $13::bytea[], $14::text[])
        AS k(table_id, key, route, status, body, body_ref)
    WHERE k.table_id IN (SELECT table_id FROM upd)
    ON CONFLICT (key) DO NOTHING
)"""

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
), {_IDEMPOTENCY_CTE}
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
), {_IDEMPOTENCY_CTE}
SELECT u.table_id, upd.table_id IS NOT NULL AS applied,
       NOT EXISTS (SELECT 1 FROM fence f WHERE f.shard = u.shard AND f.epoch = u.epoch) AS fenced
FROM u LEFT JOIN upd ON upd.table_id = u.table_id
"""


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
        # Figures for /metrics and the benchmark.
        self.flushes = 0
        self.groups_written = 0
        self.last_batch_size = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

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
            try:
                await self._flush(items)
            except Exception as exc:  # never let the writer die: fail this flush, keep serving
                log.exception("storage writer flush failed")
                for _, fut in items:
                    if not fut.done():
                        fut.set_exception(OutcomeLost(f"storage writer failed: {exc}"))

    async def _flush(self, items: list[tuple[WriteGroup, asyncio.Future]]) -> None:
        try:
            con = await asyncio.wait_for(self.pool.acquire(), self.resolve_timeout_s)
        except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
            # Nothing was sent: every group is known NOT applied.
            err = StoreUnavailable(f"database unavailable: {_why(exc)}")
            for _, fut in items:
                fut.set_exception(err)
            return
        try:
            results = await self._write(con, [g for g, _ in items])
        except asyncpg.PostgresError as exc:
            # The server refused the statement as a whole (e.g. a duplicate commit-log version): nothing applied.
            # Write the groups one by one so one bad group cannot fail the others.
            await self.pool.release(con)
            con = None
            if len(items) == 1:
                items[0][1].set_exception(StoreUnavailable(f"write refused by the database: {exc}"))
                return
            log.warning("group write refused (%s); retrying %d groups one by one", exc, len(items))
            for item in items:
                await self._flush([item])
            return
        except CONNECTION_ERRORS as exc:
            log.warning("connection lost during group write (%s); resolving outcome", _why(exc))
            backend = con.get_server_pid()
            await self._discard(con)
            con = None
            try:
                results = await self._resolve([g for g, _ in items], backend)
            except OutcomeLost as unknown:
                for _, fut in items:
                    fut.set_exception(unknown)
                return
        finally:
            if con is not None:
                await self.pool.release(con)
        for (_, fut), result in zip(items, results):
            fut.set_result(result)

    async def _discard(self, con: asyncpg.Connection) -> None:
        try:
            con.terminate()
        finally:
            await self.pool.release(con)

    async def _write(self, con: asyncpg.Connection, groups: list[WriteGroup]) -> list[WriteResult]:
        simple = [g for g in groups if g.is_simple]
        complex_results: dict[int, WriteResult] = {}
        if len(simple) == len(groups):
            applied, fenced = await self._write_simple(con, simple)
        else:
            async with con.transaction():
                applied, fenced = await self._write_simple(con, simple) if simple else (set(), set())
                for g in groups:
                    if not g.is_simple:
                        complex_results[id(g)] = await self._write_complex(con, g)
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
        if self.fenced:
            rows = await con.fetch(_FENCED_WRITE_SQL, ids, expected, epochs, versions, states,
                                   l_ids, l_versions, l_payloads, k_ids, k_keys, k_routes, k_status, k_bodies, k_refs,
                                   [shard_of(i) for i in ids])
            return ({r["table_id"] for r in rows if r["applied"]},
                    {r["table_id"] for r in rows if r["fenced"] and not r["applied"]})
        rows = await con.fetch(_SIMPLE_WRITE_SQL, ids, expected, epochs, versions, states,
                               l_ids, l_versions, l_payloads, k_ids, k_keys, k_routes, k_status, k_bodies, k_refs)
        return {r["table_id"] for r in rows}, set()

    async def _write_complex(self, con: asyncpg.Connection, group: WriteGroup) -> WriteResult:
        try:
            async with con.transaction():  # a savepoint inside the flush's transaction
                if self.fenced:
                    await self._check_leases(con, group.writes)
                for w in group.writes:
                    await self._write_one(con, w)
                for k in group.idempotency:
                    await _put_idempotency(con, k)
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
        await con.execute("SELECT pg_advisory_xact_lock($1)", _LOCATIONS_LOCK)
        return await _location_in_use(con, key, exclude)

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
                    if await con.fetchval(_BACKEND_ALIVE_SQL, backend):
                        await con.fetchval("SELECT pg_terminate_backend($1)", backend)
                    else:
                        rows = await con.fetch("SELECT table_id, row_version FROM tables WHERE table_id = ANY($1)",
                                               [g.writes[0].table_id for g in groups])
                        versions = {r["table_id"]: r["row_version"] for r in rows}
                        applied = [g.writes[0].applied_at(versions.get(g.writes[0].table_id)) for g in groups]
                        return [WriteResult(a, None if a else Refusal.STALE) for a in applied]
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                problem = _why(exc)
            if time.monotonic() > deadline:
                raise OutcomeLost(f"the outcome of an interrupted write is unknown: {problem}")
            await asyncio.sleep(0.1)


class PostgresStore:
    """The coordinator's system of record. All methods are awaited from trio; work runs on the asyncio thread."""

    def __init__(self, dsn: str, *, pool_size: int = 4, timeout_s: float = 10.0, fenced: bool = False):
        self.dsn = dsn
        self.fenced = fenced
        self.pool_size = pool_size
        self.timeout_s = timeout_s
        self.thread = AsyncioThread()
        self.pool: asyncpg.Pool | None = None
        self.writer: GroupCommitWriter | None = None

    # -- lifecycle (blocking; called from the thread that owns the service) -------------------------------

    def open(self) -> None:
        self.thread.start()
        self.thread.run_blocking(self._open, timeout=self.timeout_s * 3)

    async def _open(self) -> None:
        deadline = time.monotonic() + self.timeout_s * 2
        while True:
            try:
                self.pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_size,
                                                      init=_connection_setup(self.timeout_s), reset=_keep_session,
                                                      command_timeout=self.timeout_s,
                                                      server_settings={"application_name": APPLICATION_NAME})
                break
            except (*CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cannot connect to PostgreSQL at {self.dsn}: {exc}") from exc
                await asyncio.sleep(0.25)
        async with self.pool.acquire() as con:
            await migrate(con)
            await _key_locations(con)
        self.writer = GroupCommitWriter(self.pool, self.timeout_s, fenced=self.fenced)
        self.writer.start()

    def close(self) -> None:
        if self.pool is not None:
            self.thread.run_blocking(self._close, timeout=self.timeout_s)
        self.thread.stop()

    async def _close(self) -> None:
        if self.writer:
            await self.writer.stop()
        await self.pool.close()

    # -- plumbing ------------------------------------------------------------------------------------------

    async def _call(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        async def run() -> T:
            try:
                # Bounded like every query (command_timeout): with the database stalled, the pool's connections
                # are all busy and an unbounded wait would hold the request past any client's patience.
                async with self.pool.acquire(timeout=self.timeout_s) as con:
                    return await fn(con)
            except CONNECTION_ERRORS as exc:
                raise StoreUnavailable(f"database unavailable: {_why(exc)}") from exc

        return await self.thread.call(run)

    async def with_connection(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run `fn(connection)` on the storage thread: for modules with their own SQL (coordinator/cluster)."""
        return await self._call(fn)

    async def write(self, group: WriteGroup) -> WriteResult:
        """Durably write a group with everyone else's waiting groups. Raises StoreUnavailable (known not applied)
        or OutcomeLost."""
        return await self.thread.call(lambda: self.writer.submit(group))

    # -- namespaces ----------------------------------------------------------------------------------------

    async def create_namespace(self, realm: str, catalog: str, path: str, properties: dict[str, str],
                               idempotency: IdempotencyRecord | None = None, *,
                               parent: tuple[str, str, str] | None = None) -> None:
        """`parent` (realm, catalog, path): a namespace row that must exist, share-locked until this commits, so a
        concurrent drop of the parent either sees the child and refuses, or comes first and this fails NamespaceMissing:
        a child is never left under a dropped parent."""
        p_realm, p_catalog, p_path = parent or (None, None, None)

        async def q(con):
            async with con.transaction():
                row = await con.fetchrow(
                    "WITH parent AS (SELECT 1 FROM namespaces WHERE realm=$5 AND catalog=$6 AND path=$7"
                    " FOR KEY SHARE) INSERT INTO namespaces (realm, catalog, path, properties)"
                    " SELECT $1,$2,$3,$4 WHERE $5::text IS NULL OR EXISTS (SELECT 1 FROM parent)"
                    " ON CONFLICT DO NOTHING RETURNING path", realm, catalog, path, properties, p_realm, p_catalog,
                    p_path)
                if row is None:
                    if parent and not await con.fetchval("SELECT 1 FROM namespaces WHERE realm=$1 AND catalog=$2"
                                                         " AND path=$3", *parent):
                        raise NamespaceMissing(f"Namespace does not exist: {_show(p_path)}")
                    raise NamespaceExists(f"Namespace already exists: {_show(path)}")
                await _put_idempotency(con, idempotency)
        await self._call(q)

    async def get_namespace(self, realm: str, catalog: str, path: str) -> dict[str, str] | None:
        return await self._call(lambda con: con.fetchval(
            "SELECT properties FROM namespaces WHERE realm=$1 AND catalog=$2 AND path=$3", realm, catalog, path))

    async def list_namespaces(self, realm: str, catalog: str, parent: str | None, *, after: str | None = None,
                              limit: int | None = None, recursive: bool = False) -> list[str]:
        """Namespace paths directly under `parent` (None/"" = top level), ordered, after the `after` cursor."""
        async def q(con):
            rows = await con.fetch(
                "SELECT path FROM namespaces WHERE realm=$1 AND catalog=$2"
                " AND (($3 = '' AND ($6 OR position(chr(31) in path) = 0))"
                "   OR ($3 <> '' AND starts_with(path, $3 || chr(31))"
                "       AND ($6 OR position(chr(31) in substr(path, length($3) + 2)) = 0)))"
                " AND ($4::text IS NULL OR path > $4) ORDER BY path LIMIT $5",
                realm, catalog, parent or "", after, limit, recursive)
            return [r["path"] for r in rows]
        return await self._call(q)

    async def update_namespace_properties(self, realm: str, catalog: str, path: str, removals: list[str],
                                          updates: dict[str, str],
                                          idempotency: IdempotencyRecord | None = None) -> dict[str, str]:
        """Returns the properties before the change; raises NamespaceMissing."""
        async def q(con):
            async with con.transaction():
                before = await con.fetchval("SELECT properties FROM namespaces WHERE realm=$1 AND catalog=$2"
                                            " AND path=$3 FOR NO KEY UPDATE", realm, catalog, path)
                if before is None:
                    raise NamespaceMissing(f"Namespace does not exist: {_show(path)}")
                removed = set(removals)
                after = {k: v for k, v in before.items() if k not in removed}
                after.update(updates)
                await con.execute("UPDATE namespaces SET properties=$4 WHERE realm=$1 AND catalog=$2 AND path=$3",
                                  realm, catalog, path, after)
                await _put_idempotency(con, idempotency)
                return before
        return await self._call(q)

    async def drop_namespace(self, realm: str, catalog: str, path: str, *, cascade: bool = False,
                             idempotency: IdempotencyRecord | None = None, children_realm: str = "") -> None:
        """Raises NamespaceMissing, or NamespaceNotEmpty when it holds tables, views or namespaces. `cascade` drops the namespaces
        below it too, but never a table: tables are dropped through their actors first (one dropped here would
        go on being served from memory); any still there, created meanwhile, raise NamespaceRefilled.
        With `children_realm`, namespaces of that realm whose catalog is `path` are children too (a Unity
        Catalog catalog's schemas); cascade does not reach them."""
        async def q(con):
            async with con.transaction():
                found = await con.fetchval("SELECT 1 FROM namespaces WHERE realm=$1 AND catalog=$2 AND path=$3"
                                           " FOR UPDATE", realm, catalog, path)
                if not found:
                    raise NamespaceMissing(f"Namespace does not exist: {_show(path)}")
                if cascade:
                    await _lock_descendants(con, realm, catalog, path)
                    if await con.fetchval("SELECT EXISTS (SELECT 1 FROM tables WHERE realm=$1 AND catalog=$2 AND"
                                          " (namespace=$3 OR starts_with(namespace, $3 || chr(31))))",
                                          realm, catalog, path):
                        raise NamespaceRefilled(f"Namespace {_show(path)} holds tables created while it was dropped")
                    await con.execute("DELETE FROM namespaces WHERE realm=$1 AND catalog=$2 AND"
                                      " starts_with(path, $3 || chr(31))", realm, catalog, path)
                else:
                    busy = await con.fetchval(
                        "SELECT EXISTS (SELECT 1 FROM tables WHERE realm=$1 AND catalog=$2 AND namespace=$3)"
                        " OR EXISTS (SELECT 1 FROM namespaces WHERE realm=$1 AND catalog=$2"
                        " AND starts_with(path, $3 || chr(31)))"
                        " OR EXISTS (SELECT 1 FROM namespaces WHERE realm=$4 AND catalog=$3)",
                        realm, catalog, path, children_realm)
                    if busy:
                        raise NamespaceNotEmpty(f"Namespace is not empty: {_show(path)}")
                await con.execute("DELETE FROM namespaces WHERE realm=$1 AND catalog=$2 AND path=$3",
                                  realm, catalog, path)
                await _put_idempotency(con, idempotency)
        await self._call(q)

    # -- tables --------------------------------------------------------------------------------------------

    async def find_table(self, realm: str, catalog: str, namespace: str, name: str) -> TableRow | None:
        r = await self._call(lambda con: con.fetchrow(
            f"SELECT {_TABLE_COLS} FROM tables WHERE realm=$1 AND catalog=$2 AND namespace=$3 AND name=$4",
            realm, catalog, namespace, name))
        return _row(r) if r else None

    async def get_table(self, table_id: UUID) -> TableRow | None:
        r = await self._call(lambda con: con.fetchrow(f"SELECT {_TABLE_COLS} FROM tables WHERE table_id=$1",
                                                      table_id))
        return _row(r) if r else None

    async def location_taken(self, location: str, exclude: UUID | None = None, *, purges: bool = True,
                             below: bool = True) -> bool:
        """Whether a table or view (other than `exclude`) lives at, above or (`below`) below `location`, or
        (`purges`) a dropped one's files there are still being deleted: a check before writing a table's files
        there; the write checks again under a lock."""
        return await self._call(lambda con: _location_in_use(con, location_key(location), exclude, purges, below))

    async def pending_purges(self, older_than_s: float = 0) -> list[str]:
        """Locations whose deletion was claimed by a drop (TableWrite.purge) and has not ended, and whose claim
        nobody renewed for `older_than_s`."""
        rows = await self._call(lambda con: con.fetch(
            "SELECT location FROM purges WHERE renewed_at <= now() - make_interval(secs => $1) ORDER BY renewed_at",
            float(older_than_s)))
        return [r["location"] for r in rows]

    async def take_over_purge(self, location: str, older_than_s: float) -> UUID | None:
        """Take over the claim on `location` if nobody renewed it for `older_than_s`: the new owner's token for
        the one caller (of any member) that may resume its deletion, None for the others."""
        return await self._call(lambda con: con.fetchval(
            "UPDATE purges SET renewed_at = now(), owner = $3 WHERE location_key = $1"
            " AND renewed_at <= now() - make_interval(secs => $2) RETURNING owner",
            location_key(location), float(older_than_s), uuid4()))

    async def confirm_purge(self, location: str, owner: UUID | None) -> tuple[bool, str | None]:
        """Before a deletion starts: whether the claim on `location` is still `owner`'s (renewed if so), and its
        metadata file, whose reachable files alone are to be deleted (None: the whole location)."""
        row = await self._call(lambda con: con.fetchrow(
            "UPDATE purges SET renewed_at = now() WHERE location_key = $1 AND owner IS NOT DISTINCT FROM $2"
            " RETURNING metadata_location", location_key(location), owner))
        return (True, row["metadata_location"]) if row is not None else (False, None)

    async def renew_purge(self, location: str, owner: UUID | None) -> bool:
        """The deletion of `location` is still running here: nobody else is to resume it. False if the claim is
        no longer `owner`'s (another member took it over)."""
        return await self._call(lambda con: con.fetchval(
            "UPDATE purges SET renewed_at = now() WHERE location_key = $1 AND owner IS NOT DISTINCT FROM $2"
            " RETURNING true", location_key(location), owner)) is True

    async def end_purge(self, location: str, owner: UUID | None) -> None:
        """The dropped table's files at `location` are deleted: the location is free for a new table. Only the
        claim's owner ends it: a claim taken over meanwhile belongs to a deletion that may still be running."""
        await self._call(lambda con: con.execute(
            "DELETE FROM purges WHERE location_key = $1 AND owner IS NOT DISTINCT FROM $2",
            location_key(location), owner))

    async def settled_row_version(self, table_id: UUID) -> int | None:
        """The row's version once no transaction is writing it: FOR UPDATE waits for a writer whose connection
        was lost mid-commit to commit or roll back, so the answer is final."""
        return await self._call(lambda con: con.fetchval(
            "SELECT row_version FROM tables WHERE table_id=$1 FOR UPDATE", table_id))

    async def list_tables(self, realm: str, catalog: str, namespace: str | None, *, kind: str | None = None,
                          after: str | None = None, limit: int | None = None) -> list[TableRow]:
        """Tables of one namespace (or of all namespaces when `namespace` is None), ordered by (namespace, name),
        after the cursor `after` (`TableRow.cursor`)."""
        after_ns, after_name = _split_table_cursor(after, namespace)
        rows = await self._call(lambda con: con.fetch(
            f"SELECT {_TABLE_COLS} FROM tables WHERE realm=$1 AND catalog=$2 AND ($3::text IS NULL OR namespace=$3)"
            " AND ($4::text IS NULL OR kind=$4) AND ($5::text IS NULL OR (namespace, name) > ($5, $6))"
            " ORDER BY namespace, name LIMIT $7", realm, catalog, namespace, kind, after_ns, after_name, limit))
        return [_row(r) for r in rows]

    async def read_log(self, table_id: UUID, *, start: int = 0, end: int | None = None, limit: int | None = None,
                       descending: bool = False) -> list[LogEntry]:
        """Commit-log entries with start <= version <= end."""
        order = "DESC" if descending else "ASC"
        rows = await self._call(lambda con: con.fetch(
            f"SELECT version, payload FROM commits WHERE table_id=$1 AND version >= $2"
            f" AND ($3::bigint IS NULL OR version <= $3) ORDER BY version {order} LIMIT $4",
            table_id, start, end, limit))
        return [LogEntry(r["version"], r["payload"]) for r in rows]

    async def count_log(self, table_id: UUID, ranges: list[tuple[int, int]], *, below: int,
                        excluding: list[tuple[int, int]] = ()) -> int:
        """How many commit-log entries below version `below` lie in one of the [start, end) ranges (end < 0:
        through the latest) and in none of the `excluding` ranges."""
        return await self._call(lambda con: con.fetchval(
            "SELECT count(*) FROM commits c WHERE table_id=$1 AND version < $2"
            " AND EXISTS (SELECT 1 FROM unnest($3::bigint[], $4::bigint[]) AS r(s, e)"
            "             WHERE c.version >= r.s AND (r.e < 0 OR c.version < r.e))"
            " AND NOT EXISTS (SELECT 1 FROM unnest($5::bigint[], $6::bigint[]) AS x(s, e)"
            "                 WHERE c.version >= x.s AND (x.e < 0 OR c.version < x.e))",
            table_id, below, [s for s, _ in ranges], [e for _, e in ranges], [s for s, _ in excluding],
            [e for _, e in excluding]))

    async def add_iceberg_report(self, table_id: UUID, report_type: str, report: dict) -> None:
        await self._call(lambda con: con.execute(
            "INSERT INTO iceberg_metric_reports (table_id, report_type, report) VALUES ($1,$2,$3)",
            table_id, report_type, report))

    async def add_delta_report(self, table_id: UUID, commit_version: int, report: dict) -> None:
        """Kept only while the table exists (a report racing a drop is dropped with it)."""
        await self._call(lambda con: con.execute(
            "INSERT INTO delta_commit_metrics (table_id, commit_version, report) SELECT $1, $2, $3"
            " WHERE EXISTS (SELECT 1 FROM tables WHERE table_id = $1)", table_id, commit_version, report))

    async def delete_delta_reports(self, table_id: UUID) -> None:
        await self._call(lambda con: con.execute("DELETE FROM delta_commit_metrics WHERE table_id=$1", table_id))

    # -- idempotency ---------------------------------------------------------------------------------------

    async def get_idempotency(self, key: UUID) -> IdempotencyRecord | None:
        r = await self._call(lambda con: con.fetchrow(
            "SELECT key, route, status, body, body_ref FROM idempotency_keys WHERE key=$1", key))
        return IdempotencyRecord(r["key"], r["route"], r["status"], r["body"], r["body_ref"]) if r else None

    async def put_idempotency(self, record: IdempotencyRecord) -> None:
        await self._call(lambda con: _put_idempotency(con, record))

    async def purge_idempotency(self, older_than_s: float) -> int:
        status = await self._call(lambda con: con.execute(
            "DELETE FROM idempotency_keys WHERE created_at < now() - make_interval(secs => $1)", older_than_s))
        return int(status.split()[-1])

    async def signing_key(self, candidate: bytes) -> bytes:
        """The service's token-signing key: `candidate` if none is stored yet, else the stored one."""
        async def q(con):
            await con.execute("INSERT INTO auth_signing_keys (name, secret) VALUES ('tokens', $1)"
                              " ON CONFLICT (name) DO NOTHING", candidate)
            return await con.fetchval("SELECT secret FROM auth_signing_keys WHERE name = 'tokens'")
        return await self._call(q)

    async def ping(self) -> None:
        await self._call(lambda con: con.fetchval("SELECT 1"))

    def writer_stats(self) -> dict[str, int]:
        w = self.writer
        return {"flushes": w.flushes, "groups": w.groups_written, "last_batch": w.last_batch_size,
                "fenced": w.fenced_writes} if w else {}


async def _put_idempotency(con: asyncpg.Connection, record: IdempotencyRecord | None) -> None:
    if record is not None:
        await con.execute("INSERT INTO idempotency_keys (key, route, status, body, body_ref) VALUES ($1,$2,$3,$4,$5)"
                          " ON CONFLICT (key) DO NOTHING", record.key, record.route, record.status, record.body,
                          record.body_ref)


def _split_table_cursor(after: str | None, namespace: str | None) -> tuple[str | None, str | None]:
    """(namespace, name) of a cursor. Compared as a pair, in the listing's own order: comparing the joined string
    put a namespace holding a character below U+001E out of order, and a page could skip tables. Within one
    namespace its known prefix is cut off (an Iceberg namespace may itself hold U+001E); across namespaces (Lance
    only, whose names cannot hold U+001E) the first separator splits."""
    if after is None:
        return None, None
    if namespace is not None and after.startswith(namespace + chr(30)):
        return namespace, after[len(namespace) + 1:]
    ns, _, name = after.partition(chr(30))
    return ns, name


_BACKEND_ALIVE_SQL = "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)"
_LOCATIONS_LOCK = 7263542  # pg_advisory_xact_lock key serializing creations of located tables (7263541: migrations)
# Equal to the key or one of its ancestors, or below it: byte order puts exactly key/... in [key/, key0).
_LOCATION_TAKEN_SQL = """SELECT EXISTS (SELECT 1 FROM tables WHERE (location_key COLLATE "C" = ANY($1::text[])
    OR (location_key COLLATE "C" >= $2 AND location_key COLLATE "C" < $3)) AND table_id IS DISTINCT FROM $4)
    OR ($5 AND EXISTS (SELECT 1 FROM purges WHERE location_key COLLATE "C" = ANY($1::text[])
    OR (location_key COLLATE "C" >= $2 AND location_key COLLATE "C" < $3)))"""


async def _lock_descendants(con: asyncpg.Connection, realm: str, catalog: str, path: str) -> None:
    """Lock every namespace below `path` against creates in it (they share-lock their parent), until a read finds
    none left unlocked: one created while the lock was taken is locked in the next round. Then a table or
    namespace can appear below `path` only once this transaction has ended."""
    sql = ("SELECT path FROM namespaces WHERE realm=$1 AND catalog=$2 AND starts_with(path, $3 || chr(31))"
           " ORDER BY path")   # one order for every drop: two overlapping ones cannot lock crosswise
    locked: set[str] = set()
    while True:
        found = {r["path"] for r in await con.fetch(sql, realm, catalog, path)}
        if found <= locked:
            return
        locked |= {r["path"] for r in await con.fetch(sql + " FOR UPDATE", realm, catalog, path)}


async def _location_in_use(con: asyncpg.Connection, key: str, exclude: UUID | None, purges: bool = True,
                           below: bool = True) -> bool:
    """Whether a table or view (other than `exclude`) lives at, above or (`below`) below the location `key`
    (files.location_key), or (`purges`) a dropped one whose files there are still being deleted."""
    ancestors = [key]
    while "/" in ancestors[-1].split(":", 1)[1].strip("/"):
        ancestors.append(ancestors[-1].rsplit("/", 1)[0])
    lo, hi = (key + "/", key + "0") if below else ("", "")   # "" to "": an empty range
    return await con.fetchval(_LOCATION_TAKEN_SQL, ancestors, lo, hi, exclude, purges)


def _show(path: str) -> str:
    return ".".join(path.split(NAMESPACE_SEP))


async def _key_locations(con: asyncpg.Connection) -> None:
    """Rows without a location key (from before migration 007) get one, spelled by `location_key`. A location it
    cannot read is left unkeyed, and said so: such a row guards no place against overlap."""
    rows = await con.fetch("SELECT table_id, location FROM tables WHERE location IS NOT NULL AND location_key IS NULL")
    keyed = []
    for r in rows:
        try:
            keyed.append((r["table_id"], location_key(r["location"])))
        except ValueError as exc:
            log.warning("table %s: location %r has no key (%s)", r["table_id"], r["location"], exc)
    if keyed:
        log.info("keying the locations of %d tables", len(keyed))
        await con.executemany("UPDATE tables SET location_key = $2 WHERE table_id = $1", keyed)


async def migrate(con: asyncpg.Connection) -> None:
    """Apply versioned migrations in order, once each; safe when several processes start at once."""
    async with con.transaction():
        await con.execute("SELECT pg_advisory_xact_lock(7263541)")
        await con.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version int PRIMARY KEY,"
                          " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
        done = {r["version"] for r in await con.fetch("SELECT version FROM schema_migrations")}
        files = sorted(f for f in resources.files("storage.migrations").iterdir() if f.name.endswith(".sql"))
        for f in files:
            version = int(f.name.split("_", 1)[0])
            if version in done:
                continue
            log.info("applying migration %s", f.name)
            await con.execute(f.read_text())
            await con.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", version, f.name)
