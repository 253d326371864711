"""The commit feed's readers, beside tests/test_events.py: readers with different grants waiting at once each get
exactly their events as soon as they are committed (one shared read for all of them), a waiting reader's `limit`
and resumption, the grants as the store matches them, events from before migration 015, retention's order,
the bounds on waiting readers without authentication, and the feed's own database connections."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from importlib import resources

import asyncpg
import httpx
import pytest

from api.server import EmbeddedService
from coordinator.auth import Grant, Principal, Privilege, Table, parse_grant
from coordinator.events import securable_key
from coordinator.formats import FORMATS
from coordinator.feed import scope_of
from storage.events import EventLog
from storage.postgres import migrate
from storage.records import EVERYTHING, join_namespace
from tests.conftest import _psql, _with_db
from tests.support import fetch_token, sql, write_auth_file


def securable(fmt: str, catalog: str, namespace: str, name: str):
    """A table's securable as its format declares it: what its events are seen by."""
    return FORMATS.by_name[fmt].securable(catalog, namespace, name)

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
EVENTS = "/api/coordinator/v1/events"
CLIENTS = {
    "admin": ("admin-secret", [("*", ["admin"])]),
    "a-reader": ("a-secret", [("iceberg//a", ["read"])]),
    "t-reader": ("t-secret", [{"table": "iceberg//b/t", "privileges": ["read"]}]),
    "writer-only": ("w-secret", [("iceberg//a", ["write"])]),   # may not read: sees nothing
}


def change(namespace: str, table: str, n: int) -> dict:
    return {"identifier": {"namespace": [namespace], "name": table}, "requirements": [],
            "updates": [{"action": "set-properties", "updates": {"n": str(n)}}]}


@pytest.fixture
def secured(config, tmp_path):
    config.auth_file = write_auth_file(tmp_path / "auth.toml", CLIENTS)
    with EmbeddedService(config) as base:
        tokens = {cid: fetch_token(base, cid, secret) for cid, (secret, _) in CLIENTS.items()}
        admin = httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {tokens['admin']}"})
        for namespace, tables in (("a", ("t", "u")), ("b", ("t", "other")), ("c", ("x",))):
            assert admin.post("/v1/namespaces", json={"namespace": [namespace]}).status_code == 200
            for t in tables:
                r = admin.post(f"/v1/namespaces/{namespace}/tables", json={"name": t, "schema": SCHEMA})
                assert r.status_code == 200, r.text
        yield base, admin, tokens


def long_poll(base: str, bearer: str | None, after: str | None, answers: list, **params) -> threading.Thread:
    """A reader's request (a long-poll with `wait`) in a thread of its own: (seconds, status, body) into `answers`."""
    def run() -> None:
        started = time.monotonic()
        r = httpx.get(base + EVENTS, params={**({"after": after} if after else {}), **params}, timeout=60,
                      headers={"Authorization": f"Bearer {bearer}"} if bearer else {})
        answers.append((time.monotonic() - started, r.status_code, r.json()))
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_readers_with_different_grants_waiting_at_once_each_get_their_own_events_at_once(secured):
    base, admin, tokens = secured
    after = admin.get(EVENTS).json()["next"]
    readers = {"admin": 3, "a-reader": 3, "t-reader": 3}
    answers: dict[str, list] = {cid: [] for cid in readers}
    threads = [long_poll(base, tokens[cid], after, answers[cid], wait=30) for cid, n in readers.items()
               for _ in range(n)]
    nothing: list = []
    threads.append(long_poll(base, tokens["writer-only"], after, nothing, wait=3))
    time.sleep(1.0)   # every reader waiting
    r = admin.post("/v1/transactions/commit", json={"table-changes": [
        change("a", "t", 1), change("b", "t", 1), change("b", "other", 1), change("c", "x", 1)]})
    assert r.status_code == 204, r.text
    for t in threads:
        t.join(60)
    expect = {"admin": ["a.t", "b.other", "b.t", "c.x"], "a-reader": ["a.t"], "t-reader": ["b.t"]}
    for cid, got in answers.items():
        assert len(got) == readers[cid]
        for seconds, status, page in got:
            assert status == 200 and sorted(e["subject"] for e in page["events"]) == expect[cid], (cid, page)
            assert seconds < 10, f"{cid} heard of the commit after {seconds:.1f} s"
        assert len({page["next"] for _, _, page in got}) == 1   # at the same place, whoever waited
    (seconds, status, page), = nothing
    assert status == 200 and page["events"] == [] and seconds >= 2.5, "nothing to see: waits out its time"
    # Each resumes right after what it was given: the next commit, and nothing again.
    assert admin.post("/v1/namespaces/a/tables/u", json=change("a", "u", 2)).status_code == 200
    for cid, want in (("admin", ["a.u"]), ("a-reader", ["a.u"]), ("t-reader", [])):
        page = httpx.get(base + EVENTS, params={"after": answers[cid][0][2]["next"]}, timeout=30,
                         headers={"Authorization": f"Bearer {tokens[cid]}"}).json()
        assert [e["subject"] for e in page["events"]] == want, cid


def test_a_waiting_reader_is_given_at_most_its_limit_and_resumes_right_after(secured):
    base, admin, tokens = secured
    after = admin.get(EVENTS).json()["next"]
    got: list = []
    thread = long_poll(base, tokens["admin"], after, got, wait=30, limit=2, format="iceberg")
    time.sleep(1.0)
    r = admin.post("/v1/transactions/commit", json={"table-changes": [
        change("a", "t", 1), change("a", "u", 1), change("c", "x", 1)]})   # one transaction: three events
    assert r.status_code == 204, r.text
    thread.join(60)
    (_, status, first), = got
    assert status == 200 and len(first["events"]) == 2 and first["next"] == first["events"][-1]["sequence"]
    rest = admin.get(EVENTS, params={"after": first["next"]}).json()
    assert len(rest["events"]) == 1 and rest["events"][0]["sequence"] > first["next"]
    assert len({e["data"]["commit-id"] for e in first["events"] + rest["events"]}) == 1


def principal(*grants: tuple[str, list[str]] | dict) -> Principal:
    specs = [g if isinstance(g, dict) else {"on": g[0], "privileges": g[1]} for g in grants]
    return Principal("p", (), tuple(Grant(parse_grant(s, FORMATS.grants), frozenset(Privilege(p) for p in s["privileges"]))
                                    for s in specs))


def test_the_store_matches_grants_as_the_service_checks_them():
    """The feed's scope (FeedScope, matched in the store's query and in memory) lets through exactly the events
    whose table the principal may read."""
    grants = (("iceberg//sales", ["read"]), {"table": "iceberg//ops/orders", "privileges": ["read"]},
              ("delta/main/default", ["read"]), ("lance/a%2Fb", ["admin"]), ("iceberg//hr", ["write"]),
              ("iceberg//sales/eu", ["read"]))
    p = principal(*grants)
    scope = scope_of(p)
    assert scope.containers == ("delta/main/default/", "iceberg//sales/", "lance/a%2Fb/")   # sales/eu: within
    assert scope.tables == ("iceberg//ops/orders",)
    tables = [("iceberg", "", ("sales",), "t"), ("iceberg", "", ("sales", "eu"), "t"), ("iceberg", "", ("ops",), "orders"),
              ("iceberg", "", ("ops", "orders"), "t"),    # a namespace named like the granted table: not it
              ("iceberg", "", ("salesx",), "t"), ("iceberg", "p", ("sales",), "t"), ("iceberg", "", ("hr",), "t"),
              ("delta", "main", ("default",), "t"), ("delta", "main", ("other",), "t"),
              ("lance", "", ("a/b",), "t"), ("lance", "", ("a", "b"), "t"), ("lance", "", ("a/b", "c"), "t")]
    for fmt, catalog, levels, name in tables:
        path = securable(fmt, catalog, join_namespace(levels), name)
        assert scope.sees(securable_key(path)) == p.may(Privilege.READ, path), path
    assert scope_of(principal(("*", ["read"]))) == EVERYTHING and scope_of(None) == EVERYTHING
    assert scope_of(principal(("*", ["write"]))).nothing and scope_of(principal()).nothing
    assert isinstance(securable("lance", "", "", "t")[-1], Table)


def test_events_from_before_the_securable_column_get_the_key_the_service_gives(pg_admin_dsn):
    """Migration 015 gives the events already in the feed the key `coordinator.events` gives new ones."""
    cases = [("iceberg", "", ("db",), "t"), ("iceberg", "pre/fix", ("a%b", "c/d"), "t.1"),
             ("delta", "main", ("default",), "orders"), ("lance", "", ("x", "y/z"), "v"), ("lance", "", (), "top")]

    async def run(dsn: str) -> list[str]:
        con = await asyncpg.connect(dsn)
        try:
            await con.execute("CREATE TABLE schema_migrations (version int PRIMARY KEY, name text NOT NULL,"
                              " applied_at timestamptz NOT NULL DEFAULT now())")
            for f in sorted(f for f in resources.files("storage.migrations").iterdir() if f.name.endswith(".sql")):
                if int(f.name.split("_")[0]) < 15:
                    await con.execute(f.read_text())
                    await con.execute("INSERT INTO schema_migrations VALUES ($1, $2)", int(f.name.split("_")[0]),
                                      f.name)
            for seq, (fmt, catalog, levels, name) in enumerate(cases, 1):
                parts = [*([catalog] if catalog else []), *levels, name]
                await con.execute("INSERT INTO events (seq, id, table_id, type, subject, catalog, data)"
                                  " VALUES ($1, $2, $2, $3, $4, $5, $6::jsonb)", seq, uuid.uuid4(),
                                  f"{fmt}.table.committed", ".".join(parts), catalog,
                                  json.dumps({"name": parts}))
            await migrate(con)
            return [r["securable"] for r in await con.fetch("SELECT securable FROM events ORDER BY seq")]
        finally:
            await con.close()

    name = "m_" + uuid.uuid4().hex[:12]
    _psql(pg_admin_dsn, f"CREATE DATABASE {name}")
    try:
        keys = asyncio.run(run(_with_db(pg_admin_dsn, name)))
    finally:
        _psql(pg_admin_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    assert keys == [securable_key(securable(f, c, join_namespace(levels), n)) for f, c, levels, n in cases]


def test_retention_orders_positions_as_numbers(database_url):
    """Transaction ids of different lengths (9 and 10): the oldest by age is deleted and no younger one, the
    newest by count are kept (a bound found in the text of the ids, "10" < "9", deleted young events)."""
    for xid, age_s in ((8, 7200), (9, 0), (10, 0)):
        sql(database_url, "INSERT INTO events (xid, seq, id, table_id, type, subject, catalog, securable, data, time)"
                          " VALUES ($1::text::xid8, 1, $2, $2, 'iceberg.table.committed', 'db.t', '', 'iceberg//db/t',"
                          " '{}', now() - make_interval(secs => $3))", str(xid), uuid.uuid4(), float(age_s))

    async def prune(max_age_s: float, max_count: int) -> list[int]:
        con = await asyncpg.connect(database_url)
        try:
            await EventLog._prune_batch(con, max_age_s, max_count)
            return [int(r[0]) for r in await con.fetch("SELECT e.xid::text FROM events e ORDER BY e.xid")]
        finally:
            await con.close()
    assert asyncio.run(prune(3600, 1000)) == [9, 10]
    assert asyncio.run(prune(3600, 1)) == [10]


def test_long_polls_beyond_the_bounds_are_refused_with_retry_after_and_pages_never_are(config):
    """Without authentication every reader is one client: its long-polls past `feed_waiters_per_client` get 429
    at once, in the service's error format, with Retry-After; a page without `wait` is served all the same."""
    config.feed_waiters_per_client, config.feed_waiters_max = 3, 10
    with EmbeddedService(config) as base:
        after = httpx.get(base + EVENTS).json()["next"]
        answers: list = []
        threads = [long_poll(base, None, after, answers, wait=3) for _ in range(3)]
        time.sleep(1.0)
        r = httpx.get(base + EVENTS, params={"after": after, "wait": 3}, timeout=30)
        assert r.status_code == 429 and r.headers["Retry-After"] == "1", r.text
        error = r.json()["error"]
        assert error["code"] == 429 and error["type"] == "TooManyRequests" and "feed_waiters_per_client" in error["message"]
        assert httpx.get(base + EVENTS, params={"after": after}).json() == {"events": [], "next": after}
        for t in threads:
            t.join(30)
        assert [status for _, status, _ in answers] == [200] * 3
        assert httpx.get(base + EVENTS, params={"after": after, "wait": 0.1}, timeout=30).status_code == 200


def test_feed_reads_stuck_on_the_database_leave_commits_their_connections(service, database_url):
    """While every feed read waits on the database (a lock held on the feed's floor row), more feed readers than the
    service has connections do not keep a namespace, a table, a commit or a listing from being served: the feed
    reads on connections of its own."""
    http = httpx.Client(base_url=service, timeout=30)
    answers: list = []

    async def hold(seconds: float) -> None:
        con = await asyncpg.connect(database_url)
        try:
            async with con.transaction():
                await con.execute("LOCK TABLE events_floor IN ACCESS EXCLUSIVE MODE")
                held.set()
                await asyncio.sleep(seconds)
        finally:
            await con.close()
    held = threading.Event()
    holder = threading.Thread(target=asyncio.run, args=(hold(5.0),))
    holder.start()
    assert held.wait(10)
    readers = [long_poll(service, None, None, answers) for _ in range(10)]
    time.sleep(0.5)   # every reader waiting for the lock
    started = time.monotonic()
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    assert http.post("/v1/namespaces/db/tables/t", json=change("db", "t", 1)).status_code == 200
    assert [t["name"] for t in http.get("/v1/namespaces/db/tables").json()["identifiers"]] == ["t"]
    served = time.monotonic() - started
    holder.join(30)
    for t in readers:
        t.join(30)
    assert served < 3, f"served only after {served:.1f} s, once the feed's reads let go"
    assert [status for _, status, _ in answers] == [200] * 10


def test_readers_following_by_long_polls_while_commits_land_get_each_event_once_in_order(secured):
    """Readers that keep up are answered from what the shared reads brought: with commits landing all the while
    (single tables and transactions across several), each follower, whatever its page size and grants, gets every
    event it may see exactly once, in feed order."""
    base, admin, tokens = secured
    start = admin.get(EVENTS).json()["next"]
    stop = threading.Event()
    followers = [("admin", 1), ("admin", 3), ("admin", 100), ("a-reader", 1), ("a-reader", 100), ("t-reader", 2)]
    seen: list[list[dict]] = [[] for _ in followers]

    def follow(i: int, cid: str, limit: int) -> None:
        http = httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {tokens[cid]}"})
        after, quiet = start, 0
        while quiet < 2:   # after the writers stopped: until two empty answers in a row
            finishing = stop.is_set()
            page = http.get(EVENTS, params={"after": after, "limit": limit, "wait": 0.5 if finishing else 5}).json()
            seen[i].extend(page["events"])
            after = page["next"]
            quiet = quiet + 1 if finishing and not page["events"] else 0

    def write(n: int) -> None:
        for i in range(n):
            if i % 3 == 0:
                r = admin.post("/v1/transactions/commit", json={"table-changes": [
                    change("a", "t", i), change("b", "t", i), change("c", "x", i)]})
                assert r.status_code == 204, r.text
            else:
                namespace, table = (("a", "u"), ("b", "other"))[i % 2]
                assert admin.post(f"/v1/namespaces/{namespace}/tables/{table}",
                                  json=change(namespace, table, i)).status_code == 200

    threads = [threading.Thread(target=follow, args=(i, cid, limit)) for i, (cid, limit) in enumerate(followers)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    write(60)
    stop.set()
    for t in threads:
        t.join(120)
    everything = httpx.get(base + EVENTS, params={"after": start, "limit": 1000}, timeout=30,
                           headers={"Authorization": f"Bearer {tokens['admin']}"}).json()["events"]
    assert len(everything) == 20 * 3 + 40
    for (cid, limit), got in zip(followers, seen):
        want = [e for e in everything if cid == "admin" or (cid == "a-reader" and e["subject"].startswith("a."))
                or (cid == "t-reader" and e["subject"] == "b.t")]
        assert [e["sequence"] for e in got] == [e["sequence"] for e in want], (cid, limit)
