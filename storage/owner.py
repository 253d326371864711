"""One owner per database: a process serves a database alone, or together with cluster members only.

Each process holds a session-level advisory lock on a connection of its own: exclusive when it serves alone,
shared when it is a cluster member (members fence each other with shard leases, storage/leases.py). A second
process is refused at start-up with the holder's pid, host and start time. The lock lives as long as the
holder's session: a process that dies, however it dies, releases it as soon as the server sees its connection
close, so a restart is never blocked by a stale claim.

When the lock's session ends while the process goes on (the database restarted, a standby was promoted), the
process takes the lock again as soon as the database answers; should another process have taken it meanwhile,
this one stops: two processes must never both believe they own every table.
"""

from __future__ import annotations

import asyncio
import logging
import os

import asyncpg

from .connections import APPLICATION_NAME, CONNECTION_ERRORS, why
from .errors import StorageError

log = logging.getLogger(__name__)

OWNER_LOCK = 7263543   # advisory lock key (7263541: migrations, 7263542: table locations)

_HOLDERS_SQL = """
SELECT a.application_name, host(a.client_addr) AS client, a.backend_start, l.mode
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid = $1 AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY a.backend_start
"""


class DatabaseInUse(StorageError):
    """Another process owns the database (or, for a cluster member, serves it alone)."""


class OwnerLock:
    """The advisory lock, on the store's asyncio thread."""

    def __init__(self, dsn: str, *, shared: bool, timeout_s: float):
        self.dsn = dsn
        self.shared = shared
        self.timeout_s = timeout_s
        self._con: asyncpg.Connection | None = None
        self._keeper: asyncio.Task | None = None

    async def take(self) -> None:
        """Take the lock, or raise DatabaseInUse naming its holders."""
        con = await asyncpg.connect(self.dsn, timeout=self.timeout_s,
                                    server_settings={"application_name": APPLICATION_NAME})
        try:
            fn = "pg_try_advisory_lock_shared" if self.shared else "pg_try_advisory_lock"
            if not await con.fetchval(f"SELECT {fn}($1)", OWNER_LOCK):
                raise DatabaseInUse(await self._refusal(con))
        except BaseException:
            con.terminate()
            raise
        self._con = con

    def keep(self) -> None:
        """From now on, take the lock back whenever its session ends."""
        self._keeper = asyncio.get_running_loop().create_task(self._keep())

    async def release(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            try:
                await self._keeper
            except asyncio.CancelledError:
                pass
        if self._con is not None:
            await self._con.close(timeout=self.timeout_s)
            self._con = None

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            if self._con is not None and not self._con.is_closed():
                try:   # a session the server ended is only seen closed once something is read from it
                    await self._con.fetchval("SELECT 1", timeout=self.timeout_s)
                    continue
                except (*CONNECTION_ERRORS, asyncpg.PostgresError, asyncpg.exceptions.InternalClientError):
                    pass
            if self._con is not None:
                self._con.terminate()
                self._con = None
                log.warning("the database session holding this process's ownership ended; taking it again")
            try:
                await self.take()
                log.warning("ownership of the database taken again")
            except DatabaseInUse as exc:
                # No graceful stop: that would go on writing while another process owns the database.
                log.critical("stopping: %s", exc)
                logging.shutdown()
                os._exit(3)
            except (*CONNECTION_ERRORS, asyncpg.PostgresError, asyncpg.exceptions.InternalClientError) as exc:
                log.debug("database not reachable yet to take ownership again: %s", why(exc))

    async def _refusal(self, con: asyncpg.Connection) -> str:
        holders = await con.fetch(_HOLDERS_SQL, OWNER_LOCK)
        named = "; ".join(_describe(h) for h in holders) or "a process that has just exited"
        if self.shared:
            return (f"another coordinator serves this database alone ({named}); restart it with --cluster, or "
                    f"stop it, before starting a cluster member")
        if any(h["mode"] == "ShareLock" for h in holders):
            return (f"coordinator cluster members serve this database ({named}); start this process with "
                    f"--cluster to join them")
        return (f"another coordinator already serves this database ({named}); stop it first, or start every "
                f"process with --cluster to share the database")


def _describe(h: asyncpg.Record) -> str:
    name = h["application_name"] or ""
    pid, _, host = name.removeprefix("coordinator-").partition("@")
    since = h["backend_start"].strftime("%Y-%m-%d %H:%M:%S %Z") if h["backend_start"] else "?"
    return f"pid {pid or '?'} on host {host or h['client'] or 'local socket'}, since {since}"

