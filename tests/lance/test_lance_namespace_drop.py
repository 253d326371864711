"""A cascade namespace drop racing creates in it (spec, DropNamespace, Cascade: "all tables and child namespaces in
the namespace are dropped before the namespace is dropped"): a table declared meanwhile is dropped too, through
its actor, or its declare fails; nothing below a dropped namespace survives it, in the database or in memory."""

from __future__ import annotations

import threading
import time

import pytest
import trio

from coordinator.errors import NotFound
from storage.files import to_local_path

from .conftest import coord  # noqa: F401 - the fixture: the coordinator in process
from .test_lance_rest import NS, TABLE, ok


async def test_tables_and_namespaces_created_while_a_cascade_drop_runs_are_dropped_with_it(coord, monkeypatch):
    """Deterministic: between the drop's round of table drops and its transaction, a table is declared in the
    namespace and a child namespace with a table is created (by another member of a cluster, or by requests
    that passed this member's gate before the drop began). The transaction sees them and the drop goes round
    again, through the new tables' actors. A create that arrives here while the drop runs is refused (409)."""
    from coordinator.errors import CommitConflict

    lance = coord.lance
    await lance.create_namespace(("n",), None, None)
    await lance.declare_table(("n", "before"), None, None)
    drop_namespace, rounds = coord.store.drop_namespace, []

    async def racing_drop_namespace(*args, **kwargs):
        rounds.append(1)
        if len(rounds) == 1:
            with pytest.raises(CommitConflict):
                await lance.declare_table(("n", "refused"), None, None)
            with monkeypatch.context() as elsewhere:
                elsewhere.setattr(lance.namespaces, "not_being_dropped", lambda ns: None)
                late.append(await lance.declare_table(("n", "late"), None, None))
                await lance.create_namespace(("n", "sub"), None, None)
                late.append(await lance.declare_table(("n", "sub", "late"), None, None))
            await lance.describe_table(("n", "late"))          # its actor holds it in memory
        return await drop_namespace(*args, **kwargs)
    late = []
    monkeypatch.setattr(coord.store, "drop_namespace", racing_drop_namespace)
    await lance.drop_namespace(("n",), None, "cascade")
    assert len(rounds) == 2
    for ident in (("n", "before"), ("n", "late"), ("n", "sub", "late"), ("n", "refused")):
        with pytest.raises(NotFound):
            await lance.describe_table(ident)
    assert (await lance.list_tables(None, None, None)).items == []
    for ns in (("n",), ("n", "sub")):
        with pytest.raises(NotFound):
            await lance.describe_namespace(ns)
    for table in late:   # dropped through their actors: purged
        for _ in range(100):
            if not to_local_path(table.location).exists():
                break
            await trio.sleep(0.05)
        assert not to_local_path(table.location).exists(), table.location
    await lance.create_namespace(("n",), None, None)
    await lance.create_namespace(("n", "sub"), None, None)
    assert (await lance.list_tables(("n", "sub"), None, None)).items == []


def test_a_cascade_drop_racing_declares_leaves_no_table_behind(http):
    """Real HTTP, real races: writers declare tables in the namespace and in a child while it is dropped. After
    the drop every table answers 404, the listing is empty, and the namespace created again is empty."""
    ok(http.post(f"{NS}/r/create", json={}))
    ok(http.post(f"{NS}/r$sub/create", json={}))
    for i in range(60):   # the drop's rounds take a while
        ok(http.post(f"{TABLE}/r$pre{i}/declare", json={}))
    stop, declared = threading.Event(), []

    def declarer(where: str) -> None:
        import httpx
        with httpx.Client(base_url=str(http.base_url), timeout=60) as client:
            i = 0
            while not stop.is_set():
                name = f"{where}$t{i}"
                i += 1
                if client.post(f"{TABLE}/{name}/declare", json={}).status_code == 200:
                    declared.append(name)
                client.post(f"{NS}/{where}$n{i}/create", json={})
    threads = [threading.Thread(target=declarer, args=(where,)) for where in ("r", "r$sub")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30   # the declarers are under way (a busy machine may take a while to start them)
    while not declared and time.monotonic() < deadline:
        time.sleep(0.05)
    r = http.post(f"{NS}/r/drop", json={"behavior": "Cascade"})
    stop.set()
    for t in threads:
        t.join()
    assert r.status_code == 200, r.text
    assert declared, "no declare raced the drop"
    assert ok(http.get(TABLE, params={"limit": 10000})) == {"tables": []}
    for name in declared:
        assert http.post(f"{TABLE}/{name}/describe", json={}).status_code == 404, name
    ok(http.post(f"{NS}/r/create", json={}))
    ok(http.post(f"{NS}/r$sub/create", json={}))
    assert ok(http.get(f"{NS}/r$sub/table/list")) ["tables"] == []
    assert ok(http.get(f"{NS}/r$sub/list"))["namespaces"] == []
