"""A server's connections (api/transport.py's `TCPServer`): each one's idle timer, and the maximum open at once."""

from __future__ import annotations

import logging
import math
import time

import hypercorn.trio.tcp_server
import trio

log = logging.getLogger(__name__)


def peer_address(stream) -> str:
    """The address (host) a connection comes from, "" if it is not known (any more)."""
    try:
        peer = stream.socket.getpeername()
    except (AttributeError, OSError):   # (not a plain socket stream; or reset already)
        return ""
    return peer[0] if isinstance(peer, tuple) else str(peer)


class KeepAliveTimer:
    """Stands in for hypercorn's `TrioSingleTask` as a connection's idle timer (`restart` when the connection goes
    idle, `stop` when a request arrives) with one long-lived task instead of one per request. The connection is
    closed when it has been idle for `keep_alive_timeout`, when `ConnectionLimit` makes room with it (`expire`), or
    is idle when the server begins to shut down; a connection that is mid-request then is closed by hypercorn
    itself after its response. It tells the connection limit when the connection is idle and when it is busy.
    Under a limit, it also waits for the connection's first bytes before hypercorn sets the connection up
    (`first_bytes`)."""

    def __init__(self, server: hypercorn.trio.tcp_server.TCPServer) -> None:   # (api/transport.py's)
        self.server = server
        self.limit: ConnectionLimit | None = getattr(server.config, "connections", None)
        self.address = peer_address(server.stream)
        self.holder: Holder | None = None   # (the limit's record of the address, once admitted)
        self.scope: trio.CancelScope | None = None
        self.opened_at = trio.current_time()
        self.idle = False
        self.served = False     # a request has arrived on the connection
        self.waiting = False    # for the connection's first bytes (`first_bytes`)
        self.expired = False
        self.closed = False

    async def first_bytes(self, stream: trio.SocketStream) -> bool:
        """Wait for the connection's first bytes (or its end) before hypercorn sets up its protocol, so that a
        connection that never sends anything costs this one task and its socket, and nothing else, to hold and to
        close. Whether they came: not if the header deadline (`keep_alive_timeout` from the connect) passed, the
        connection was closed to make room (`expire`), or the server began to shut down."""
        assert self.limit is not None
        terminated = self.server.context.terminated
        self.limit.idle(self)
        self.limit.start_watching(terminated)
        self.waiting = True
        self.scope = scope = trio.CancelScope(deadline=self.opened_at + self.server.config.keep_alive_timeout)
        with scope:
            if not terminated.is_set():
                await trio.lowlevel.wait_readable(stream.socket)
        self.waiting, self.scope = False, None
        # (Closed to make room, or shut down, just as the bytes came: the bytes came too late.)
        return not (scope.cancelled_caught or self.expired or terminated.is_set())

    def shut(self) -> None:
        """The server begins to shut down: a connection still waiting for its first bytes is closed now."""
        if self.waiting and self.scope is not None:
            self.scope.cancel()

    async def restart(self, task_group, action) -> None:  # signature of TrioSingleTask.restart; `action` unused
        self.idle = True
        if self.limit is not None:
            self.limit.idle(self)
        # Until the first request, the deadline runs from the connect (it is also the first request's header deadline).
        since = trio.current_time() if self.served else self.opened_at
        deadline = since + self.server.config.keep_alive_timeout
        if self.scope is None:
            self.scope = trio.CancelScope(deadline=deadline)
            if self.expired:   # (closed to make room as its first bytes came)
                self.scope.cancel()
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


class Holder:
    """One source address's connections (`ConnectionLimit`): how many are open, and its idle ones in order."""

    __slots__ = ("address", "open", "fresh", "idle")

    def __init__(self, address: str) -> None:
        self.address = address
        self.open = 0
        self.fresh: dict[KeepAliveTimer, None] = {}
        self.idle: dict[KeepAliveTimer, None] = {}

    def first_idle(self) -> KeepAliveTimer | None:
        return next(iter(self.fresh), None) or next(iter(self.idle), None)


class ConnectionLimit:
    """At most `maximum` connections open at once (api/server.py sets it below the process's descriptor limit, so
    that a flood of connections cannot take the descriptors the database, files and the cluster need).

    A connection past the maximum takes the place of an idle one, which is closed: first one that has never sent a
    request (the cheapest thing to hold open, and what a flood is made of), then the one idle longest. An idle
    connection costs its client nothing but a reconnect, and a client in the middle of a request keeps its
    connection. If every connection is busy, the new one is closed at once. Either way it is counted
    (`coordinator_http_connections_closed_at_limit_total`), and a warning says so (at most one every
    LOG_EVERY_S).

    One source address may hold every connection while no one else needs them (a proxy in front of the service
    does), but not against others: past the maximum, an address holding more than its `share` (half the maximum)
    gives up its own idle connections first, for its own new connections and for everyone else's. So a flood from
    one host makes room with its own connections, never with those of clients on other hosts."""

    LOG_EVERY_S = 10.0

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.share = max(1, maximum // 2)
        self.open: set[KeepAliveTimer] = set()
        self._fresh: dict[KeepAliveTimer, None] = {}   # idle, never sent a request: oldest first
        self._idle: dict[KeepAliveTimer, None] = {}    # idle between requests: idle longest first
        self._holders: dict[str, Holder] = {}          # by source address, those with a connection open
        self._over: dict[Holder, None] = {}            # the one holding more than `share`, if any
        self.closed_at_limit = 0
        self._logged_at = -math.inf
        self._unlogged = 0
        self._watching = False

    def start_watching(self, terminated) -> None:
        """Once per server (from its first connection, in the server's nursery of connections): at shutdown, close
        the connections that never sent anything (`KeepAliveTimer.first_bytes`: they have no timer of their own)."""
        if not self._watching:
            self._watching = True
            trio.lowlevel.current_task().parent_nursery.start_soon(self._shut_at, terminated)

    async def _shut_at(self, terminated) -> None:
        await terminated.wait()
        for connection in list(self._fresh):
            connection.shut()

    def admit(self, connection: KeepAliveTimer) -> bool:
        """Whether the new `connection` may stay open (an idle one was closed for it, if need be)."""
        holder = self._holders.get(connection.address)
        if holder is None:
            holder = self._holders[connection.address] = Holder(connection.address)
        if len(self.open) >= self.maximum:
            victim = self._victim(holder)
            self._count(refused=victim is None)
            if victim is None:
                if not holder.open:
                    del self._holders[holder.address]
                return False
            self.leave(victim)
            victim.expire()
        connection.holder = holder
        self.open.add(connection)
        holder.open += 1
        if holder.open > self.share:
            self._over[holder] = None
        return True

    def _victim(self, newcomer: Holder) -> KeepAliveTimer | None:
        """The idle connection that makes room for one of `newcomer`'s: its own if it holds its share (none if none
        of its own is idle), else one of an address over its share, else the first of all (one that never sent a
        request, then the one idle longest)."""
        if newcomer.open >= self.share:
            return newcomer.first_idle()
        for holder in self._over:
            if (victim := holder.first_idle()) is not None:
                return victim
        return next(iter(self._fresh), None) or next(iter(self._idle), None)

    def idle(self, connection: KeepAliveTimer) -> None:
        if connection in self.open:
            self.busy(connection)
            holder = connection.holder
            if connection.served:
                self._idle[connection] = holder.idle[connection] = None
            else:
                self._fresh[connection] = holder.fresh[connection] = None

    def busy(self, connection: KeepAliveTimer) -> None:
        self._fresh.pop(connection, None)
        self._idle.pop(connection, None)
        if (holder := connection.holder) is not None:
            holder.fresh.pop(connection, None)
            holder.idle.pop(connection, None)

    def leave(self, connection: KeepAliveTimer) -> None:
        if connection not in self.open:
            return
        self.busy(connection)
        self.open.discard(connection)
        holder = connection.holder
        holder.open -= 1
        if holder.open <= self.share:
            self._over.pop(holder, None)
        if not holder.open:
            del self._holders[holder.address]

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
