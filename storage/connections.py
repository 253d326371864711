"""Connections to PostgreSQL: how each session is set up, and which errors mean the connection is gone."""

from __future__ import annotations

import asyncio
import os
import socket
from importlib import resources
from typing import Any

import asyncpg
import orjson

from .libraries import require

# Each process's sessions say whose they are (pg_stat_activity): an embedded database is stopped on a graceful exit
# only when no other process's sessions use it (storage/embedded.py).
# The host too, so that a process refused a database it does not own can name its owner (storage/owner.py); at most
# 63 bytes, PostgreSQL's limit.
APPLICATION_NAME = f"coordinator-{os.getpid()}@{socket.gethostname()}"[:63]
# Errors that mean "the connection is gone": the statement may or may not have reached the server.
CONNECTION_ERRORS = (OSError, ConnectionError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError,
                     asyncio.TimeoutError, asyncpg.exceptions.CannotConnectNowError,
                     asyncpg.exceptions.AdminShutdownError)


# asyncpg raises these before it writes an operation's first message: the server never saw the operation.
#  - InterfaceError: the connection was already closed, or busy (its checks before every operation);
#  - InternalClientError from its protocol's state switch or connected check, worded as matched below. A server's
#    FATAL (postmaster killed, backend terminated) that arrives while the connection is idle leaves the protocol
#    in an error state until the socket's close is read; the next operation then fails this way, unsent.
# Any other InternalClientError (say, a reply it could not parse) may come after the server ran the statement.
_UNSENT_INTERNAL = ("cannot switch to ", "not connected")


def unsent_texts_missing(source: str | None = None) -> list[str]:
    """The texts `sent_nothing` reads that asyncpg's protocol (`source`: its coreproto.pyx, which asyncpg's
    wheels ship beside the compiled module) no longer raises: a release that rewords them would turn "never sent"
    into "outcome unknown" (5xx) for every commit that meets a dead connection."""
    if source is None:
        try:
            source = resources.files("asyncpg.protocol").joinpath("coreproto.pyx").read_text()
        except OSError:
            return ["asyncpg/protocol/coreproto.pyx (the source its error texts are read from)"]
    return [f"the error text {text!r}" for text in _UNSENT_INTERNAL if f"'{text}" not in source]


require("asyncpg", "storage/connections.py (which errors say a statement was never sent)", unsent_texts_missing())


def sent_nothing(exc: BaseException) -> bool:
    """Whether `exc` proves that the operation that raised it was never sent to the server."""
    if isinstance(exc, asyncpg.InterfaceError):
        return True
    return isinstance(exc, asyncpg.exceptions.InternalClientError) and str(exc).startswith(_UNSENT_INTERNAL)


def server_refused(exc: BaseException) -> bool:
    """Whether `exc` is the server's error reply to the statement, with the session still alive: the statement (or
    its transaction) failed and nothing of it applied. A FATAL that ends the session (an operator's or a crash's
    shutdown, a lost connection) is not one: the server may have committed before it came."""
    return (isinstance(exc, asyncpg.PostgresError)
            and not isinstance(exc, (asyncpg.PostgresConnectionError, asyncpg.exceptions.OperatorInterventionError)))


def why(exc: BaseException) -> str:
    """An error's text for a message: a timeout's is empty, so its type stands in."""
    return str(exc) or type(exc).__name__


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def connection_setup(idle_in_transaction_s: float):
    async def init(con: asyncpg.Connection) -> None:
        await con.set_type_codec("jsonb", encoder=_dumps, decoder=orjson.loads, schema="pg_catalog")
        # A process frozen (SIGSTOP, a stalled VM) in the middle of a transaction keeps its row locks, among them
        # shard-lease rows FOR SHARE: every member's lease renewal then waits on it, and the whole cluster stops
        # committing for as long as it stays frozen. The server ends such a session after this long instead (its
        # transaction rolls back: nothing it was writing applies). Our own transactions are never idle that long.
        await con.execute(f"SET idle_in_transaction_session_timeout = {int(idle_in_transaction_s * 1000)}")
    return init


def pool_options(timeout_s: float) -> dict[str, Any]:
    """How every pool of the store sets up its connections (`asyncpg.create_pool` keywords)."""
    return dict(init=connection_setup(timeout_s), reset=keep_session, command_timeout=timeout_s,
                # each new connection, over every host of a multi-host URL: a host that drops packets must not hold
                # a failover for asyncpg's default minute
                timeout=timeout_s, server_settings={"application_name": APPLICATION_NAME})


async def keep_session(con: asyncpg.Connection) -> None:
    """Pool release hook in place of asyncpg's default reset query (advisory unlock, CLOSE ALL, UNLISTEN, RESET ALL):
    that was one more database round trip per group-commit flush, ~a third of the writer thread's CPU at moderate
    load. Nothing here leaves session state behind: no LISTEN, cursors or session advisory locks (only
    pg_advisory_xact_lock), and the one SET, at connect, is meant to stay. asyncpg still rolls back a transaction
    left open before calling this."""
