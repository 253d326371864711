"""Table actors on a real PostgreSQL store, with a trivial counter format so the tests are about sequencing."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import pytest
import trio

from coordinator.decision import Decision
from coordinator.errors import CommitConflict, Unavailable
from coordinator.service import Coordinator
from storage.records import LogEntry, TableRow


@dataclass(frozen=True)
class Counter:
    n: int


@dataclass
class Increment:
    expect: int | None = None  # reject unless the counter currently holds this

    def decide(self, state: Counter) -> Decision:
        if self.expect is not None and state.n != self.expect:
            raise CommitConflict(f"expected {self.expect}, found {state.n}")
        new = Counter(state.n + 1)
        return Decision(new, reply=new.n, row_state={"n": new.n}, log=[LogEntry(new.n, {"n": new.n})])


@dataclass
class Read:
    def decide(self, state: Counter) -> Decision:
        return Decision(state, reply=state.n)


async def _open(config, nursery) -> Coordinator:
    c = Coordinator(config)
    await trio.to_thread.run_sync(c.open)
    c.registry.register_format("counter", _load_counter)
    await nursery.start(c.run)
    return c


@pytest.fixture
async def coord(config, nursery):
    c = await _open(config, nursery)
    yield c
    await _close(c, nursery)


async def _close(c: Coordinator, nursery) -> None:
    nursery.cancel_scope.cancel()
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(c.close)


async def _load_counter(row: TableRow) -> Counter:
    return Counter(row.state["n"])


async def new_counter(coord: Coordinator) -> uuid.UUID:
    table_id = uuid.uuid4()
    row = TableRow(table_id=table_id, realm="test", catalog="", namespace="", name=str(table_id),
                   format="counter", location=None)
    await coord.registry.create(row, state=Counter(0), row_state={"n": 0}, log_entries=[LogEntry(0, {"n": 0})])
    return table_id


async def test_concurrent_commits_are_sequenced_and_batched(coord):
    table_id = await new_counter(coord)
    replies = []

    async def one():
        replies.append(await coord.registry.submit(table_id, Increment()))

    async with trio.open_nursery() as n:
        for _ in range(60):
            n.start_soon(one)
    assert sorted(replies) == list(range(1, 61))
    log = await coord.store.read_log(table_id)
    assert [e.version for e in log] == list(range(0, 61))
    actor = coord.registry.actors[table_id]
    assert actor.batches < 60, "concurrent requests should share batches"
    row = await coord.store.get_table(table_id)
    assert row.state == {"n": 60} and row.row_version == 61


async def test_rejection_does_not_poison_the_batch(coord):
    table_id = await new_counter(coord)
    actor = coord.registry.owner(table_id)
    # Queue in one tick so they land in one batch: the 2nd expects a stale value, the 3rd sees the 1st.
    r1 = actor.offer(Increment(expect=0))
    r2 = actor.offer(Increment(expect=0))
    r3 = actor.offer(Increment(expect=1))
    r4 = actor.offer(Read())
    assert await r1.wait() == 1
    with pytest.raises(CommitConflict, match="expected 0, found 1"):
        await r2.wait()
    assert await r3.wait() == 2
    assert await r4.wait() == 2
    assert actor.last_batch_size == 4
    assert [e.version for e in await coord.store.read_log(table_id)] == [0, 1, 2]


async def test_full_mailbox_answers_unavailable_and_applies_nothing(config, nursery):
    config.mailbox_size = 2
    c = await _open(config, nursery)
    try:
        table_id = await new_counter(c)
        actor = c.registry.owner(table_id)
        accepted = [actor.offer(Increment()), actor.offer(Increment())]
        with pytest.raises(Unavailable) as info:
            actor.offer(Increment())
        assert info.value.retry_after_s >= 1
        assert [await r.wait() for r in accepted] == [1, 2]
        assert (await c.store.get_table(table_id)).state == {"n": 2}
    finally:
        await _close(c, nursery)


async def test_idle_actor_retires_and_reloads_from_store(config, nursery):
    config.actor_idle_s = 0.05
    c = await _open(config, nursery)
    try:
        table_id = await new_counter(c)
        assert await c.registry.submit(table_id, Increment()) == 1
        first = c.registry.actors[table_id]
        await trio.sleep(0.3)
        assert table_id not in c.registry.actors
        assert await c.registry.submit(table_id, Increment()) == 2
        assert c.registry.actors[table_id] is not first
    finally:
        await _close(c, nursery)


async def test_failed_write_answers_nobody_success_and_reloads(coord, monkeypatch):
    table_id = await new_counter(coord)
    assert await coord.registry.submit(table_id, Increment()) == 1
    real_write = coord.store.write

    async def failing_write(group):
        raise Unavailable("database unavailable: injected")

    monkeypatch.setattr(coord.store, "write", failing_write)
    actor = coord.registry.owner(table_id)
    replies = [actor.offer(Increment()) for _ in range(3)]
    for r in replies:
        with pytest.raises(Unavailable):
            await r.wait()
    monkeypatch.setattr(coord.store, "write", real_write)
    # The actor reloaded the durable state (1), so the next commit is 2, not 5.
    assert await coord.registry.submit(table_id, Increment()) == 2


async def test_stale_row_is_not_applied_and_does_not_fail_others(coord):
    a, b = await new_counter(coord), await new_counter(coord)
    assert await coord.registry.submit(a, Increment()) == 1
    # Someone else (a former owner, or a bug) moves table a's row behind its actor's back.
    await coord.store._call(lambda con: con.execute("UPDATE tables SET row_version = row_version + 10"
                                                   " WHERE table_id = $1", a))
    ra = coord.registry.owner(a).offer(Increment())
    rb = coord.registry.owner(b).offer(Increment())
    with pytest.raises(Unavailable, match="changed concurrently"):
        await ra.wait()
    assert await rb.wait() == 1
    # After reloading, table a serves again from its durable state.
    assert await coord.registry.submit(a, Increment()) == 2


async def test_group_commit_coalesces_tables_into_few_transactions(coord):
    tables = [await new_counter(coord) for _ in range(40)]
    before = coord.store.writer_stats()["flushes"]

    async def bump(t):
        await coord.registry.submit(t, Increment())

    async with trio.open_nursery() as n:
        for t in tables:
            n.start_soon(bump, t)
    flushes = coord.store.writer_stats()["flushes"] - before
    assert flushes < 40, f"{flushes} flushes for 40 concurrent commits: group commit is not coalescing"
    for t in tables:
        assert (await coord.store.get_table(t)).state == {"n": 1}


@dataclass
class KeyedIncrement:
    """An Increment carrying an Idempotency-Key, recorded with the change like the Iceberg routes do."""
    key: uuid.UUID

    def decide(self, state: Counter) -> Decision:
        from storage.records import IdempotencyRecord
        new = Counter(state.n + 1)
        return Decision(new, reply=new.n, row_state={"n": new.n}, log=[LogEntry(new.n, {"n": new.n})],
                        idempotency=IdempotencyRecord(self.key, "increment", 200, str(new.n).encode()))


async def test_one_idempotency_key_applies_once_even_without_the_members_serializing(coord):
    """Two members may hand the owner the same keyed request at once (each checked the store and found nothing):
    the owner applies it once and the other learns it is a duplicate, whose recorded answer is the first's."""
    from coordinator.errors import DuplicateRequest
    table_id = await new_counter(coord)
    key = uuid.uuid4()
    outcomes = []

    async def one():
        try:
            outcomes.append(await coord.registry.submit(table_id, KeyedIncrement(key)))
        except DuplicateRequest:
            outcomes.append("duplicate")

    async with trio.open_nursery() as n:  # same batch
        for _ in range(3):
            n.start_soon(one)
    await one()                           # later, once durable
    assert sorted(outcomes, key=str) == [1, "duplicate", "duplicate", "duplicate"]
    assert await coord.registry.submit(table_id, Read()) == 1

    async def op() -> int:
        await coord.registry.submit(table_id, KeyedIncrement(key))
        raise AssertionError("applied twice")
    answer = await coord.idempotency.run(key, "increment", op)
    assert (answer.status, answer.body) == (200, b"1")  # replayed from the store (found before running op)
    coord.idempotency.store = _Forgetful(coord.store, key)  # as if the other member's check raced the first
    answer = await coord.idempotency.run(key, "increment", lambda: coord.registry.submit(
        table_id, KeyedIncrement(key)))
    assert (answer.status, answer.body) == (200, b"1") and await coord.registry.submit(table_id, Read()) == 1


class _Forgetful:
    """The store, except that the first lookup of `key` finds nothing (a member that checked before the first
    request with the key was durable)."""

    def __init__(self, store, key):
        self.store, self.key, self.hidden = store, key, True

    async def get_idempotency(self, key):
        if key == self.key and self.hidden:
            self.hidden = False
            return None
        return await self.store.get_idempotency(key)

    def __getattr__(self, name):
        return getattr(self.store, name)


async def test_idle_table_goes_dormant_and_wakes_without_reading_the_store(config, nursery, monkeypatch):
    """An idle actor's task ends and its table stays in memory compact (dormant); the next request starts a new
    actor from it. Beyond `dormant_tables_max` the least recently used are forgotten and reload from the store."""
    config.actor_idle_s = 0.05
    config.dormant_tables_max = 1
    c = await _open(config, nursery)
    try:
        a, b = await new_counter(c), await new_counter(c)
        assert await c.registry.submit(a, Increment()) == 1
        await trio.sleep(0.3)
        assert a not in c.registry.actors and list(c.registry.dormant) == [a]
        reads = []
        real_get = c.store.get_table

        async def counting_get(table_id):
            reads.append(table_id)
            return await real_get(table_id)
        monkeypatch.setattr(c.store, "get_table", counting_get)
        assert await c.registry.submit(a, Increment()) == 2 and reads == []    # woke from memory
        assert a not in c.registry.dormant
        assert await c.registry.submit(b, Increment()) == 1 and reads == [b]  # b was forgotten (max 1)
        await trio.sleep(0.3)
        assert len(c.registry.dormant) == 1  # one kept, the least recently used forgotten
        forgotten = a if list(c.registry.dormant) == [b] else b
        reads.clear()
        assert await c.registry.submit(forgotten, Read()) in (1, 2) and reads == [forgotten]  # reloaded
    finally:
        await _close(c, nursery)
