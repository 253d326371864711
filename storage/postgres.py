"""The PostgreSQL store: asyncpg on a dedicated asyncio thread; its reads and its writes other than table rows
(namespaces, idempotency records, purge claims, the signing key). Table rows are written by the group-commit
writer (storage/writer.py), the cluster's leases by storage/leases.py, the schema by storage/schema.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, TypeVar
from urllib.parse import urlsplit, urlunsplit
from uuid import UUID, uuid4

import asyncpg

from .bridge import AsyncioThread
from .connections import APPLICATION_NAME, CONNECTION_ERRORS, connection_setup, pool_options, sent_nothing, why
from .events import EventLog, listen
from .errors import (DatabaseUnreachable, NamespaceExists, NamespaceMissing, NamespaceNotEmpty, NamespaceRefilled, OutcomeLost,
                     StoreUnavailable)
from .deletions import DeletionClaims
from .leases import LeaseStore
from .owner import OwnerLock
from .paths import location_key
from .queries import location_in_use, put_idempotency
from .records import (NAMESPACE_SEP, IdempotencyRecord, LogEntry, ReportTable, TableRow, WriteGroup,
                      WriteResult)
from .schema import key_locations, migrate
from .writer import GroupCommitWriter

# Importable from here as before: the session name, its setup (loadtest/bench.py), the migrations (tests).
_connection_setup = connection_setup
__all__ = ["PostgresStore", "GroupCommitWriter", "WriteResult", "APPLICATION_NAME", "CONNECTION_ERRORS", "migrate"]

log = logging.getLogger(__name__)
T = TypeVar("T")


def _row(r: asyncpg.Record) -> TableRow:
    return TableRow(table_id=r["table_id"], realm=r["realm"], catalog=r["catalog"], namespace=r["namespace"],
                    name=r["name"], format=r["format"], location=r["location"], row_version=r["row_version"],
                    epoch=r["epoch"], state=r["state"], kind=r["kind"])


_TABLE_COLS = "table_id, realm, catalog, namespace, name, kind, format, location, row_version, epoch, state"


def without_password(dsn: str) -> str:
    """The DSN as it may be printed: a password in it is replaced by `***`."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


async def _keep_newest_reports(con: asyncpg.Connection, table: str, table_id: UUID, keep: int) -> None:
    """Delete the table's reports beyond its newest `keep` (by `seq`, the order they came in)."""
    await con.execute(f"DELETE FROM {table} WHERE table_id = $1 AND seq <= (SELECT seq FROM {table}"
                      f" WHERE table_id = $1 ORDER BY seq DESC OFFSET $2 LIMIT 1)", table_id, keep)


class PostgresStore:
    """The coordinator's system of record. All methods are awaited from trio; work runs on the asyncio thread."""

    def __init__(self, dsn: str, *, pool_size: int = 4, timeout_s: float = 10.0, fenced: bool = False,
                 feed_pool_size: int = 2):
        self.dsn = dsn
        self.fenced = fenced
        self.pool_size = pool_size
        self.feed_pool_size = feed_pool_size
        self.timeout_s = timeout_s
        self.thread = AsyncioThread()
        self.pool: asyncpg.Pool | None = None
        # The commit feed's readers have connections of their own: however many read or wait, they never hold one
        # that a commit, a table load or a listing needs (connections are made as readers come, up to this many),
        # and the one read all waiting readers share has one more, so that it never queues behind their own reads.
        self.feed_pool: asyncpg.Pool | None = None
        self.feed_shared_pool: asyncpg.Pool | None = None
        self.writer: GroupCommitWriter | None = None
        self.on_flush: Callable[[float], None] | None = None  # each group-commit flush's seconds, for /metrics
        # Alone, this process owns the database; fenced, it shares it with cluster members only.
        self.owner = OwnerLock(dsn, shared=fenced, timeout_s=timeout_s)
        self.leases = LeaseStore(self._call)   # the cluster's shard leases and member rows
        self.deletions = DeletionClaims(self._call)   # claims on live tables' files (snapshot expiry)
        self.events = EventLog(lambda fn: self._call(fn, pool=self.feed_pool),   # the commit feed
                               lambda fn: self._call(fn, pool=self.feed_shared_pool))
        # Called on the storage thread whenever new events may be readable: a flush here applied something, or
        # (fenced) another member said so. The feed wakes its waiting readers.
        self.on_events: Callable[[], None] | None = None
        self._listener: asyncio.Task | None = None
        self._listen_wanted: asyncio.Event | None = None   # (fenced) set while readers wait on the feed here

    # -- lifecycle (blocking; called from the thread that owns the service) -------------------------------

    def open(self) -> None:
        self.thread.start()
        self.thread.run_blocking(self._open, timeout=self.timeout_s * 3)

    async def _open(self) -> None:
        deadline = time.monotonic() + self.timeout_s * 2
        while True:
            try:
                # (+1: the group-commit writer keeps one connection for itself, storage/writer.py)
                self.pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_size + 1,
                                                      **pool_options(self.timeout_s))
                break
            except (*CONNECTION_ERRORS, asyncpg.PostgresError, asyncpg.exceptions.InternalClientError) as exc:
                if time.monotonic() > deadline:
                    raise DatabaseUnreachable(f"cannot connect to PostgreSQL at {without_password(self.dsn)}: "
                                              f"{exc}") from exc
                await asyncio.sleep(0.25)
        try:
            await self.owner.take()
        except BaseException:
            pool, self.pool = self.pool, None
            await pool.close()
            raise
        self.owner.keep()
        async with self.pool.acquire() as con:
            await migrate(con)
            await key_locations(con)
        self.feed_pool = await asyncpg.create_pool(self.dsn, min_size=0, max_size=self.feed_pool_size,
                                                   **pool_options(self.timeout_s))
        self.feed_shared_pool = await asyncpg.create_pool(self.dsn, min_size=0, max_size=1,
                                                          **pool_options(self.timeout_s))
        self.writer = GroupCommitWriter(self.pool, self.timeout_s, fenced=self.fenced)
        self.writer.on_flush = self.on_flush
        self.writer.on_applied = self._events_applied
        self.writer.start()
        if self.fenced:
            self._listen_wanted = asyncio.Event()
            self._listener = asyncio.get_running_loop().create_task(
                listen(self.dsn, self._events_applied, self.timeout_s, self._listen_wanted))

    def close(self) -> None:
        if self.pool is not None:
            self.thread.run_blocking(self._close, timeout=self.timeout_s)
        self.thread.stop()

    def want_events(self, wanted: bool) -> None:
        wanted_event, loop = self._listen_wanted, self.thread.loop
        if wanted_event is not None and loop is not None:   # (alone, this process's own flushes tell it everything)
            loop.call_soon_threadsafe(wanted_event.set if wanted else wanted_event.clear)

    def _events_applied(self) -> None:
        if self.on_events is not None:
            self.on_events()

    async def _close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
        if self.writer:
            await self.writer.stop()
        for pool in (self.feed_pool, self.feed_shared_pool):
            if pool is not None:
                await pool.close()
        await self.pool.close()
        await self.owner.release()

    # -- plumbing ------------------------------------------------------------------------------------------

    async def _call(self, fn: Callable[[asyncpg.Connection], Awaitable[T]], *, changes: bool = False,
                    pool: asyncpg.Pool | None = None) -> T:
        """Run `fn(connection)` on the storage thread, on a connection of `pool` (the main one by default). A lost
        connection is StoreUnavailable (nothing applied), except where `fn` `changes` what a client is answered
        about and may have sent its COMMIT: OutcomeLost."""
        pool = pool or self.pool

        async def run() -> T:
            try:
                # Bounded like every query (command_timeout): with the database stalled, the pool's connections
                # are all busy and an unbounded wait would hold the request past any client's patience.
                con = await pool.acquire(timeout=self.timeout_s)
            except (*CONNECTION_ERRORS, asyncpg.PostgresError, asyncpg.exceptions.InternalClientError) as exc:
                # InternalClientError here: no host of a multi-host URL is writable now (while a standby is
                # promoted, TargetServerAttributeNotMatched).
                raise StoreUnavailable(f"database unavailable: {why(exc)}") from exc
            try:
                return await fn(con)
            except (*CONNECTION_ERRORS, asyncpg.exceptions.InternalClientError) as exc:
                if changes and not sent_nothing(exc):
                    raise OutcomeLost(f"the database connection was lost during the change ({why(exc)}); it may "
                                      f"or may not have applied") from exc
                raise StoreUnavailable(f"database unavailable: {why(exc)}") from exc
            finally:
                await pool.release(con)

        return await self.thread.call(run)

    async def with_connection(self, fn: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
        """Run `fn(connection)` on the storage thread: for tests and tools that read or set rows directly (the
        coordinator's own SQL is all in storage/)."""
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
                await put_idempotency(con, idempotency)
        await self._call(q, changes=True)

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
                await put_idempotency(con, idempotency)
                return before
        return await self._call(q, changes=True)

    async def drop_namespace(self, realm: str, catalog: str, path: str, *, cascade: bool = False,
                             idempotency: IdempotencyRecord | None = None, children_realm: str = "") -> None:
        """Raises NamespaceMissing, or NamespaceNotEmpty when it holds tables, views or namespaces. `cascade` drops
        the namespaces below it too, but never a table: tables are dropped through their actors first (one dropped
        here would go on being served from memory); any still there, created meanwhile, raise NamespaceRefilled.
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
                await put_idempotency(con, idempotency)
        await self._call(q, changes=True)

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
        return await self._call(lambda con: location_in_use(con, location_key(location), exclude, purges, below))

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

    async def list_catalogs(self, realm: str) -> list[str]:
        """The catalogs of `realm` that hold a namespace or a table, in order."""
        rows = await self._call(lambda con: con.fetch(
            "SELECT catalog FROM namespaces WHERE realm=$1 UNION SELECT catalog FROM tables WHERE realm=$1"
            " ORDER BY catalog", realm))
        return [r["catalog"] for r in rows]

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

    async def add_report(self, table: ReportTable, table_id: UUID, key: str | int, report: dict, keep: int) -> None:
        # (the table and column names are a format's declaration, never a client's word)
        exists = " WHERE EXISTS (SELECT 1 FROM tables WHERE table_id = $1)" if table.while_table_exists else ""

        async def q(con):
            async with con.transaction():
                await con.execute(f"INSERT INTO {table.name} (table_id, {table.key}, report) SELECT $1, $2, $3"
                                  f"{exists}", table_id, key, report)
                await _keep_newest_reports(con, table.name, table_id, keep)
        await self._call(q)

    async def delete_reports(self, table: ReportTable, table_id: UUID) -> None:
        await self._call(lambda con: con.execute(f"DELETE FROM {table.name} WHERE table_id=$1", table_id))

    async def purge_reports(self, tables: list[ReportTable], older_than_s: float) -> int:
        async def q(con):
            deleted = 0
            for table in tables:
                status = await con.execute(f"DELETE FROM {table.name} WHERE created_at < now() - make_interval(secs"
                                           f" => $1)", older_than_s)
                deleted += int(status.split()[-1])
            return deleted
        return await self._call(q)

    # -- idempotency ---------------------------------------------------------------------------------------

    async def get_idempotency(self, key: UUID) -> IdempotencyRecord | None:
        r = await self._call(lambda con: con.fetchrow(
            "SELECT key, route, status, body, body_ref FROM idempotency_keys WHERE key=$1", key))
        return IdempotencyRecord(r["key"], r["route"], r["status"], r["body"], r["body_ref"]) if r else None

    async def put_idempotency(self, record: IdempotencyRecord) -> None:
        await self._call(lambda con: put_idempotency(con, record), changes=True)

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


def _show(path: str) -> str:
    return ".".join(path.split(NAMESPACE_SEP))
