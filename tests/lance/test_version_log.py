"""A Lance table's version list (`VersionLog`): successive states share one list, each sees its own prefix, and a
page of it is found by bisection. Pure values; the HTTP paging rules are in test_lance_rest.py."""

from __future__ import annotations


import pytest

from coordinator.lance.state import LanceTable, TableVersion


def version(n: int) -> TableVersion:
    return TableVersion(n, f"file:///t/_versions/{n}.manifest", 100, 0)


@pytest.fixture
def states() -> list[LanceTable]:
    out = [LanceTable(("ns",), "t", "file:///t")]
    for n in range(1, 41):
        out.append(out[-1].with_version(version(n)))
    return out


def numbers(versions) -> list[int]:
    return [v.version for v in versions]


def test_each_state_keeps_its_own_versions(states):
    assert [len(s.versions) for s in states] == list(range(41))
    assert numbers(states[10].versions) == list(range(1, 11))
    assert states[10].latest.version == 10 and states[10].find(11) is None
    assert states[40].find(11).version == 11 and states[0].latest is None


def test_appending_to_an_older_state_leaves_the_newer_one_alone(states):
    # The actor goes back to the state before a refused write and commits another version on top of it.
    branch = states[20].with_version(version(21))
    assert numbers(branch.versions) == list(range(1, 22))
    assert numbers(states[40].versions) == list(range(1, 41))
    assert numbers(states[40].with_version(version(41)).versions) == list(range(1, 42))
    assert numbers(states[20].versions) == list(range(1, 21))
    with pytest.raises(ValueError):
        states[20].with_version(version(20))


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("limit", [None, 0, 1, 3, 100])
@pytest.mark.parametrize("after", [None, 0, 1, 7, 40, 41, 60])
def test_a_page_is_what_filtering_the_whole_list_gives(states, after, limit, descending):
    table = states[40].without_ranges([(5, 9)])[0]   # a gap: versions deleted
    expected = numbers(table.versions)[::-1] if descending else numbers(table.versions)
    if after is not None:
        expected = [n for n in expected if (n < after if descending else n > after)]
    if limit is not None:
        expected = expected[:limit]
    assert numbers(table.page(after, limit, descending)) == expected


def test_a_state_sent_to_another_member_carries_only_its_versions(states):
    from coordinator.cluster.wire import Codec
    received = Codec({}).loads(Codec({}).dumps(states[10]))
    assert numbers(received.versions) == list(range(1, 11)) and received == states[10]


def test_only_the_latest_versions_stay_in_memory(monkeypatch):
    from coordinator.lance import state as lance_state
    monkeypatch.setattr(lance_state, "VERSIONS_KEPT", 3)
    t = LanceTable(("ns",), "t", "file:///t")
    for n in range(1, 8):
        t = t.with_version(version(n))
    # Trimmed to the latest 3 once over twice that: at most 2 x VERSIONS_KEPT, O(1) per append on average.
    assert numbers(t.versions) == [5, 6, 7] and not t.complete and t.high_water == 7
    assert t.covers(5) and t.covers(8) and not t.covers(4) and t.find(4) is None
    # What memory can answer, it does; what reaches back, it leaves to the commit log (None).
    assert numbers(t.page(None, 2, True)) == [7, 6] and t.page(None, 3, True) is not None
    assert t.page(None, 4, True) is None and t.page(6, 2, True) is None
    assert numbers(t.page(4, 10, False)) == [5, 6, 7] and t.page(3, 10, False) is None
    assert t.page(None, 1, False) is None
    idle = t.dormant()
    assert len(idle.versions) == lance_state.VERSIONS_KEPT_IDLE or numbers(idle.versions) == [5, 6, 7]
    assert idle.latest.version == 7 and not idle.complete


def test_an_idle_table_keeps_its_latest_versions_only(states):
    idle = states[40].dormant()
    assert numbers(idle.versions) == [37, 38, 39, 40] and not idle.complete and idle.high_water == 40
    assert states[3].dormant() is states[3]   # small enough to keep whole


def test_a_delete_counted_before_another_delete_applied_is_counted_again(monkeypatch):
    """Two deletes of one old range at once both count its records in the log: the second to reach the actor
    must count again (it would report records the first already deleted)."""
    from coordinator.errors import Recount
    from coordinator.lance import state as lance_state
    from coordinator.lance.proposals import DeleteVersions
    monkeypatch.setattr(lance_state, "VERSIONS_KEPT", 3)
    t = LanceTable(("ns",), "t", "file:///t")
    for n in range(1, 8):
        t = t.with_version(version(n))
    first, second = (DeleteVersions([(1, 3)], t.log_below, 2, t.deletes) for _ in range(2))
    decided = first.decide(t)
    assert decided.reply == 2 and decided.log_delete == [(1, 3)]
    with pytest.raises(Recount):
        second.decide(decided.state)
    # Counted again in the new state, it finds nothing left to delete.
    assert DeleteVersions([(1, 3)], decided.state.log_below, 0, decided.state.deletes).decide(
        decided.state).reply == 0
