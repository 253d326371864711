"""What the group-commit writer answers when the database connection fails around a write, with asyncpg's real
errors against a real server (a proxy in between makes the fault happen at the chosen moment): a write that
provably never left is "nothing applied", and one whose reply was lost is read back from the row, never guessed."""

from __future__ import annotations

import time
from uuid import uuid4

import pytest
import trio

from storage.errors import OutcomeLost, StoreUnavailable
from storage.postgres import APPLICATION_NAME, PostgresStore
from storage.records import TableRow, TableWrite, WriteGroup
from tests.support import sql
from tests.tcp_proxy import TcpProxy


@pytest.fixture
def proxied_store(database_url):
    """A store (one pooled connection) reaching the test's database through a TcpProxy."""
    proxy, proxied_url = TcpProxy.for_database(database_url)
    store = PostgresStore(proxied_url, pool_size=1, timeout_s=10)
    store.open()
    try:
        yield store, proxy
    finally:
        store.close()
        proxy.close()


def write(store: PostgresStore, group: WriteGroup):
    async def submit():
        return await store.writer.submit(group)
    return store.thread.run_blocking(submit, timeout=60)


def new_table(store: PostgresStore):
    table_id = uuid4()
    row = TableRow(table_id=table_id, realm="iceberg", catalog="", namespace="", name=f"t{table_id.hex[:8]}",
                   format="iceberg", location=None)
    assert write(store, WriteGroup([TableWrite(table_id, 0, 0, state={}, insert=row)])).applied
    return table_id


def bump(table_id, at: int) -> WriteGroup:
    return WriteGroup([TableWrite(table_id, at, 0, state={"at": at})])


def row_version(database_url: str, table_id) -> int:
    return sql(database_url, "SELECT row_version FROM tables WHERE table_id = $1", table_id)[0]["row_version"]


def test_a_write_on_a_connection_the_server_already_ended_is_known_not_applied(proxied_store, database_url):
    store, proxy = proxied_store
    table_id = new_table(store)
    assert write(store, bump(table_id, 1)).applied   # the statement is prepared: the next write only executes it
    # The server ends the idle pooled session (as when the postmaster dies): its FATAL reaches asyncpg, the close
    # does not yet. asyncpg then refuses the next statement without sending it.
    proxy.hold_close = True
    pids = sql(database_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1"
                             " AND pid <> pg_backend_pid()", APPLICATION_NAME)
    assert pids, "the store's session was not found"
    time.sleep(0.5)
    with pytest.raises(StoreUnavailable) as refused:
        write(store, bump(table_id, 2))
    assert "cannot switch" in str(refused.value), refused.value   # asyncpg's InternalClientError, seen as unsent
    assert row_version(database_url, table_id) == 2
    proxy.hold_close = False
    assert write(store, bump(table_id, 2)).applied   # and the writer goes on with a fresh connection
    assert row_version(database_url, table_id) == 3


def test_a_write_whose_reply_was_lost_is_answered_from_its_row(proxied_store, database_url):
    store, proxy = proxied_store
    table_id = new_table(store)
    assert write(store, bump(table_id, 1)).applied
    proxy.cut_next = True   # the write reaches the server and commits; its reply never comes back
    result = write(store, bump(table_id, 2))
    assert proxy.cuts == 1
    assert row_version(database_url, table_id) == 3
    assert result.applied, result   # not "nothing applied": it did apply


def test_a_namespace_change_whose_connection_died_after_sending_is_not_told_nothing_applied(proxied_store):
    store, proxy = proxied_store
    trio.run(store.ping)
    proxy.cut_next = True   # the change's first statement reaches the server, no reply comes back
    with pytest.raises(OutcomeLost):
        trio.run(lambda: store.create_namespace("iceberg", "", "db", {}))
    assert proxy.cuts == 1
    trio.run(lambda: store.create_namespace("iceberg", "", "db2", {}))   # a fresh connection serves again
