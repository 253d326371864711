"""A version delete's `deleted_count` and the records it removes, when some versions are only in the commit log
(VERSIONS_KEPT made 3): a batch whose create moves the window, and a count that another delete and a reload made
stale. In process (the coordinator without HTTP), so the moment between counting and deciding can be chosen."""

from __future__ import annotations

import pytest

from coordinator import actor as actor_module
from coordinator.errors import CommitConflict
from coordinator.lance import state as lance_state
from coordinator.lance.models import BatchDeleteTableVersionsRequest, CreateTableVersionRequest, VersionRange
from tests.lance.conftest import stage

T = ("t",)


@pytest.fixture
def tiny_window(monkeypatch):
    monkeypatch.setattr(lance_state, "VERSIONS_KEPT", 3)


def create(location: str, version: int) -> CreateTableVersionRequest:
    return CreateTableVersionRequest(version=version, manifest_path=stage(location, version))


def delete(start: int, end: int) -> BatchDeleteTableVersionsRequest:
    return BatchDeleteTableVersionsRequest(ranges=[VersionRange(start_version=start, end_version=end)])


async def recorded(catalog) -> list[int]:
    return [v.version for v in (await catalog.list_table_versions(T, None, None, False)).items]


async def reload(catalog, location: str) -> None:
    """A writer ahead of the table (any client may send one) makes the actor reload before its next request."""
    latest = (await catalog.describe_table_version(T, None)).version
    with pytest.raises(CommitConflict):
        await catalog.create_table_version(T, create(location, latest + 5))
    await catalog.describe_table_version(T, None)


def meanwhile_delete(monkeypatch, coord, location: str, ranges: list[tuple[int, int]]) -> list:
    """Once, right after a delete counted its older records: another client deletes `ranges`, then the table
    reloads. The list gets that delete's deleted_count."""
    count_log, meanwhile = coord.store.count_log, []

    async def count_then_interleave(*args, **kwargs):
        n = await count_log(*args, **kwargs)
        if not meanwhile:
            meanwhile.append(None)
            meanwhile[0] = await coord.lance.delete_table_versions(T, ranges)
            await reload(coord.lance, location)
        return n
    monkeypatch.setattr(coord.store, "count_log", count_then_interleave)
    return meanwhile


async def table_with(catalog, count: int) -> str:
    location = (await catalog.declare_table(T, None, None)).location
    for v in range(1, count + 1):
        await catalog.create_table_version(T, create(location, v))
    return location


@pytest.mark.parametrize("start,end,count,left", [(1, 3, 2, [3, 4, 5, 6, 7]), (1, 6, 5, [6, 7])])
async def test_a_batch_whose_create_moves_the_window_then_deletes(coord, tiny_window, start, end, count, left):
    catalog = coord.lance
    location = await table_with(catalog, 6)   # 6 in memory: the next version trims to the latest 3
    results = await catalog.batch_commit([("create_table_version", T, create(location, 7)),
                                          ("delete_table_versions", T, delete(start, end))])
    assert results[1][1] == count and await recorded(catalog) == left


async def test_a_count_made_before_another_delete_and_a_reload_is_made_again(coord, tiny_window, monkeypatch):
    monkeypatch.setattr(actor_module, "RELOAD_INTERVAL_S", 0.0)
    catalog = coord.lance
    location = await table_with(catalog, 12)
    await reload(catalog, location)
    meanwhile = meanwhile_delete(monkeypatch, coord, location, [(1, 3)])
    assert await catalog.delete_table_versions(T, [(1, 5)]) == 2   # 3 and 4: 1 and 2 were gone already
    assert meanwhile == [2] and (await recorded(catalog))[0] == 5


async def test_with_the_real_window_a_batch_create_then_delete(coord):
    catalog = coord.lance
    location = (await catalog.declare_table(T, None, None)).location
    n = 2 * lance_state.VERSIONS_KEPT
    await catalog.batch_commit([("create_table_version", T, create(location, v)) for v in range(1, n + 1)])
    results = await catalog.batch_commit([("create_table_version", T, create(location, n + 1)),
                                          ("delete_table_versions", T, delete(1, 3))])
    versions = await recorded(catalog)
    assert results[1][1] == 2 and versions[0] == 3 and len(versions) == n - 1


async def test_two_deletes_in_one_batch_raise_the_counter_once_as_the_row_version(coord, tiny_window, monkeypatch):
    """The counter is loaded as the row's version, so it must rise as that does: once per write. A batch with two
    deletes had raised it by two, a reload then lowered it, and a count made before another delete passed."""
    monkeypatch.setattr(actor_module, "RELOAD_INTERVAL_S", 0.0)
    catalog = coord.lance
    location = await table_with(catalog, 12)
    await reload(catalog, location)
    await catalog.batch_commit([("delete_table_versions", T, delete(1, 2)),
                                ("delete_table_versions", T, delete(2, 3))])
    state, row = await catalog._read(T), await coord.store.get_table(await catalog.names.id(T))
    assert state.deletes <= row.row_version
    meanwhile = meanwhile_delete(monkeypatch, coord, location, [(3, 4)])
    assert await catalog.delete_table_versions(T, [(3, 6)]) == 2   # 4 and 5: 3 was gone already
    assert meanwhile == [1] and (await recorded(catalog))[0] == 6
