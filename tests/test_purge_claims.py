"""Claims on dropped tables' locations (table `purges`, coordinator/purges.py) between members of a cluster."""

from __future__ import annotations

from storage.files import location_key
from tests.support import sql
from tests.lance.conftest import coord  # noqa: F401 - the fixture: the coordinator in process


async def test_only_one_member_takes_over_a_claim_nobody_renewed(coord):
    """Members resuming deletions at once (a rolling restart): exactly one may resume a stale claim; the others
    would outlive it (Resumer.resume_forever)."""
    location = f"{coord.config.warehouse_uri}/stale"
    await coord.store.with_connection(lambda con: con.execute(
        "INSERT INTO purges (location_key, location, renewed_at) VALUES ($1, $2, now() - interval '20 minutes')",
        location_key(location), location))
    assert await coord.store.pending_purges(600) == [location]
    taken = [await coord.store.take_over_purge(location, 600) for _ in range(3)]
    assert taken[0] is not None and taken[1:] == [None, None] and await coord.store.pending_purges(600) == []


def test_claims_are_taken_over_before_anything_is_served(config, monkeypatch):
    """At start-up the claims a crash left are taken over before the first request is served: a client asking from
    the first moment (the port is known beforehand) is answered only after the take-over, however slow the
    database is then; and the claim's location is deleted once."""
    import threading
    import time

    import httpx
    import trio

    from api.server import EmbeddedService
    from storage.embedded import free_port
    from storage.files import FileIO
    from storage.postgres import PostgresStore

    left = f"{config.warehouse_uri}/left-by-a-crash"
    sql(config.database_url, "INSERT INTO purges (location_key, location) VALUES ($1, $2)", location_key(left), left)
    events: list[str] = []
    take_over = PostgresStore.take_over_purge

    async def slow_take_over(self, location, older_than_s):
        await trio.sleep(1.0)   # a slow database at start-up: nothing may be served meanwhile
        owner = await take_over(self, location, older_than_s)
        events.append(f"took over {location}")
        return owner

    async def delete_tree(self, location, stop=None):
        events.append(f"deleted {location}")
    monkeypatch.setattr(PostgresStore, "take_over_purge", slow_take_over)
    monkeypatch.setattr(FileIO, "delete_tree", delete_tree)
    config.port = free_port()
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            try:
                r = httpx.get(f"http://127.0.0.1:{config.port}/v1/namespaces", timeout=5)
            except httpx.TransportError:   # not listening yet
                time.sleep(0.01)
                continue
            events.append(f"served {r.status_code}")
            return
    asker = threading.Thread(target=ask)
    asker.start()
    try:
        with EmbeddedService(config):
            asker.join(timeout=60)
            deadline = time.monotonic() + 10
            while f"deleted {left}" not in events and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sql(config.database_url, "SELECT location FROM purges") == []
    finally:
        stop.set()
        asker.join(timeout=10)
    assert events[0] == f"took over {left}" and "served 200" in events, events
    assert events.count(f"deleted {left}") == 1, events


async def test_a_drop_holds_its_own_claim_renewed_while_its_deletion_runs(config, nursery, monkeypatch):
    """A drop served holds a claim of its own on the location while its deletion runs: it is deleted once (the
    start-up's take-over had nothing to take), and the claim ends when the deletion does."""
    import trio

    from coordinator.purges import delete_own_location
    from storage.files import FileIO
    from tests.lance.conftest import coordinator_in_process

    deleted, release = [], trio.Event()

    async def delete_tree(self, location, stop=None):
        deleted.append(location)
        await release.wait()
    monkeypatch.setattr(FileIO, "delete_tree", delete_tree)
    async with coordinator_in_process(config, nursery) as c:
        dropped = f"{config.warehouse_uri}/dropped-now"
        await c.store.with_connection(lambda con: con.execute(
            "INSERT INTO purges (location_key, location) VALUES ($1, $2)", location_key(dropped), dropped))
        nursery.start_soon(delete_own_location, c.store, c.files, dropped)
        await trio.sleep(1.5)
        assert deleted == [dropped] and await c.store.pending_purges(0) == [dropped]
        release.set()
        await trio.sleep(0.2)
        assert deleted == [dropped] and await c.store.pending_purges(0) == []


async def test_claims_waiting_their_turn_stay_renewed_so_no_member_takes_them_again(config, nursery, monkeypatch):
    """Members of a cluster: a member takes several stale claims over and deletes them one after another; those
    waiting their turn are renewed meanwhile, so a member starting then does not delete them a second time."""
    import dataclasses

    import trio

    from coordinator import purges as registry_module
    from coordinator.metrics import Metrics
    from coordinator.registry import Registry
    from storage.files import FileIO
    from tests.lance.conftest import coordinator_in_process

    first, second = f"{config.warehouse_uri}/left-a", f"{config.warehouse_uri}/left-b"
    deleted, release = [], trio.Event()

    async def delete_tree(self, location, stop=None):
        deleted.append(location)
        if location == first:
            await release.wait()       # a large table on an object store: longer than PURGE_RETRY_S
    monkeypatch.setattr(FileIO, "delete_tree", delete_tree)
    async with coordinator_in_process(config, nursery) as c:   # only for its store (takes nothing: no claims yet)
        for loc in (first, second):   # left by a crash of the whole cluster an hour ago
            await c.store.with_connection(lambda con, loc=loc: con.execute(
                "INSERT INTO purges (location_key, location, renewed_at) VALUES ($1, $2, now() - interval '1 hour')",
                location_key(loc), loc))
        monkeypatch.setattr(registry_module, "PURGE_RETRY_S", 1)
        member = dataclasses.replace(config, cluster=True)
        a = Registry(member, c.store, c.files, Metrics())
        await nursery.start(a.run)     # member A takes both over; deletes `first`, `second` waits its turn
        await trio.sleep(1.5)
        b = Registry(member, c.store, c.files, Metrics())
        await nursery.start(b.run)     # member B starts: `second` was not renewed for PURGE_RETRY_S
        await trio.sleep(0.3)
        release.set()
        await trio.sleep(0.5)
        assert deleted.count(second) == 1, deleted


def _watch_deletions(monkeypatch, rounds):
    """Deletions of a location (FileIO.delete_tree_sync, delete_listed_sync) that take `rounds(n)` x 50 ms (n: how
    many began before it), stopping when asked, counted as they run. Returns (locations begun, [most at once],
    deletions running each time a claim was ended)."""
    import threading
    import time

    from storage.files import FileIO
    from storage.postgres import PostgresStore

    lock, running, most, started, at_end = threading.Lock(), [0], [0], [], []

    def delete_tree_sync(self, where, stop=None):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            begun = len(started)
            started.append(where)
        try:
            for _ in range(rounds(begun)):
                if stop is not None and stop():
                    raise OSError("stopped")
                time.sleep(0.05)
        finally:
            with lock:
                running[0] -= 1
    monkeypatch.setattr(FileIO, "delete_tree_sync", delete_tree_sync)
    # (a Lance table at a place its client chose loses only Lance's files there: a listed deletion)
    monkeypatch.setattr(FileIO, "delete_listed_sync", lambda self, where, uris, stop=None:
                        delete_tree_sync(self, where, stop))
    end_purge = PostgresStore.end_purge

    async def recording_end_purge(self, where, owner):
        at_end.append(running[0])
        await end_purge(self, where, owner)
    monkeypatch.setattr(PostgresStore, "end_purge", recording_end_purge)
    return started, most, at_end


async def _deleting_member(config, nursery, monkeypatch, *, renew_fails: bool = False,
                           shut_down_at: float | None = None):
    """Member A takes over a stale claim and deletes it slowly (a thread, chunk by chunk, as the real one: it cannot
    be cancelled); member B starts 1.5 s later. PURGE_RETRY_S is 1 s. Returns (deletions started, most at once,
    deletion threads running when the claim was ended)."""
    import dataclasses

    import trio

    from coordinator import purges as registry_module
    from coordinator.metrics import Metrics
    from coordinator.registry import Registry
    from storage.postgres import PostgresStore
    from tests.lance.conftest import coordinator_in_process

    location = f"{config.warehouse_uri}/big-table"
    started, most, at_end = _watch_deletions(monkeypatch, lambda begun: 1 if begun else 60)
    async with coordinator_in_process(config, nursery) as c:
        await c.store.with_connection(lambda con: con.execute(
            "INSERT INTO purges (location_key, location, renewed_at) VALUES ($1, $2, now() - interval '1 hour')",
            location_key(location), location))
        monkeypatch.setattr(registry_module, "PURGE_RETRY_S", 1)
        renew_purge = PostgresStore.renew_purge
        if renew_fails:   # member A (alone renewing here) cannot reach the database to renew
            async def no_renewal(self, where, owner):
                raise OSError("database unreachable")
            monkeypatch.setattr(PostgresStore, "renew_purge", no_renewal)
        member = dataclasses.replace(config, cluster=True)
        a = trio.CancelScope()

        async def member_a():
            with a:
                async with trio.open_nursery() as n:
                    await n.start(Registry(member, c.store, c.files, Metrics()).run)
        nursery.start_soon(member_a)
        if shut_down_at is not None:
            await trio.sleep(shut_down_at)
            a.cancel()
        await trio.sleep(1.5 - (shut_down_at or 0))
        if renew_fails:
            monkeypatch.setattr(PostgresStore, "renew_purge", renew_purge)   # B reaches the database
        await nursery.start(Registry(member, c.store, c.files, Metrics()).run)
        await trio.sleep(4)
        return started, most[0], at_end


async def test_a_member_shut_down_mid_deletion_stops_deleting_and_leaves_its_claim(config, nursery, monkeypatch):
    started, most, at_end = await _deleting_member(config, nursery, monkeypatch, shut_down_at=0.3)
    assert len(started) == 2 and most == 1 and at_end == [0], (started, most, at_end)


async def test_a_deletion_that_cannot_renew_its_claim_stops_before_another_member_takes_it(
        config, nursery, monkeypatch):
    started, most, at_end = await _deleting_member(config, nursery, monkeypatch, renew_fails=True)
    assert len(started) == 2 and most == 1 and at_end == [0], (started, most, at_end)


async def test_a_claim_taken_over_is_renewed_and_ended_only_by_its_new_owner(coord):
    """The member that served a drop froze mid-deletion (a paused VM) and another took its claim over. Waking, the
    first may neither renew nor end the claim: the other's deletion may still be running, and a table created at
    the location meanwhile would lose its files to it."""
    location = f"{coord.config.warehouse_uri}/frozen"
    await coord.store.with_connection(lambda con: con.execute(
        "INSERT INTO purges (location_key, location, renewed_at) VALUES ($1, $2, now() - interval '20 minutes')",
        location_key(location), location))
    assert await coord.store.renew_purge(location, None)   # the drop's own claim, before anyone took it
    await coord.store.with_connection(lambda con: con.execute(
        "UPDATE purges SET renewed_at = now() - interval '20 minutes'"))
    owner = await coord.store.take_over_purge(location, 600)
    assert owner is not None
    assert not await coord.store.renew_purge(location, None)
    await coord.store.end_purge(location, None)
    assert await coord.store.pending_purges(0) == [location]
    assert await coord.store.location_taken(location)       # creates there still refused
    assert await coord.store.renew_purge(location, owner)
    await coord.store.end_purge(location, owner)
    assert await coord.store.pending_purges(0) == []


async def _slow_deletion(coord, monkeypatch, meanwhile):
    """Delete a claimed location with delete_own_location (the drop's member: owner None), its files removed one
    by one every 50 ms, PURGE_RETRY_S 1 s; `meanwhile()` runs 0.3 s in. Returns (the error, files deleted)."""
    import time

    import trio

    from coordinator import purges as registry_module
    from coordinator.purges import delete_own_location
    from storage.files import FileIO, to_local_path

    location = f"{coord.config.warehouse_uri}/slow-drop"
    root = to_local_path(location)
    root.mkdir(parents=True)
    for i in range(40):
        (root / f"{i:02}.parquet").write_bytes(b"x")
    deleted = []
    unlink = FileIO.delete_tree_sync

    def slow_delete_tree_sync(self, where, stop=None):
        def slow_stop():
            time.sleep(0.05)
            deleted.append(1)
            return stop()
        unlink(self, where, slow_stop)
    monkeypatch.setattr(FileIO, "delete_tree_sync", slow_delete_tree_sync)
    monkeypatch.setattr(registry_module, "PURGE_RETRY_S", 1)
    await coord.store.with_connection(lambda con: con.execute(
        "INSERT INTO purges (location_key, location) VALUES ($1, $2)", location_key(location), location))
    error = []

    async def drop_member():
        try:
            await delete_own_location(coord.store, coord.files, location)
        except Exception as exc:
            error.append(exc)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(drop_member)
        await trio.sleep(0.3)
        await meanwhile(location)
    return (error[0] if error else None), len(deleted), location


async def test_a_deletion_stops_and_keeps_off_a_claim_another_member_took_over(coord, monkeypatch):
    from storage.files import DeletionStopped

    owners = []

    async def another_member_takes_it_over(location):
        # (taken over however recently it was renewed: the deleting member renews every 0.1 s, so a renewal could
        # land between making the claim look stale and taking it over, and then nothing was taken over)
        owners.append(await coord.store.take_over_purge(location, 0))
    error, deleted, location = await _slow_deletion(coord, monkeypatch, another_member_takes_it_over)
    assert isinstance(error, DeletionStopped) and deleted < 40, (error, deleted)
    assert owners[0] is not None and await coord.store.pending_purges(0) == [location]   # the new owner's


async def test_a_deletion_whose_renewal_hangs_stops_by_the_clock(coord, monkeypatch):
    """A renewal stuck in the database (or a process that froze) must not leave the deletion running past the time
    after which another member may take its claim over: the deletion thread checks the clock itself."""
    import trio

    from storage.files import DeletionStopped
    from storage.postgres import PostgresStore

    async def hangs(location):
        async def stuck(self, where, owner):
            await trio.sleep_forever()
        monkeypatch.setattr(PostgresStore, "renew_purge", stuck)
    error, deleted, location = await _slow_deletion(coord, monkeypatch, hangs)
    assert isinstance(error, DeletionStopped) and 8 <= deleted < 40, (error, deleted)
    assert await coord.store.pending_purges(0) == [location]


async def test_a_member_whose_claim_was_taken_over_and_ended_deletes_nothing(coord):
    """The member that served the drop froze before its deletion began; another took the claim over, deleted
    what the metadata reaches (a place the client chose) and ended the claim. Waking, the first finds the claim
    no longer its own and touches nothing: not the whole place, where a table dropped without purge kept files."""
    import orjson

    from coordinator.purges import delete_own_location
    from storage.files import to_local_path

    location = f"{coord.config.warehouse_uri}/client-chosen"
    root = to_local_path(location)
    (root / "metadata").mkdir(parents=True)
    meta = root / "metadata" / "00001-x.metadata.json"
    meta.write_bytes(orjson.dumps({"location": location, "snapshots": []}))
    kept = root / "data" / "kept-by-another-table.parquet"
    kept.parent.mkdir()
    kept.write_bytes(b"keep me")
    await coord.store.with_connection(lambda con: con.execute(
        "INSERT INTO purges (location_key, location, metadata_location, renewed_at)"
        " VALUES ($1, $2, $3, now() - interval '20 minutes')", location_key(location), location, meta.as_uri()))
    owner = await coord.store.take_over_purge(location, 600)
    assert await delete_own_location(coord.store, coord.files, location, owner, coord.registry.purge_listing)
    assert kept.exists() and not meta.exists() and await coord.store.pending_purges(0) == []
    assert not await delete_own_location(coord.store, coord.files, location, None, coord.registry.purge_listing)
    assert kept.exists()


async def test_two_drops_at_one_location_do_not_both_delete(coord, monkeypatch):
    """Tables sharing a location (rows from before locations were exclusive) dropped at once: the second drop's
    claim is not inserted (ON CONFLICT DO NOTHING). Each drop's claim has its own owner token, so the second
    cannot take the first's claim for its own and delete alongside it, or end it while the first still deletes."""

    import trio

    from storage.postgres import PostgresStore

    lance = coord.lance
    await lance.create_namespace(("db",), None, None)
    shared = (await lance.declare_table(("db", "a"), None, None)).location   # its own: a drop deletes it all
    other = f"{coord.config.warehouse_uri}/elsewhere"
    await lance.declare_table(("db", "b"), other, None)
    # From before locations were exclusive: b lives at the same place as a.
    await coord.store.with_connection(lambda con: con.execute(
        "UPDATE tables SET location=$1, location_key=$2 WHERE name='b'", shared, location_key(shared)))
    lance.names.forget(("db", "b"))   # (its cached location is stale)

    _, most, ended_while_running = _watch_deletions(monkeypatch, lambda begun: 10)
    deletions = []
    confirm = PostgresStore.confirm_purge

    async def slow_confirm(self, where, owner):   # the deletions start a moment after their drops (spawned tasks)
        await trio.sleep(0.2)
        result = await confirm(self, where, owner)
        deletions.append(result)
        return result
    monkeypatch.setattr(PostgresStore, "confirm_purge", slow_confirm)
    async with trio.open_nursery() as n:   # two clients drop the two tables at once
        n.start_soon(lance.drop_table, ("db", "a"))
        n.start_soon(lance.drop_table, ("db", "b"))
    await trio.sleep(1.5)
    # One deletion of `shared` at a time, and the claim ended only when none of it runs: the drop whose claim
    # was not inserted (another held the place) finds the claim not its own and deletes nothing.
    assert sorted(ours for ours, _ in deletions) == [False, True], deletions
    assert most[0] == 1 and all(n == 0 for n in ended_while_running), (most[0], ended_while_running)
