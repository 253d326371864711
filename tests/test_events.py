"""The commit feed (`GET /api/coordinator/v1/events`, docs/events.md): every acknowledged commit of every format
appears once, in order, with its version and type; a refused one nowhere; a reader resumes exactly, after a
restart too; a long-poll answers once a commit lands; retention answers 410; a partly granted client sees only
its tables; the client helpers (`coordinator.client.events`, `wait_for`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict

import asyncpg
import httpx
import lance
import lance_namespace
import pyarrow as pa
import pytest
from lance_namespace import CreateNamespaceRequest
from pyiceberg.catalog import load_catalog

from api.server import EmbeddedService
from coordinator.client import CommitRefused, FeedError, commit, events, wait_for
from storage.events import EventLog
from tests.delta.conftest import UC
from tests.support import ServerProcess, fetch_token, write_auth_file
from tests.test_cross_format_commit import parts, tables  # noqa: F401 - fixture: one table of each format
from tests.test_iceberg_views import version as view_version

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
EVENTS = "/api/coordinator/v1/events"


def everything(base: str, **params) -> list[dict]:
    return list(events(base, follow=False, limit=1000, **params))


def by_table(feed: list[dict]) -> dict[str, list[tuple[str, int]]]:
    """table id -> [(type, version), ...] in feed order."""
    out = defaultdict(list)
    for e in feed:
        out[e["data"]["table-id"]].append((e["type"], e["data"]["version"]))
    return out


def test_every_acknowledged_commit_of_every_format_appears_once_and_a_refused_one_nowhere(service):
    http = httpx.Client(base_url=service, timeout=30)
    # Iceberg, through pyiceberg: create, two appends, a rename, a drop; a commit refused with 409.
    catalog = load_catalog("c", type="rest", uri=service)
    catalog.create_namespace("ev")
    table = catalog.create_table("ev.t", schema=pa.schema([("id", pa.int64())]))
    iceberg_id = str(table.metadata.table_uuid)
    table.append(pa.table({"id": [1]}))
    table.append(pa.table({"id": [2]}))
    stale = http.post("/v1/namespaces/ev/tables/t", json={
        "requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": 1}],
        "updates": [{"action": "set-properties", "updates": {"refused": "1"}}]})
    assert stale.status_code == 409, stale.text
    snapshot = catalog.load_table("ev.t").metadata.current_snapshot_id
    catalog.rename_table("ev.t", "ev.u")
    catalog.drop_table("ev.u")
    # An Iceberg view: create, replace, drop.
    r = http.post("/v1/namespaces/ev/views", json={"name": "v", "schema": SCHEMA, "view-version": view_version("select 1"),
                                                    "properties": {}})
    assert r.status_code == 200, r.text
    view_id = r.json()["metadata"]["view-uuid"]
    replaced = {**view_version("select 2"), "version-id": 2}
    r = http.post("/v1/namespaces/ev/views/v", json={"requirements": [], "updates": [
        {"action": "add-view-version", "view-version": replaced}, {"action": "set-current-view-version", "view-version-id": -1}]})
    assert r.status_code == 200, r.text
    assert http.delete("/v1/namespaces/ev/views/v").status_code == 204
    # Delta, through Unity Catalog's API: a managed table, two commits, one refused (version taken), a drop.
    uc = UC(service)
    orders = uc.create_managed("orders")
    for v in (1, 2):
        assert uc.commit(orders, v).status_code == 200
    assert uc.commit(orders, 2).status_code == 409
    assert uc.http.delete("/tables/main.default.orders").status_code == 200
    uc.http.close()
    # Lance, through pylance: a table created with its first version, then an append.
    ns = lance_namespace.connect("rest", {"uri": service})
    ns.create_namespace(CreateNamespaceRequest(id=["vec"]))
    data = pa.table({"id": [1, 2]})
    lance.write_dataset(data, namespace_client=ns, table_id=["vec", "items"], mode="create")
    items = lance.write_dataset(data, namespace_client=ns, table_id=["vec", "items"], mode="append")
    lance_id = None

    feed = everything(service)
    assert len({e["id"] for e in feed}) == len(feed) and len({e["sequence"] for e in feed}) == len(feed)
    assert [e["sequence"] for e in feed] == sorted(e["sequence"] for e in feed)
    for e in feed:
        assert e["specversion"] == "1.0" and e["source"] and e["time"] and e["id"][14] == "7"   # a UUIDv7
        assert e["subject"] == ".".join(e["data"]["name"])
        if e["subject"] == "vec.items":
            lance_id = e["data"]["table-id"]
    tables_ = by_table(feed)
    assert tables_[iceberg_id] == [("iceberg.table.created", 0), ("iceberg.table.committed", 1),
                                   ("iceberg.table.committed", 2), ("iceberg.table.renamed", 2),
                                   ("iceberg.table.dropped", 2)]
    assert tables_[view_id] == [("iceberg.view.created", 0), ("iceberg.view.committed", 1),
                                ("iceberg.view.dropped", 1)]
    assert tables_[orders["table_id"]] == [("delta.table.created", 0), ("delta.table.committed", 1),
                                           ("delta.table.committed", 2), ("delta.table.dropped", 2)]
    assert tables_[lance_id][-1] == ("lance.table.committed", items.version)
    assert [v for t, v in tables_[lance_id] if t == "lance.table.committed"] == list(range(1, items.version + 1))
    assert tables_[lance_id][0][0] == "lance.table.created"
    assert len(tables_) == 4
    # What each format adds.
    iceberg = [e["data"] for e in feed if e["data"]["table-id"] == iceberg_id]
    assert iceberg[2]["snapshot-id"] == snapshot and iceberg[2]["metadata-location"].endswith(".metadata.json")
    assert "snapshot-id" not in iceberg[0] and iceberg[3]["previous-name"] == ["ev", "t"]
    assert [e["subject"] for e in feed if e["data"]["table-id"] == iceberg_id] == ["ev.t"] * 3 + ["ev.u"] * 2
    delta = [e["data"] for e in feed if e["data"]["table-id"] == orders["table_id"]]
    assert "/_delta_log/_staged_commits/00000000000000000001." in delta[1]["commit-file"]
    assert all(e["data"]["manifest"].endswith(".manifest") for e in feed
               if e["data"]["table-id"] == lance_id and e["type"] == "lance.table.committed")
    assert not any("refused" in str(e) for e in feed)


def test_the_events_of_one_commit_across_formats_share_its_commit_id(service, tables):
    before = everything(service)
    body, _ = parts(tables)
    commit(service, body)
    new = everything(service, after=before[-1]["sequence"])
    assert sorted(e["type"] for e in new) == ["delta.table.committed", "iceberg.table.committed",
                                              "lance.table.committed"]
    assert len({e["data"]["commit-id"] for e in new}) == 1
    assert len({e["data"]["commit-id"] for e in before}) == len(before)   # creations: one commit each
    # A cross-format commit refused (the Delta version is taken now) leaves nothing.
    body, _ = parts(tables, iceberg_parent=1001, delta_version=1, lance_version=2)
    with pytest.raises(CommitRefused):
        commit(service, body)
    assert everything(service, after=new[-1]["sequence"]) == []


def test_filters_by_format_and_table(service, tables):
    commit(service, parts(tables)[0])
    assert {e["type"] for e in everything(service, format="delta")} == {"delta.table.created", "delta.table.committed"}
    assert {e["subject"] for e in everything(service, table=["xf.events", "xf.vectors"])} == {"xf.events",
                                                                                                "xf.vectors"}
    assert everything(service, format="lance", table="xf.events") == []


def test_a_reader_resumes_exactly_after_a_restart_of_the_service(database_url, tmp_path):
    server = ServerProcess(database_url, tmp_path)
    server.start()
    try:
        http = httpx.Client(base_url=server.base_url, timeout=30)
        assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
        for name in ("a", "b", "c"):
            assert http.post("/v1/namespaces/db/tables", json={"name": name, "schema": SCHEMA}).status_code == 200
        seen, after = [], None
        for _ in range(2):   # read part of the feed, one event at a time
            page = http.get(EVENTS, params={"limit": 1, **({"after": after} if after else {})}).json()
            seen += page["events"]
            after = page["next"]
        server.stop()
        server.start()
        http = httpx.Client(base_url=server.base_url, timeout=30)
        for i in range(3):
            assert http.post("/v1/namespaces/db/tables/a", json={"requirements": [], "updates": [
                {"action": "set-properties", "updates": {f"k{i}": "v"}}]}).status_code == 200
        seen += everything(server.base_url, after=after)
        assert seen == everything(server.base_url)
        assert [e["data"]["version"] for e in seen if e["subject"] == "db.a"] == [0, 1, 2, 3]
    finally:
        server.stop()


def test_a_long_poll_answers_once_a_commit_lands(service):
    http = httpx.Client(base_url=service, timeout=60)
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    after = http.get(EVENTS).json()["next"]
    answer = {}

    def poll() -> None:
        started = time.monotonic()
        answer["page"] = httpx.get(service + EVENTS, params={"after": after, "wait": 30}, timeout=60).json()
        answer["s"] = time.monotonic() - started

    reader = threading.Thread(target=poll)
    reader.start()
    time.sleep(1.0)
    assert "page" not in answer   # nothing committed yet: still waiting
    assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    reader.join(30)
    assert [e["type"] for e in answer["page"]["events"]] == ["iceberg.table.created"]
    assert answer["s"] < 20   # answered by the commit, not by the end of the wait
    # With nothing committed, a wait ends empty with the same position.
    page = http.get(EVENTS, params={"after": answer["page"]["next"], "wait": 0.2}).json()
    assert page == {"events": [], "next": answer["page"]["next"]}


def test_a_token_older_than_retention_is_410(service, database_url):
    http = httpx.Client(base_url=service, timeout=30)
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    for name in ("a", "b", "c", "d"):
        assert http.post("/v1/namespaces/db/tables", json={"name": name, "schema": SCHEMA}).status_code == 200
    first = http.get(EVENTS, params={"limit": 1}).json()

    async def prune(max_age_s: float, max_count: int) -> int:
        con = await asyncpg.connect(database_url)
        try:
            return await EventLog._prune_batch(con, max_age_s, max_count)
        finally:
            await con.close()
    assert asyncio.run(prune(3600, 2)) == 2   # by count: the newest 2 stay
    r = http.get(EVENTS, params={"after": first["next"]})
    assert r.status_code == 410
    error = r.json()["error"]
    assert error["code"] == 410 and error["type"] == "EventsExpired" and "retention" in error["message"]
    assert [e["subject"] for e in everything(service)] == ["db.c", "db.d"]
    with pytest.raises(FeedError) as gone:
        everything(service, after=first["next"])
    assert gone.value.status == 410
    # By age: every event is older than 0 s. A reader that had read them all resumes without a 410.
    caught_up = http.get(EVENTS, params={"after": http.get(EVENTS).json()["events"][0]["sequence"]}).json()["next"]
    assert asyncio.run(prune(0, 1000)) == 2
    assert everything(service) == [] and http.get(EVENTS, params={"after": caught_up}).status_code == 200


@pytest.mark.parametrize("params", [{"after": "not-a-token"}, {"after": "f" * 32}, {"limit": 0}, {"limit": "x"},
                                    {"wait": -1}, {"wait": "nan"}, {"format": "parquet"}])
def test_a_malformed_request_is_400(service, params):
    r = httpx.get(service + EVENTS, params=params)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == 400


def test_a_limit_or_wait_above_the_cap_is_served_at_the_cap(service):
    r = httpx.get(service + EVENTS, params={"limit": 5000, "wait": 0})
    assert r.status_code == 200 and r.json()["events"] == []


def test_a_partly_granted_client_sees_only_its_tables(config, tmp_path):
    config.auth_file = write_auth_file(tmp_path / "auth.toml", {
        "admin": ("admin-secret", [("*", ["admin"])]),
        "reader": ("reader-secret", [("iceberg//shared", ["read"]), {"table": "delta/main/default/orders", "privileges": ["read"]}])})
    with EmbeddedService(config) as base:
        admin = {"Authorization": f"Bearer {fetch_token(base, 'admin', 'admin-secret')}"}
        http = httpx.Client(base_url=base, timeout=30, headers=admin)
        for ns in ("shared", "private"):
            assert http.post("/v1/namespaces", json={"namespace": [ns]}).status_code == 200
            r = http.post(f"/v1/namespaces/{ns}/tables", json={"name": "t", "schema": SCHEMA})
            assert r.status_code == 200, r.text
        uc = UC(base)
        uc.http.headers.update(admin)
        for name in ("orders", "secrets"):
            uc.create_managed(name)
        reader = fetch_token(base, "reader", "reader-secret")
        assert httpx.get(base + EVENTS).status_code == 401
        assert {e["subject"] for e in everything(base, token=reader)} == {"shared.t", "main.default.orders"}
        assert len(everything(base, token=fetch_token(base, "admin", "admin-secret"))) == 4


def test_wait_for_returns_once_the_table_reaches_the_version(service):
    http = httpx.Client(base_url=service, timeout=30)
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    assert wait_for(service, "db.t", 0, timeout_s=5)["type"] == "iceberg.table.created"   # already there

    def commit_later() -> None:
        time.sleep(0.5)
        for i in range(2):
            httpx.post(service + "/v1/namespaces/db/tables/t", json={"requirements": [], "updates": [
                {"action": "set-properties", "updates": {"k": str(i)}}]}, timeout=30).raise_for_status()
    writer = threading.Thread(target=commit_later)
    writer.start()
    event = wait_for(service, "db.t", 2, format="iceberg", timeout_s=30)
    writer.join()
    assert event["type"] == "iceberg.table.committed" and event["data"]["version"] == 2
    with pytest.raises(TimeoutError):
        wait_for(service, "db.t", 3, timeout_s=0.5)


def hold_row(dsn: str, table: str, seconds: float) -> None:
    async def run() -> None:
        con = await asyncpg.connect(dsn)
        try:
            async with con.transaction():
                await con.execute("SELECT 1 FROM tables WHERE namespace = 'db' AND name = $1 FOR UPDATE", table)
                await asyncio.sleep(seconds)
        finally:
            await con.close()
    asyncio.run(run())


def test_two_members_under_concurrent_commits_a_following_reader_misses_and_repeats_nothing(database_url, tmp_path):
    """Each member has its own writer, so transactions commit in another order than they took their ids: the feed
    hands out only what no open transaction can still precede. A reader polling both members in turn while four
    writers commit through both gets every acknowledged commit once, each table's in version order. To make the
    inversion certain, a session holds one table's row locked for a while: the write that waits for it took its
    transaction id (at the shard lease's FOR SHARE) before the other member's commits that pass it meanwhile."""
    from tests.test_cluster import create_tables, start_cluster, stop_all, wait_balanced
    members = start_cluster(database_url, tmp_path, n=2)
    try:
        wait_balanced(database_url, members)
        urls = [m.base_url for m in members]
        names = [f"t{i}" for i in range(8)]
        create_tables(urls[0], names)
        acked, unknown, stop, done = [], [], threading.Event(), threading.Event()

        def write(writer: int) -> None:
            """Writers 0 and 1 create tables (several statements in a savepoint: long transactions), the others
            commit to existing ones (one statement), through both members."""
            clients = [httpx.Client(base_url=u, timeout=30) for u in urls]
            n = 0
            while not stop.is_set():
                table, http = names[(writer + n) % len(names)], clients[(writer + n) % 2]
                n += 1
                try:
                    if writer < 2:
                        table = f"w{writer}n{n}"
                        r = http.post("/v1/namespaces/db/tables", json={"name": table, "schema": SCHEMA})
                    else:
                        r = http.post(f"/v1/namespaces/db/tables/{table}", json={"requirements": [], "updates": [
                            {"action": "set-properties", "updates": {f"w{writer}": str(n)}}]})
                except httpx.HTTPError:
                    unknown.append(table)
                    continue
                if r.status_code == 200:
                    location = r.json()["metadata-location"]
                    acked.append((f"db.{table}", int(location.rsplit("/", 1)[1].split("-")[0])))
                elif r.status_code not in (503,):
                    unknown.append((table, r.status_code, r.text[:200]))

        seen: list[dict] = []

        def read() -> None:
            after, i = None, 0
            while True:
                finishing = done.is_set()
                page = httpx.get(urls[i % 2] + EVENTS, params={"limit": 50, "wait": 0,
                                                               "format": "iceberg", **({"after": after} if after else {})},
                                 timeout=60).json()
                seen.extend(page["events"])
                after, i = page["next"], i + 1
                if finishing and not page["events"]:
                    return

        initial = {f"db.{name}" for name in names}   # created before the writers started
        reader = threading.Thread(target=read)
        writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
        reader.start()
        for t in writers:
            t.start()
        for table in ("t0", "t1"):
            time.sleep(2)
            hold_row(database_url, table, 1.5)
        time.sleep(2)
        stop.set()
        for t in writers:
            t.join()
        done.set()
        reader.join(120)
        assert not unknown, unknown[:5]
        assert len(acked) > 50
        assert len({e["sequence"] for e in seen}) == len(seen), "an event was handed out twice"
        committed = [(e["subject"], e["data"]["version"]) for e in seen
                     if not (e["type"] == "iceberg.table.created" and e["subject"] in initial)]
        assert sorted(committed) == sorted(acked), "the feed differs from what was acknowledged"
        for name in names:
            versions = [v for s, v in committed if s == f"db.{name}"]
            assert versions == sorted(versions), f"db.{name}'s events out of order"
        assert seen == everything(urls[1], format="iceberg")
    finally:
        stop_all(members)


def test_a_reader_waiting_on_one_member_hears_another_members_commit_at_once(database_url, tmp_path):
    """A member listens for the other members' commits only while a reader waits on it (storage/events.py
    `listen`): the first reader's long-poll on member B still ends as soon as member A commits to a table A owns
    (B's own writer knows nothing of it), not at its deadline."""
    from storage.records import shard_of
    from tests.test_cluster import create_tables, leases, member_ids, start_cluster, stop_all, wait_balanced
    members = start_cluster(database_url, tmp_path, n=2)
    try:
        wait_balanced(database_url, members)
        a, b = (m.base_url for m in members)
        owner = {shard: member for shard, (member, _, _) in leases(database_url).items()}
        a_id = member_ids(database_url)[members[0].proc.pid]
        ids = create_tables(a, [f"t{i}" for i in range(16)])
        name = next(n for n, table_id in ids.items() if owner[shard_of(table_id)] == a_id)
        after = httpx.get(b + EVENTS, params={"wait": 0}, timeout=30).json()["next"]

        def commit_later() -> None:
            time.sleep(1.0)
            r = httpx.post(f"{a}/v1/namespaces/db/tables/{name}", timeout=30, json={"requirements": [], "updates": [
                {"action": "set-properties", "updates": {"k": "v"}}]})
            assert r.status_code == 200, r.text
        writer = threading.Thread(target=commit_later)
        start = time.monotonic()
        writer.start()
        page = httpx.get(b + EVENTS, params={"after": after, "wait": 30}, timeout=60).json()
        elapsed = time.monotonic() - start
        writer.join()
        assert [e["subject"] for e in page["events"]] == [f"db.{name}"], page
        assert elapsed < 10, f"the reader on B heard A's commit only after {elapsed:.1f} s"
    finally:
        stop_all(members)


@pytest.mark.parametrize("fenced", [False, True], ids=["alone", "cluster"])
def test_the_writer_inserts_events_only_for_rows_that_applied(database_url, fenced):
    """Straight against the group-commit writer: in one flush, a stale compare-and-set beside an applied one
    (one statement), and a create refused for its taken name beside one that applies (savepoints): only the
    applied ones' events are there, numbered in their transaction."""
    import uuid

    from coordinator.events import records
    from coordinator.iceberg.format import ICEBERG
    from coordinator.decision import Change
    from storage.postgres import PostgresStore
    from storage.records import TableRow, TableWrite, WriteGroup
    from tests.support import sql

    store = PostgresStore(database_url, fenced=fenced)
    store.open()
    try:
        if fenced:   # this writer holds every shard's lease at epoch 1
            sql(database_url, "UPDATE shard_leases SET owner = $1, epoch = 1, expires_at = now() + interval '1 hour'",
                uuid.uuid4())
        epoch = 1 if fenced else 0

        def event(table_id, name, what):
            return records(table_id, ("", "", name), [Change(f"iceberg.table.{what}", {"format": "iceberg"})],
                           ICEBERG.securable)

        def flush(*writes: TableWrite):
            async def go():
                futures = [store.writer.submit(WriteGroup([w])) for w in writes]
                return [await f for f in futures]
            return [r.applied for r in store.thread.run_blocking(go)]

        a, b, c, d = (uuid.uuid4() for _ in range(4))
        row = lambda tid, name: TableRow(tid, "iceberg", "", "", name, "iceberg", None)   # noqa: E731
        assert flush(*(TableWrite(t, 0, epoch, state={}, insert=row(t, n), events=event(t, n, "created"))
                       for t, n in ((a, "a"), (b, "b")))) == [True, True]
        assert flush(TableWrite(a, 1, epoch, state={"v": 1}, events=event(a, "a", "committed")),
                     TableWrite(b, 0, epoch, state={"v": 1}, events=event(b, "b", "committed")),   # stale
                     TableWrite(c, 0, epoch, state={}, insert=row(c, "a"), events=event(c, "a", "created")),  # taken
                     TableWrite(d, 0, epoch, state={}, insert=row(d, "d"), events=event(d, "d", "created"))
                     ) == [True, False, False, True]
        rows = sql(database_url, "SELECT xid::text, seq, table_id, type FROM events ORDER BY xid, seq")
        assert [(r["table_id"], r["type"]) for r in rows] == [
            (a, "iceberg.table.created"), (b, "iceberg.table.created"),
            (a, "iceberg.table.committed"), (d, "iceberg.table.created")]
        assert len({r["xid"] for r in rows[2:]}) == 1   # the second flush: one transaction
        assert [r["seq"] for r in rows[2:]] == [1, 4]   # numbered in it (the refused ones' numbers unused)
    finally:
        store.close()


def test_the_dagster_sensor_of_the_docs_requests_one_run_per_commit(service):
    """docs/events.md's sensor, with Dagster: one RunRequest per commit, none twice as its cursor moves on."""
    import os

    from tests.test_docs import DOC_URL, ROOT, blocks_of
    if not os.environ.get("CI"):   # CI installs the dagster extra: there it must run
        pytest.importorskip("dagster")
    sensor_code = next(b for b in blocks_of(ROOT / "docs" / "events.md") if b.needs_dagster).code
    namespace: dict = {"__name__": "sensor_doc"}
    exec(compile(sensor_code.replace(DOC_URL, service), "docs/events.md", "exec", dont_inherit=True), namespace)
    dg, sensor = namespace["dg"], namespace["orders_committed"]
    http = httpx.Client(base_url=service, timeout=30)
    assert http.post("/v1/namespaces", json={"namespace": ["feed_demo"]}).status_code == 200
    assert http.post("/v1/namespaces/feed_demo/tables", json={"name": "orders", "schema": SCHEMA}).status_code == 200

    def commit_once(i: int) -> None:
        r = http.post("/v1/namespaces/feed_demo/tables/orders", json={"requirements": [], "updates": [
            {"action": "set-properties", "updates": {"i": str(i)}}]})
        assert r.status_code == 200, r.text

    def evaluate(cursor):
        context = dg.build_sensor_context(cursor=cursor)
        runs = list(sensor(context))
        return [r.run_config["ops"]["refresh_report"]["config"]["version"] for r in runs], context.cursor, runs

    commit_once(1)
    commit_once(2)
    versions, cursor, runs = evaluate(None)
    assert versions == [1, 2] and len({r.run_key for r in runs}) == 2
    assert evaluate(cursor)[0] == []
    commit_once(3)
    assert evaluate(cursor)[0] == [3]
