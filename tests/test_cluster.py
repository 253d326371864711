"""Scale-out: several coordinator processes on one PostgreSQL (coordinator/cluster).

Three real `coordinator serve --cluster` processes on loopback, one database: any member answers any request;
a member killed under load has its shards taken over in < 5 s with no acknowledged commit lost; a member frozen
(SIGSTOP) past its lease and then resumed applies none of its writes, checked at the database level too. The
store's fencing itself is checked directly against PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter

import httpx
import pytest

from coordinator.cluster.secret import make_secret_file
from storage.records import SHARDS, Refusal, TableRow, TableWrite, WriteGroup, shard_of
from tests.delta.conftest import PREFIX, UC
from tests.support import ServerProcess, sql, uuid7

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
CLUSTER_ENV = {"COORDINATOR_CLUSTER": "true"}
RETRYABLE = {200, 409, 503}
# The one other answer allowed: the owner died after its write was durable but before answering. The forwarding
# member finds the request's receipt in the database and says so (500 CommitStateUnknown, as Iceberg's spec asks
# when a response cannot be given); a 503 would invite a retry of an applied commit. Such commits must be there.
APPLIED_UNKNOWN = "500 applied, answer lost"


def member_ids(dsn: str) -> dict[int, uuid.UUID]:
    """pid -> member id."""
    return {r["pid"]: r["member_id"] for r in sql(dsn, "SELECT pid, member_id FROM cluster_members")}


def leases(dsn: str) -> dict[int, tuple[uuid.UUID | None, int, bool]]:
    return {r["shard"]: (r["owner"], r["epoch"], r["live"]) for r in sql(
        dsn, "SELECT shard, owner, epoch, expires_at > now() AS live FROM shard_leases")}


def wait_balanced(dsn: str, members: list[ServerProcess], timeout_s: float = 20) -> dict[int, uuid.UUID]:
    """Until every shard is live and each member holds some: returns pid -> member id."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ids = member_ids(dsn)
        held = Counter(owner for owner, _, live in leases(dsn).values() if live)
        if all(m.proc.pid in ids and held[ids[m.proc.pid]] > 0 for m in members) and sum(held.values()) == SHARDS:
            return ids
        time.sleep(0.2)
    raise AssertionError(f"cluster did not balance: {Counter(o for o, _, _ in leases(dsn).values())}")


def start_cluster(database_url: str, tmp_path, n: int = 3) -> list[ServerProcess]:
    secret = make_secret_file(tmp_path / "cluster.secret")   # each member has a data dir of its own
    env = {**CLUSTER_ENV, "COORDINATOR_CLUSTER_SECRET_FILE": str(secret)}
    members = [ServerProcess(database_url, tmp_path / f"m{i}", warehouse=str(tmp_path / "warehouse"),
                             extra_env=env) for i in range(n)]
    for m in members:
        m.start()
    return members


def create_tables(base: str, names: list[str]) -> dict[str, uuid.UUID]:
    with httpx.Client(base_url=base, timeout=30) as http:
        r = http.post("/v1/namespaces", json={"namespace": ["db"]})
        assert r.status_code in (200, 409), r.text
        out = {}
        for name in names:
            for _ in range(50):
                r = http.post("/v1/namespaces/db/tables", json={"name": name, "schema": SCHEMA, "properties": {
                    "write.metadata.previous-versions-max": "1000000"}})
                if r.status_code != 503:
                    break
                time.sleep(0.2)
            assert r.status_code == 200, r.text
            out[name] = uuid.UUID(r.json()["metadata"]["table-uuid"])
        return out


def _commit_loop(urls: list[str], tables: list[str], writer: int, acked: list, statuses: Counter,
                 stop: threading.Event) -> None:
    """Each commit sets a property unique to it; a 200 means it must survive anything."""
    n = 0
    clients = [httpx.Client(base_url=u, timeout=30) for u in urls]
    try:
        while not stop.is_set():
            key = f"w{writer}-{n}"
            table = tables[n % len(tables)]
            http = clients[(writer + n) % len(clients)]
            try:
                r = http.post(f"/v1/namespaces/db/tables/{table}",
                              json={"requirements": [], "updates": [{"action": "set-properties",
                                                                     "updates": {key: "1"}}]})
            except httpx.HTTPError:
                statuses["connection"] += 1
                n += 1  # a request lost with its connection may or may not have applied: use a new key
                time.sleep(0.05)
                continue
            if r.status_code != 500:
                statuses[r.status_code] += 1
            if r.status_code == 503:
                assert r.headers.get("Retry-After"), "503 without Retry-After"
            if r.status_code == 200:
                acked.append((table, key))
            elif r.status_code == 500 and "applied the request but failed before answering" in r.text:
                statuses[APPLIED_UNKNOWN] += 1
                acked.append((table, key))
            elif r.status_code not in RETRYABLE:
                statuses[f"{r.status_code}: {r.text[:200]}"] += 1
            n += 1
            if r.status_code != 200:
                time.sleep(0.02)
    finally:
        for c in clients:
            c.close()


def check_acked(base: str, acked: list) -> None:
    with httpx.Client(base_url=base, timeout=30) as http:
        for table in sorted({t for t, _ in acked}):
            meta = http.get(f"/v1/namespaces/db/tables/{table}").json()["metadata"]
            missing = [k for t, k in acked if t == table and k not in meta["properties"]]
            assert not missing, f"{len(missing)} acknowledged commits lost on {table}: {missing[:5]}"
            versions = [int(e["metadata-file"].rsplit("/", 1)[1].split("-")[0]) for e in meta["metadata-log"]]
            assert versions == list(range(len(versions)))


def stop_all(members: list[ServerProcess]) -> None:
    for m in members:
        if m.proc is not None and m.proc.poll() is None:
            try:
                os.kill(m.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        m.stop()


# -- the store's fencing, directly against PostgreSQL -------------------------------------------------------------


def test_write_under_a_moved_lease_applies_nothing(database_url):
    """A writer whose lease epoch is no longer the shard's changes nothing: updates, inserts and deletes."""
    from storage.postgres import PostgresStore

    store = PostgresStore(database_url, fenced=True)
    store.open()
    try:
        table_id = uuid.uuid4()
        shard = shard_of(table_id)
        sql(database_url, "UPDATE shard_leases SET owner = $1, epoch = 7, expires_at = now() + interval '1 hour'"
                          " WHERE shard = $2", uuid.uuid4(), shard)
        row = TableRow(table_id=table_id, realm="iceberg", catalog="", namespace="", name="t", format="iceberg",
                       location="file:///x")

        def write(w: TableWrite):
            async def go():
                return await store.writer.submit(WriteGroup([w]))
            return store.thread.run_blocking(go)

        assert write(TableWrite(table_id, 0, 6, state={"v": 0}, insert=row)).refusal is Refusal.FENCED
        assert write(TableWrite(table_id, 0, 7, state={"v": 0}, insert=row)).applied
        assert write(TableWrite(table_id, 1, 7, state={"v": 1})).applied
        # Takeover by another member: the epoch grows.
        sql(database_url, "UPDATE shard_leases SET owner = $1, epoch = 8 WHERE shard = $2", uuid.uuid4(), shard)
        assert write(TableWrite(table_id, 2, 7, state={"v": 2})).refusal is Refusal.FENCED
        assert write(TableWrite(table_id, 2, 7, delete=True)).refusal is Refusal.FENCED
        assert write(TableWrite(table_id, 2, 7, rename=("", "", "u"))).refusal is Refusal.FENCED
        [r] = sql(database_url, "SELECT row_version, epoch, state, name FROM tables WHERE table_id = $1", table_id)
        assert (r["row_version"], r["epoch"], r["name"]) == (2, 7, "t") and '"v": 1' in r["state"]
        # The new owner writes under its epoch.
        assert write(TableWrite(table_id, 2, 8, state={"v": 2})).applied
    finally:
        store.close()


# -- three processes ------------------------------------------------------------------------------------------------


@pytest.mark.crash
def test_any_member_answers_any_request(database_url, tmp_path):
    members = start_cluster(database_url, tmp_path)
    try:
        ids = wait_balanced(database_url, members)
        a, b, c = (m.base_url for m in members)
        names = [f"t{i}" for i in range(8)]
        tables = create_tables(a, names)
        owners = leases(database_url)
        table_owner = {name: owners[shard_of(tid)][0] for name, tid in tables.items()}
        assert len(set(table_owner.values())) > 1, "all tables landed on one member; the test needs more"
        with httpx.Client(timeout=30) as http:
            # Create on A (above), commit via B, read via C.
            for name in names:
                r = http.post(f"{b}/v1/namespaces/db/tables/{name}", json={"requirements": [], "updates": [
                    {"action": "set-properties", "updates": {"via": "b"}}]})
                assert r.status_code == 200, r.text
                r = http.get(f"{c}/v1/namespaces/db/tables/{name}")
                assert r.status_code == 200 and r.json()["metadata"]["properties"]["via"] == "b", r.text
            # A multi-table commit across owners, sent to C: two-phase over the channel, all or nothing.
            changes = [{"identifier": {"namespace": ["db"], "name": n}, "requirements": [],
                        "updates": [{"action": "set-properties", "updates": {"tx": "1"}}]} for n in names]
            r = http.post(f"{c}/v1/transactions/commit", json={"table-changes": changes})
            assert r.status_code == 204, r.text
            bad = [dict(ch) for ch in changes]
            bad[-1] = {**bad[-1], "requirements": [{"type": "assert-table-uuid", "uuid": str(uuid.uuid4())}]}
            for ch in bad:
                ch["updates"] = [{"action": "set-properties", "updates": {"tx": "2"}}]
            r = http.post(f"{a}/v1/transactions/commit", json={"table-changes": bad})
            assert r.status_code == 409, r.text
            for name in names:
                props = http.get(f"{b}/v1/namespaces/db/tables/{name}").json()["metadata"]["properties"]
                assert props["tx"] == "1", (name, props)
            # Lance and Delta through other members too.
            r = http.post(f"{a}/v1/namespace/lns/create", json={})
            assert r.status_code == 200, r.text
            r = http.post(f"{b}/v1/table/lns%24lt/declare", json={})
            assert r.status_code == 200, r.text
            r = http.post(f"{c}/v1/table/lns%24lt/describe", json={})
            assert r.status_code == 200, r.text
            # Versions from staged manifests, and drops, through every member: what a forwarded proposal carries
            # to do once durable (remove the staged manifest, delete the dropped table's files) crosses too.
            from tests.lance.conftest import stage
            location = r.json()["location"]
            for version, member in enumerate((a, b, c) * 3, start=1):
                staged = stage(location, version)
                r = http.post(f"{member}/v1/table/lns%24lt/version/create",
                              json={"version": version, "manifest_path": staged})
                assert r.status_code == 200, r.text
            # Read through every member: a forwarded read's answer carries only the latest versions (ReadTable.
            # reply_for_peer), and the member that forwarded it finds the older ones in the commit log.
            for member in (a, b, c):
                listed = http.post(f"{member}/v1/table/lns%24lt/version/list").json()["versions"]
                assert [v["version"] for v in listed] == list(range(1, 10)), listed
                latest = http.post(f"{member}/v1/table/lns%24lt/version/list",
                                   params={"limit": 1, "descending": "true"}).json()["versions"]
                assert [v["version"] for v in latest] == [9], latest
                r = http.post(f"{member}/v1/table/lns%24lt/version/describe", json={"version": 2})
                assert r.status_code == 200 and r.json()["version"]["version"] == 2, r.text
            for i, member in enumerate((a, b, c)):
                r = http.post(f"{a}/v1/table/lns%24gone{i}/declare", json={})
                assert r.status_code == 200, r.text
                r = http.post(f"{member}/v1/table/lns%24gone{i}/drop", json={})
                assert r.status_code == 200, r.text
            # Lance batch-commit across owners: deregister tables declared via different members, atomically.
            lance = [f"l{i}" for i in range(8)]
            for i, name in enumerate(lance):
                r = http.post(f"{(a, b, c)[i % 3]}/v1/table/lns%24{name}/declare", json={})
                assert r.status_code == 200, r.text
            ops = [{"deregister_table": {"id": ["lns", n]}} for n in lance]
            r = http.post(f"{a}/v1/table/batch-commit", json={"operations": ops + [
                {"deregister_table": {"id": ["lns", "missing"]}}]})
            assert r.status_code == 404, r.text
            r = http.post(f"{b}/v1/table/batch-commit", json={"operations": ops})
            assert r.status_code == 200, r.text
            listed = http.get(f"{c}/v1/namespace/lns/table/list").json()["tables"]
            assert sorted(listed) == ["lt"], listed
            _one_key_through_two_members(http, b, c, names[0])
        _delta_tables_through_every_member([a, b, c])
        assert len(ids) == 3
    finally:
        stop_all(members)


def _at_once(urls: list[str], body: dict, key: str) -> list[httpx.Response]:
    """POST `body` with Idempotency-Key `key` to every URL at the same moment; the answers in URL order."""
    answers: list = [None] * len(urls)

    def post(i: int) -> None:
        answers[i] = httpx.post(urls[i], json=body, timeout=30, headers={"Idempotency-Key": key})
    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(urls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def _one_key_through_two_members(http: httpx.Client, b: str, c: str, table: str) -> None:
    """A retried commit sent through two members at once (a client behind a load balancer): it applies once, and
    both get its answer; the one that arrives second must not be decided again and told its own snapshot's
    `assert-ref-snapshot-id` failed."""
    for round_ in range(5):
        meta = http.get(f"{b}/v1/namespaces/db/tables/{table}").json()["metadata"]
        parent, sid = meta.get("current-snapshot-id"), 1000 + round_
        parent = None if parent in (None, -1) else parent
        snapshot = {"snapshot-id": sid, "sequence-number": meta["last-sequence-number"] + 1,
                    "timestamp-ms": int(time.time() * 1000), "manifest-list": f"{meta['location']}/snap-{sid}.avro",
                    "summary": {"operation": "append"}, "schema-id": 0,
                    **({"parent-snapshot-id": parent} if parent is not None else {})}
        body = {"requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": parent}],
                "updates": [{"action": "add-snapshot", "snapshot": snapshot},
                            {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": sid}]}
        answers = _at_once([f"{base}/v1/namespaces/db/tables/{table}" for base in (b, c)], body, uuid7())
        assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
    snapshots = http.get(f"{b}/v1/namespaces/db/tables/{table}").json()["metadata"]["snapshots"]
    assert [s["snapshot-id"] for s in snapshots] == [1000 + i for i in range(5)]
    # The same through a multi-table commit, whose parts reach the owner as a transaction's.
    for round_ in range(5):
        meta = http.get(f"{b}/v1/namespaces/db/tables/{table}").json()["metadata"]
        schema = {"type": "struct", "schema-id": 0, "fields": [
            {"id": 1, "name": "id", "type": "long", "required": False},
            {"id": 2 + round_, "name": f"c{round_}", "type": "long", "required": False}]}
        body = {"table-changes": [{"identifier": {"namespace": ["db"], "name": table},
                                   "requirements": [{"type": "assert-current-schema-id",
                                                     "current-schema-id": meta["current-schema-id"]}],
                                   "updates": [{"action": "add-schema", "schema": schema, "last-column-id": 2 + round_},
                                               {"action": "set-current-schema", "schema-id": -1}]}]}
        answers = _at_once([f"{base}/v1/transactions/commit" for base in (b, c)], body, uuid7())
        assert [r.status_code for r in answers] == [204, 204], [r.text for r in answers]


def _delta_tables_through_every_member(bases: list[str]) -> None:
    """A managed Delta table created and read through members that do not own it (its state crosses the channel)."""
    for i, base in enumerate(bases):
        uc = UC(base)
        table = uc.create_managed(f"d{i}", catalog="dc")
        for other in bases:
            r = httpx.get(f"{other}{PREFIX}/tables/dc.default.d{i}", timeout=30)
            assert r.status_code == 200 and r.json()["table_id"] == table["table_id"], r.text


def _tables_and_busiest_member(database_url: str, members):
    """Once the cluster is balanced: 12 new tables, and the member whose shards own the most of them (the one to
    kill or freeze), with its member id."""
    ids = wait_balanced(database_url, members)
    names = [f"t{i}" for i in range(12)]
    tables = create_tables(members[0].base_url, names)
    owners = leases(database_url)
    busiest = max(members, key=lambda m: sum(owners[shard_of(t)][0] == ids[m.proc.pid] for t in tables.values()))
    assert any(owners[shard_of(t)][0] == ids[busiest.proc.pid] for t in tables.values())
    return names, tables, busiest, ids[busiest.proc.pid]


class _Writers:
    """Writers committing to `names` through `urls` until `stop()`; what they saw goes in acked/statuses."""

    def __init__(self, urls: list[str], names: list[str], writers: int = 6):
        self.acked: list = []
        self.statuses: Counter = Counter()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=_commit_loop,
                                          args=(urls, names, w, self.acked, self.statuses, self._stop))
                         for w in range(writers)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


@pytest.mark.crash
def test_member_killed_under_load_shards_taken_over_nothing_lost(database_url, tmp_path):
    members = start_cluster(database_url, tmp_path)
    try:
        names, _, victim, victim_id = _tables_and_busiest_member(database_url, members)
        survivors = [m for m in members if m is not victim]
        writers = _Writers([m.base_url for m in survivors], names)
        acked, statuses = writers.acked, writers.statuses
        time.sleep(2.0)
        started_by = time.monotonic() + 30   # a busy machine may take a while to get the writers going
        while not acked and time.monotonic() < started_by:
            time.sleep(0.1)
        before = len(acked)
        victim.kill()
        killed_at = time.monotonic()
        took_over_s = None
        while time.monotonic() - killed_at < 15:
            now = leases(database_url)
            if all(owner != victim_id and live for owner, _, live in now.values()):
                took_over_s = time.monotonic() - killed_at
                break
            time.sleep(0.05)
        time.sleep(2.0)
        writers.stop()
        print(f"takeover after {took_over_s} s; statuses {dict(statuses)}; acked {before} before the kill, "
              f"{len(acked)} in all")
        assert took_over_s is not None and took_over_s < 5.0, f"takeover took {took_over_s} s"
        assert before > 0 and len(acked) > before + 10, "no commits acknowledged around the kill"
        assert set(statuses) <= RETRYABLE | {APPLIED_UNKNOWN}, f"non-retryable answers: {statuses}"
        check_acked(survivors[0].base_url, acked)
    finally:
        stop_all(members)


@pytest.mark.crash
def test_member_frozen_past_its_lease_applies_nothing_after_resuming(database_url, tmp_path):
    members = start_cluster(database_url, tmp_path)
    try:
        names, tables, frozen, frozen_id = _tables_and_busiest_member(database_url, members)
        # Writers send to every member, the frozen one included: its requests are in flight when it stops, and
        # more queue up in its sockets while it is stopped.
        writers = _Writers([m.base_url for m in members], names)
        acked, statuses = writers.acked, writers.statuses
        time.sleep(2.0)
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        held = {s: epoch for s, (owner, epoch, _) in leases(database_url).items() if owner == frozen_id}
        assert held, "the frozen member held no shard"
        deadline = time.monotonic() + 15
        while any(leases(database_url)[s][0] == frozen_id for s in held):
            assert time.monotonic() < deadline, "shards of the frozen member were not taken over"
            time.sleep(0.1)
        count_stale = ("SELECT count(*) AS n FROM commits WHERE (table_id, epoch) IN (SELECT t, e FROM"
                       " unnest($1::uuid[], $2::bigint[]) AS x(t, e))")
        table_epochs = [(tid, held[shard_of(tid)]) for tid in tables.values() if shard_of(tid) in held]
        args = ([t for t, _ in table_epochs], [e for _, e in table_epochs])
        [before] = sql(database_url, count_stale, *args)
        time.sleep(1.0)
        os.kill(frozen.proc.pid, signal.SIGCONT)
        time.sleep(4.0)  # the resumed member finishes whatever it had begun, and serves again
        writers.stop()
        [after] = sql(database_url, count_stale, *args)
        metrics = httpx.get(frozen.base_url + "/metrics", timeout=10).text
        fenced = [line for line in metrics.splitlines() if line.startswith("coordinator_db_fenced_writes_total ")]
        print(f"writes the resumed member attempted and the database refused: {fenced}")
        print(f"frozen member held {len(held)} shards; statuses {dict(statuses)}; {len(acked)} acked; commits "
              f"under its old epochs: {before['n']} before resuming, {after['n']} after")
        assert after["n"] == before["n"], "the frozen member wrote after its lease moved"
        assert set(statuses) <= RETRYABLE | {APPLIED_UNKNOWN, "connection"}, f"non-retryable answers: {statuses}"
        check_acked(members[0].base_url, acked)
        # The resumed member rejoins and serves again.
        wait_balanced(database_url, members)
    finally:
        stop_all(members)


@pytest.mark.crash
def test_serve_workers_runs_a_cluster_on_one_port(database_url, tmp_path):
    """`coordinator serve --workers 2`: two member processes share one listening socket."""
    import subprocess
    import sys
    from pathlib import Path

    from storage.embedded import free_port

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "workers.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "api.cli", "serve", "--workers", "2", "--port", str(port),
                             "--database-url", database_url, "--data-dir", str(tmp_path),
                             "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT,
                            cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.monotonic() + 30
        # Until both workers hold shards (the first to start takes all, then hands half to the second).
        while len({owner for owner, _, live in leases(database_url).values() if live}) < 2 or \
                any(not live for _, _, live in leases(database_url).values()):
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "workers.log").read_text()
            time.sleep(0.2)
        tables = create_tables(base, [f"t{i}" for i in range(6)])
        with httpx.Client(base_url=base, timeout=30) as http:
            for name in tables:
                r = http.post(f"/v1/namespaces/db/tables/{name}", json={"requirements": [], "updates": [
                    {"action": "set-properties", "updates": {"k": "v"}}]})
                assert r.status_code == 200, r.text
        owners = {r["owner"] for r in sql(database_url, "SELECT DISTINCT owner FROM shard_leases")}
        assert len(owners) == 2 and len(sql(database_url, "SELECT 1 FROM cluster_members")) == 2
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    # A graceful stop released every lease and left the cluster.
    assert not sql(database_url, "SELECT 1 FROM cluster_members")
