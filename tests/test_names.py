"""coordinator/names.py: a name's table id is cached, and a proposal to a table the actor says is gone is handed
over once more under the name's id resolved afresh."""

from __future__ import annotations

import uuid

import pytest
import trio

from coordinator.errors import NameMoved, NoSuchTable
from coordinator.names import Names


class Registry:
    """Answers proposals for the ids in `live`; any other id is gone (renamed: NameMoved)."""

    def __init__(self, live: set[uuid.UUID]):
        self.live, self.submitted = live, []

    async def submit(self, table_id, proposal):
        self.submitted.append(table_id)
        if table_id not in self.live:
            raise NameMoved("Table does not exist")
        return proposal


def names_over(ids: dict[str, uuid.UUID], registry: Registry) -> tuple[Names, list[str]]:
    resolved = []

    async def resolve(name: str) -> uuid.UUID:
        resolved.append(name)
        if name not in ids:
            raise NoSuchTable(f"no table {name}")
        return ids[name]
    return Names(registry, resolve, lambda name: NoSuchTable(f"Table does not exist: {name}")), resolved


def test_a_name_is_resolved_once_then_cached():
    a = uuid.uuid4()
    names, resolved = names_over({"t": a}, Registry({a}))
    assert trio.run(names.submit, "t", lambda: "load") == "load"
    assert trio.run(names.submit, "t", lambda: "load") == "load"
    assert resolved == ["t"]


def test_a_moved_name_is_resolved_again_once():
    old, new = uuid.uuid4(), uuid.uuid4()
    ids = {"t": old}
    registry = Registry({new})
    names, resolved = names_over(ids, registry)
    trio.run(names.id, "t")          # cached: the old id
    ids["t"] = new                   # renamed away and another table took the name
    assert trio.run(names.submit, "t", lambda: "load") == "load"
    assert registry.submitted == [old, new] and resolved == ["t", "t"]


def test_a_name_gone_for_good_raises_the_formats_not_found():
    a = uuid.uuid4()
    registry = Registry(set())
    names, resolved = names_over({"t": a}, registry)
    with pytest.raises(NoSuchTable, match="Table does not exist: t"):
        trio.run(names.submit, "t", lambda: "load")
    assert registry.submitted == [a, a]   # tried twice, no more
    with pytest.raises(NoSuchTable, match="no table u"):
        trio.run(names.submit, "u", lambda: "load")


def test_the_cache_is_bounded():
    names, _ = names_over({}, Registry(set()))
    names = Names(names.registry, names._resolve, names._gone, max_names=2)
    for i in range(5):
        names.remember(str(i), uuid.uuid4())
    assert len(names._refs) <= 2


def test_a_name_may_stand_for_more_than_its_id_and_the_proposal_is_made_from_that():
    """Lance: a name stands for its table's id and location, and the proposal is made from them (it reads the
    table's files first); when the table is gone, made again from what the name stands for afresh."""
    old, new = uuid.uuid4(), uuid.uuid4()
    refs = {"t": (old, "/wh/a")}

    async def resolve(name: str) -> tuple[uuid.UUID, str]:
        return refs[name]
    registry = Registry({new})
    names = Names(registry, resolve, lambda name: NoSuchTable(name), table_id=lambda ref: ref[0])
    assert trio.run(names.id, "t") == old
    refs["t"] = (new, "/wh/b")   # dropped, and declared again elsewhere

    async def make(ref: tuple[uuid.UUID, str]) -> str:
        await trio.sleep(0)   # (reads a staged manifest in its table's place)
        return f"a version at {ref[1]}"
    assert trio.run(names.submit_to, "t", make) == "a version at /wh/b"
    assert registry.submitted == [old, new]
