"""Concurrent Iceberg appends rebased by the service (docs/rebasing.md), end to end over real HTTP with the real
clients: pyiceberg writer processes and DuckDB into one table, then what clients are told, the commit feed, the
metric, Idempotency-Key replays, transactions, the `--rebase-appends` default, and bad input through HTTP.

The writer test's size is `COORDINATOR_REBASE_WRITERS` (processes x appends; default 4x5, the proof run 16x20):

    COORDINATOR_REBASE_WRITERS=16x20 python -m pytest -q tests/test_iceberg_rebase.py -k processes
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import uuid
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

from coordinator.iceberg.rebase import REBASE_PROPERTY
from tests import iceberg_appends as client
from tests.support import uuid7

PROCESSES, APPENDS = (int(n) for n in os.environ.get("COORDINATOR_REBASE_WRITERS", "4x5").split("x"))
SCHEMA = Schema(NestedField(1, "writer", LongType()), NestedField(2, "n", LongType()))
REST_SCHEMA = {"type": "struct", "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
EVENTS = "/api/coordinator/v1/events"


def create_table(url: str, name: str, rebase: bool) -> None:
    catalog = load_catalog("setup", type="rest", uri=url)
    if ("w",) not in catalog.list_namespaces():
        catalog.create_namespace("w")
    # commit.retry.num-retries=0: pyiceberg does not retry a 409, so every append that lands is the server's doing
    catalog.create_table(f"w.{name}", SCHEMA, properties={REBASE_PROPERTY: str(rebase).lower(),
                                                          "commit.retry.num-retries": "0"})


def writer(url: str, namespace: str, name: str, number: int, appends: int, loaded, properties: dict
           ) -> tuple[list[int], int, list[str]]:
    """One pyiceberg process: `appends` appends of one row each, with the table it loaded once (each answer
    brings it up to date, and others commit meanwhile). Its snapshot ids, and the appends refused. Every process
    starts once all have loaded the table (`loaded`, a barrier): their first appends are all on the same base."""
    table = load_catalog(f"w{number}", type="rest", uri=url, **properties).load_table(f"{namespace}.{name}")
    loaded.wait()
    ids, failed, errors = [], 0, []
    for n in range(appends):
        try:
            table.append(pa.table({"writer": pa.array([number], pa.int64()), "n": pa.array([n], pa.int64())}))
        except CommitFailedException as exc:
            failed += 1
            errors.append(str(exc)[:200])
            table = table.refresh()
            continue
        ids.append(table.metadata.current_snapshot_id)
    return ids, failed, errors


def run_writers(url: str, namespace: str, name: str, processes: int, appends: int, properties: dict | None = None
                ) -> tuple[list[int], int, list[str]]:
    """`processes` pyiceberg processes (`writer`) appending to `namespace.name`: their snapshot ids, how many
    appends were refused, and the refusals' messages. `properties`: the catalog's (credentials, say)."""
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(processes) as pool:
        loaded = manager.Barrier(processes, timeout=300)
        results = pool.starmap(writer, [(url, namespace, name, i, appends, loaded, properties or {})
                                        for i in range(processes)])
    return ([sid for ids, _, _ in results for sid in ids], sum(f for _, f, _ in results),
            [e for _, _, errors in results for e in errors])


def duckdb_connection(url: str):
    import duckdb
    import duckdb_ext
    con = duckdb.connect(config={"extension_directory": os.path.join(duckdb_ext.__path__[0], "extensions"),
                                 "autoinstall_known_extensions": False})
    con.sql(f"ATTACH '' AS lake (TYPE iceberg, ENDPOINT '{url}', AUTHORIZATION_TYPE 'none')")
    return con


def main_history(metadata) -> list:
    """main's snapshots from the first to the head, following each one's parent."""
    by_id = {s.snapshot_id: s for s in metadata.snapshots}
    out, at = [], metadata.current_snapshot_id
    while at is not None:
        out.append(by_id[at])
        at = by_id[at].parent_snapshot_id
    return out[::-1]


def test_pyiceberg_processes_append_into_one_table_and_every_append_lands(service):
    create_table(service, "t", rebase=True)
    ids, failed, errors = run_writers(service, "w", "t", PROCESSES, APPENDS)
    assert failed == 0, errors
    table = load_catalog("check", type="rest", uri=service).load_table("w.t")
    rows = table.scan().to_arrow().to_pylist()
    assert sorted((r["writer"], r["n"]) for r in rows) == [(w, n) for w in range(PROCESSES) for n in range(APPENDS)]
    history = main_history(table.metadata)
    total = PROCESSES * APPENDS
    assert [s.snapshot_id for s in history] == [e.snapshot_id for e in table.metadata.snapshot_log]
    assert sorted(s.snapshot_id for s in history) == sorted(ids) and len(history) == total
    assert [s.sequence_number for s in history] == list(range(1, total + 1))
    assert int(history[-1].summary["total-records"]) == total
    # every one of them was told what was committed: its own snapshot, with main at it
    assert len(set(ids)) == total
    # DuckDB reads the manifest lists the service wrote, and counts the same rows
    assert duckdb_connection(service).sql("SELECT count(*), count(DISTINCT (writer, n)) FROM lake.w.t").fetchall() \
        == [(total, total)]
    metrics = httpx.get(f"{service}/metrics").text
    rebased = next(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("coordinator_rebased_commits_total"))
    assert PROCESSES - 1 <= rebased < total   # (the first appends all start from the empty table)
    print(f"{PROCESSES} pyiceberg processes x {APPENDS} appends, retries off: {len(ids)} landed, {failed} refused, "
          f"{rebased:.0f} rebased; {len(rows)} rows, each once; main's {len(history)} snapshots linear, sequence "
          f"numbers 1..{total}; DuckDB counts {total}")


def test_without_rebasing_the_same_writers_get_409s(service):
    create_table(service, "plain", rebase=False)
    ids, failed, errors = run_writers(service, "w", "plain", PROCESSES, APPENDS)
    assert failed >= PROCESSES - 1 and len(ids) + failed == PROCESSES * APPENDS   # (the first appends: one lands)
    print(f"rebasing off: {len(ids)} of {PROCESSES * APPENDS} appends landed, {failed} CommitFailedException (409)")
    assert all("Requirement failed" in e and "not rebased" not in e for e in errors), errors[:3]


def test_duckdb_inserts_into_one_table_all_land(service):
    """DuckDB commits each INSERT through `transactions/commit`, one table each; 16 at once into one table."""
    create_table(service, "duck", rebase=True)
    errors: list[str] = []

    def insert(i: int) -> None:
        try:
            duckdb_connection(service).sql(f"INSERT INTO lake.w.duck VALUES ({i}, 0)")
        except Exception as exc:   # noqa: BLE001 - collected and reported below
            errors.append(str(exc)[-300:])
    threads = [threading.Thread(target=insert, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert duckdb_connection(service).sql("SELECT count(DISTINCT writer) FROM lake.w.duck").fetchall() == [(16,)]
    history = main_history(load_catalog("c", type="rest", uri=service).load_table("w.duck").metadata)
    assert [s.sequence_number for s in history] == list(range(1, 17))


# -- what a rebased commit's client is told ----------------------------------------------------------------------


@pytest.fixture
def rest(service):
    """db.t with rebasing on, and its first append; a client of it over plain HTTP."""
    with httpx.Client(base_url=service, timeout=30) as http:
        assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
        created = http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": REST_SCHEMA,
                                                               "properties": {REBASE_PROPERTY: "true"}})
        assert created.status_code == 200, created.text
        first = http.post("/v1/namespaces/db/tables/t", json=client.append(created.json()["metadata"]))
        assert first.status_code == 200, first.text
        yield http


def metadata_of(http) -> dict:
    return http.get("/v1/namespaces/db/tables/t").json()["metadata"]


def test_the_answer_is_the_committed_metadata_and_a_replay_returns_it(rest):
    base = metadata_of(rest)
    assert rest.post("/v1/namespaces/db/tables/t", json=client.append(base)).status_code == 200
    body, key = client.append(base), uuid7()
    answer = rest.post("/v1/namespaces/db/tables/t", json=body, headers={"Idempotency-Key": key})
    assert answer.status_code == 200, answer.text
    committed = answer.json()["metadata"]
    assert committed == metadata_of(rest)
    sid = body["updates"][0]["snapshot"]["snapshot-id"]
    snap = next(s for s in committed["snapshots"] if s["snapshot-id"] == sid)
    assert committed["current-snapshot-id"] == sid and snap["sequence-number"] == 3
    assert snap["parent-snapshot-id"] == committed["snapshot-log"][-2]["snapshot-id"] != base["current-snapshot-id"]
    replay = rest.post("/v1/namespaces/db/tables/t", json=body, headers={"Idempotency-Key": key})
    assert replay.status_code == 200 and replay.json() == answer.json()
    assert len(metadata_of(rest)["snapshots"]) == 3


def test_the_feed_carries_the_real_parent_and_sequence_number(rest):
    base = metadata_of(rest)
    a, b = client.append(base), client.append(base)
    for body in (a, b):
        assert rest.post("/v1/namespaces/db/tables/t", json=body).status_code == 200
    events = [e["data"] for e in rest.get(EVENTS, params={"table": "db.t"}).json()["events"]
              if e["type"] == "iceberg.table.committed"]
    ids = [body["updates"][0]["snapshot"]["snapshot-id"] for body in (a, b)]
    assert [(e["snapshot-id"], e["parent-snapshot-id"], e["sequence-number"]) for e in events[-2:]] == [
        (ids[0], base["current-snapshot-id"], 2), (ids[1], ids[0], 3)]


def test_a_transaction_of_several_tables_rebases_each_append(rest):
    created = rest.post("/v1/namespaces/db/tables", json={"name": "u", "schema": REST_SCHEMA,
                                                           "properties": {REBASE_PROPERTY: "true"}}).json()["metadata"]
    base_t, base_u = metadata_of(rest), created
    for body, name in ((client.append(base_t), "t"), (client.append(base_u), "u")):
        assert rest.post(f"/v1/namespaces/db/tables/{name}", json=body).status_code == 200
    changes = [{"identifier": {"namespace": ["db"], "name": name}, **client.append(base)}
               for name, base in (("t", base_t), ("u", base_u))]
    answer = rest.post("/v1/transactions/commit", json={"table-changes": changes})
    assert answer.status_code == 204, answer.text
    for name, change in (("t", changes[0]), ("u", changes[1])):
        md = rest.get(f"/v1/namespaces/db/tables/{name}").json()["metadata"]
        assert md["current-snapshot-id"] == change["updates"][0]["snapshot"]["snapshot-id"]
    # one of them not an append after all: neither applies, 409 as before
    base_t, base_u = metadata_of(rest), rest.get("/v1/namespaces/db/tables/u").json()["metadata"]
    assert rest.post("/v1/namespaces/db/tables/t", json=client.append(base_t)).status_code == 200
    changes = [{"identifier": {"namespace": ["db"], "name": "t"}, **client.append(base_t, operation="overwrite")},
               {"identifier": {"namespace": ["db"], "name": "u"}, **client.append(base_u)}]
    refused = rest.post("/v1/transactions/commit", json={"table-changes": changes})
    assert refused.status_code == 409 and refused.json()["error"]["type"] == "CommitFailedException"
    assert rest.get("/v1/namespaces/db/tables/u").json()["metadata"] == base_u


def test_rebasing_is_turned_on_and_off_by_the_table_property(rest):
    rest.post("/v1/namespaces/db/tables/t", json={"requirements": [], "updates": [
        {"action": "set-properties", "updates": {REBASE_PROPERTY: "false"}}]}).raise_for_status()
    base = metadata_of(rest)
    assert rest.post("/v1/namespaces/db/tables/t", json=client.append(base)).status_code == 200
    stale = rest.post("/v1/namespaces/db/tables/t", json=client.append(base))
    assert stale.status_code == 409 and "not rebased" not in stale.text
    rest.post("/v1/namespaces/db/tables/t", json={"requirements": [], "updates": [
        {"action": "set-properties", "updates": {REBASE_PROPERTY: "true"}}]}).raise_for_status()
    assert rest.post("/v1/namespaces/db/tables/t", json=client.append(base)).status_code == 200


@pytest.mark.parametrize("bad", ["missing", "not-avro", "link", "without-parent"])
def test_bad_input_is_answered_in_icebergs_error_model_and_changes_nothing(rest, bad):
    base = metadata_of(rest)
    assert rest.post("/v1/namespaces/db/tables/t", json=client.append(base)).status_code == 200
    before = metadata_of(rest)
    body = client.append(base, inherited=[] if bad == "without-parent" else None)
    path = Path(body["updates"][0]["snapshot"]["manifest-list"].removeprefix("file://"))
    if bad == "missing":
        path.unlink()
    elif bad == "not-avro":
        path.write_bytes(b"PAR1 not a manifest list")
    elif bad == "link":
        real = path.with_suffix(".real")
        path.rename(real)
        path.symlink_to(real)
    answer = rest.post("/v1/namespaces/db/tables/t", json=body)
    status, kind, says = {"missing": (400, "BadRequestException", "does not exist"),
                          "not-avro": (400, "BadRequestException", "is not an Avro manifest list"),
                          "link": (400, "BadRequestException", "without following a link"),
                          "without-parent": (409, "CommitFailedException", "does not hold exactly its parent's")}[bad]
    assert answer.status_code == status and answer.json()["error"]["type"] == kind, answer.text
    assert says in answer.json()["error"]["message"]
    assert metadata_of(rest) == before


def test_rebase_appends_sets_the_property_on_new_tables(tmp_path, database_url):
    from api.server import EmbeddedService
    from coordinator.config import Config
    config = Config(database_url=database_url, data_dir=tmp_path, port=0, warehouse=str(tmp_path / "warehouse"),
                    rebase_appends=True)
    with EmbeddedService(config) as url, httpx.Client(base_url=url, timeout=30) as http:
        http.post("/v1/namespaces", json={"namespace": ["db"]}).raise_for_status()
        for name, properties in (("on", {}), ("off", {REBASE_PROPERTY: "false"})):
            made = http.post("/v1/namespaces/db/tables", json={"name": name, "schema": REST_SCHEMA,
                                                                "properties": properties})
            assert made.json()["metadata"]["properties"][REBASE_PROPERTY] == ("true" if name == "on" else "false")
        staged = http.post("/v1/namespaces/db/tables", json={"name": "tx", "schema": REST_SCHEMA,
                                                              "stage-create": True}).json()["metadata"]
        assert staged["properties"][REBASE_PROPERTY] == "true"
        # a create transaction whose updates do not carry the staged properties gets the default all the same
        committed = http.post("/v1/namespaces/db/tables/tx", json={
            "requirements": [{"type": "assert-create"}],
            "updates": [{"action": "assign-uuid", "uuid": staged["table-uuid"]},
                        {"action": "upgrade-format-version", "format-version": 2},
                        {"action": "add-schema", "schema": staged["schemas"][0]},
                        {"action": "set-current-schema", "schema-id": -1},
                        {"action": "add-spec", "spec": staged["partition-specs"][0]},
                        {"action": "set-default-spec", "spec-id": -1},
                        {"action": "add-sort-order", "sort-order": staged["sort-orders"][0]},
                        {"action": "set-default-sort-order", "sort-order-id": -1}]})
        assert committed.status_code == 200, committed.text
        assert committed.json()["metadata"]["properties"][REBASE_PROPERTY] == "true"


def test_appends_sent_through_any_cluster_member_are_rebased_by_the_tables_owner(database_url, tmp_path):
    """A member that is not the table's owner reads the files a rebase needs and forwards the commit with them:
    the owner's question (what to read) and the files read cross the cluster channel."""
    from tests.test_cluster import start_cluster, stop_all, wait_balanced
    members = start_cluster(database_url, tmp_path, n=2)
    try:
        wait_balanced(database_url, members)
        urls = [m.base_url for m in members]
        with httpx.Client(timeout=30) as http:
            assert http.post(f"{urls[0]}/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
            created = http.post(f"{urls[0]}/v1/namespaces/db/tables", json={
                "name": "t", "schema": REST_SCHEMA, "properties": {REBASE_PROPERTY: "true"}})
            assert created.status_code == 200, created.text
            base = created.json()["metadata"]
            bodies = [client.append(base) for _ in range(6)]
            for i, body in enumerate(bodies):   # all from the empty table, through each member in turn
                r = http.post(f"{urls[i % 2]}/v1/namespaces/db/tables/t", json=body)
                assert r.status_code == 200, r.text
            changes = [{"identifier": {"namespace": ["db"], "name": "t"}, **client.append(base)}]
            for url in urls:   # DuckDB's way, through both members
                r = http.post(f"{url}/v1/transactions/commit", json={"table-changes": changes})
                assert r.status_code == 204, r.text
                changes = [{"identifier": {"namespace": ["db"], "name": "t"}, **client.append(base)}]
            md = http.get(f"{urls[1]}/v1/namespaces/db/tables/t").json()["metadata"]
        assert [e["snapshot-id"] for e in md["snapshot-log"]][:6] == [
            b["updates"][0]["snapshot"]["snapshot-id"] for b in bodies]
        assert [s["sequence-number"] for s in md["snapshots"]] == list(range(1, 9))
        assert len(client.data_files(md, md["current-snapshot-id"])) == 8
    finally:
        stop_all(members)


@pytest.mark.parametrize("route", ["table", "transaction"])
def test_a_rebased_append_passes_through_the_tables_actor_once(config, route):
    """An append whose branch moved on is read before it is offered (its table's actor here published the head
    it conflicts with), so its actor decides it once: one batch, not a first offer that asks for the files and a
    second with them."""
    from api.server import EmbeddedService
    service = EmbeddedService(config)
    with service as url, httpx.Client(base_url=url, timeout=30) as http:
        http.post("/v1/namespaces", json={"namespace": ["db"]}).raise_for_status()
        created = http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": REST_SCHEMA,
                                                               "properties": {REBASE_PROPERTY: "true"}})
        base = created.json()["metadata"]
        http.post("/v1/namespaces/db/tables/t", json=client.append(base)).raise_for_status()
        actor = service.coordinator.registry.actors[uuid.UUID(base["table-uuid"])]
        for n in range(3):   # each from the empty table: rebased onto the head the one before it made
            body = client.append(base)
            before = actor.batches
            if route == "table":
                answer = http.post("/v1/namespaces/db/tables/t", json=body)
            else:
                answer = http.post("/v1/transactions/commit", json={"table-changes": [
                    {"identifier": {"namespace": ["db"], "name": "t"}, **body}]})
            assert answer.status_code in (200, 204), answer.text
            assert actor.batches - before == 1
            assert service.coordinator.registry.actors[uuid.UUID(base["table-uuid"])] is actor
        md = http.get("/v1/namespaces/db/tables/t").json()["metadata"]
        assert md["current-snapshot-id"] == body["updates"][0]["snapshot"]["snapshot-id"]
        assert [s["sequence-number"] for s in md["snapshots"]] == [1, 2, 3, 4]
        rebased = next(float(line.split()[-1]) for line in http.get("/metrics").text.splitlines()
                       if line.startswith("coordinator_rebased_commits_total"))
        assert rebased == 3
