"""A server's connections (api/transport.py's `TCPServer`): each one's idle timer, and the maximum open at once."""

from __future__ import annotations

import logging
import math
import time

import hypercorn.trio.tcp_server
import trio

log = logging.getLogger(__name__)


class KeepAliveTimer:
    """Stands in for hypercorn's `TrioSingleTask` as a connection's idle timer (`restart` when the connection goes
    idle, `stop` when a request arrives) with one long-lived task instead of one per request. The connection is
    closed when it has been idle for `keep_alive_timeout`, when `ConnectionLimit` makes room with it (`expire`), or
    is idle when the server begins to shut down; a connection that is mid-request then is closed by hypercorn
    itself after its response. It tells the connection limit when the connection is idle and when it is busy."""

    def __init__(self, server: hypercorn.trio.tcp_server.TCPServer) -> None:   # (api/transport.py's)
        self.server = server
        self.limit: ConnectionLimit | None = getattr(server.config, "connections", None)
        self.scope: trio.CancelScope | None = None
        self.idle = False
        self.served = False     # a request has arrived on the connection
        self.expired = False
        self.closed = False

    async def restart(self, task_group, action) -> None:  # signature of TrioSingleTask.restart; `action` unused
        self.idle = True
        if self.limit is not None:
            self.limit.idle(self)
        deadline = trio.current_time() + self.server.config.keep_alive_timeout
        if self.scope is None:
            self.scope = trio.CancelScope(deadline=deadline)
            task_group._nursery.start_soon(self._watch)
        else:
            self.scope.deadline = deadline

    async def stop(self) -> None:
        self.idle = False
        self.served = True
        if self.limit is not None:
            self.limit.busy(self)
        if self.scope is not None:
            self.scope.deadline = math.inf

    def expire(self) -> None:
        """Close the (idle) connection now, as if its deadline had passed."""
        self.expired = True
        if self.scope is not None:
            self.scope.cancel()

    def close(self) -> None:
        """The connection is gone: end the task now rather than at the deadline."""
        self.closed = True
        if self.scope is not None:
            self.scope.cancel()

    async def _watch(self) -> None:
        terminated = self.server.context.terminated
        while True:
            assert self.scope is not None
            with self.scope:
                if terminated.is_set():
                    await trio.sleep_forever()  # only the deadline or close() can end the wait now
                await terminated.wait()
            if self.closed:
                return
            if self.idle or self.expired:
                break
            # A request arrived as the deadline passed, or the server began to shut down mid-request: wait on.
            self.scope = trio.CancelScope(deadline=math.inf)
        with trio.CancelScope(shield=True):
            await self.server._initiate_server_close()


class ConnectionLimit:
    """At most `maximum` connections open at once (api/server.py sets it below the process's descriptor limit, so
    that a flood of connections cannot take the descriptors the database, files and the cluster need).

    A connection past the maximum takes the place of an idle one, which is closed: first one that has never sent a
    request (the cheapest thing to hold open, and what a flood is made of), then the one idle longest. An idle
    connection costs its client nothing but a reconnect, and a client in the middle of a request keeps its
    connection. If every connection is busy, the new one is closed at once. Either way it is counted
    (`coordinator_http_connections_closed_at_limit_total`), and a warning says so (at most one every
    LOG_EVERY_S)."""

    LOG_EVERY_S = 10.0

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.open: set[KeepAliveTimer] = set()
        self._fresh: dict[KeepAliveTimer, None] = {}   # idle, never sent a request: oldest first
        self._idle: dict[KeepAliveTimer, None] = {}    # idle between requests: idle longest first
        self.closed_at_limit = 0
        self._logged_at = -math.inf
        self._unlogged = 0

    def admit(self, connection: KeepAliveTimer) -> bool:
        """Whether the new `connection` may stay open (an idle one was closed for it, if need be)."""
        if len(self.open) >= self.maximum:
            victim = next(iter(self._fresh), None) or next(iter(self._idle), None)
            self._count(refused=victim is None)
            if victim is None:
                return False
            self.leave(victim)
            victim.expire()
        self.open.add(connection)
        return True

    def idle(self, connection: KeepAliveTimer) -> None:
        if connection in self.open:
            self.busy(connection)
            (self._idle if connection.served else self._fresh)[connection] = None

    def busy(self, connection: KeepAliveTimer) -> None:
        self._fresh.pop(connection, None)
        self._idle.pop(connection, None)

    def leave(self, connection: KeepAliveTimer) -> None:
        self.open.discard(connection)
        self.busy(connection)

    def _count(self, refused: bool) -> None:
        self.closed_at_limit += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= self.LOG_EVERY_S:
            log.warning("%d connections open, the most allowed (http_max_connections): %d connections closed to "
                        "make room for new ones (idle ones first%s); if clients need more, raise "
                        "--http-max-connections, and the descriptor limit (ulimit -n) with it",
                        self.maximum, self._unlogged, "; every one was busy, so the newest was closed" if refused
                        else "")
            self._logged_at, self._unlogged = now, 0
