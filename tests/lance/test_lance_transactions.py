"""The core's multi-table transaction (`Registry.transact`) as Lance's batch commit drives it, in-process on a
real PostgreSQL: ordering, all-or-nothing, no files left by a rejected batch, cancellation, read-only parts."""

from __future__ import annotations

import pytest
import trio

import coordinator.lance
from coordinator.errors import CommitConflict, NotFound, Unavailable
from coordinator.lance.models import BatchDeleteTableVersionsRequest, CreateTableVersionRequest, DeclareTableRequest
from coordinator.lance.proposals import ReadTable, Steps
from coordinator.lance.layout import manifest_uri
from storage.files import to_local_path

from .conftest import local, stage


def test_public_surface():
    assert sorted(coordinator.lance.__all__) == [
        "BatchCommitTablesRequest", "BatchCreateTableVersionsRequest", "BatchDeleteTableVersionsRequest",
        "CreateNamespaceRequest", "CreateTableVersionRequest", "DeclareTableRequest", "DeregisterTableRequest",
        "DescribeNamespaceRequest", "DescribeTableRequest", "DescribeTableVersionRequest", "DropNamespaceRequest",
        "DropTableRequest", "LanceService", "LanceTable", "Page", "RegisterTableRequest", "TableExistsRequest",
        "TableVersion", "object_path"]


def create(version: int, path: str) -> CreateTableVersionRequest:
    return CreateTableVersionRequest(version=version, manifest_path=path)


async def table_at(coord, name: str, versions: int):
    cat = coord.lance
    t = await cat.declare_table((name,), None, None)
    for v in range(1, versions + 1):
        await cat.create_table_version((name,), create(v, stage(t.location, v)))
    return await cat.describe_table((name,))


async def snapshot(coord, names):
    out = {}
    for n in names:
        try:
            out[n] = [v.version for v in (await coord.lance.describe_table((n,))).versions]
        except NotFound:
            out[n] = None
    return out


async def test_batch_spans_tables_in_request_order(coord):
    cat = coord.lance
    a, b = await table_at(coord, "a", 1), await table_at(coord, "b", 0)
    results = await cat.batch_commit([
        ("create_table_version", ("a",), create(2, stage(a.location, 2))),
        ("create_table_version", ("b",), create(1, stage(b.location, 1))),
        ("create_table_version", ("a",), create(3, stage(a.location, 3))),   # sees version 2 from above
        ("delete_table_versions", ("a",), BatchDeleteTableVersionsRequest(ranges=[
            {"start_version": 0, "end_version": 2}])),
        ("declare_table", ("c",), DeclareTableRequest()),
    ])
    assert [k for k, _ in results] == ["create_table_version", "create_table_version", "create_table_version",
                                       "delete_table_versions", "declare_table"]
    assert [results[i][1].version for i in (0, 1, 2)] == [2, 1, 3]
    assert results[3][1] == 1
    assert await snapshot(coord, "abc") == {"a": [2, 3], "b": [1], "c": []}
    # Every recorded version's manifest is in place, and what the log says is what a fresh load sees.
    for name in "ab":
        t = await cat.describe_table((name,))
        for v in t.versions:
            assert to_local_path(v.manifest_uri).read_bytes().endswith(b"LANC")
    assert [e.version for e in await coord.store.read_log(await cat.names.id(("a",)))] == [2, 3]


async def test_rejection_in_the_last_table_applies_nothing_and_writes_no_files(coord):
    cat = coord.lance
    a, b = await table_at(coord, "a", 1), await table_at(coord, "b", 1)
    # The transaction takes tables in id order: make the table that sorts last reject, so that the first
    # table's part has already been accepted when the rejection comes.
    ids = {t.name: await cat.names.id(tuple(t.ident)) for t in (a, b)}
    first, last = sorted([a, b], key=lambda t: ids[t.name])
    before = await snapshot(coord, "abc")
    with pytest.raises(CommitConflict, match=r"operation 2 .*the next version is 2"):
        await cat.batch_commit([
            ("create_table_version", tuple(first.ident), create(2, stage(first.location, 2))),
            ("declare_table", ("c",), DeclareTableRequest()),
            ("create_table_version", tuple(last.ident), create(7, stage(last.location, 7))),
        ])
    assert await snapshot(coord, "abc") == before
    assert not to_local_path(manifest_uri(first.location, 2, "V2")).exists(), \
        "a rejected transaction must leave no final manifest behind"


async def test_conflict_is_reported_with_its_operation(coord):
    cat = coord.lance
    a = await table_at(coord, "a", 2)
    with pytest.raises(CommitConflict, match=r"operation 1 .*version 2 .* already exists"):
        await cat.batch_commit([("declare_table", ("n",), DeclareTableRequest()),
                                ("create_table_version", ("a",), create(2, stage(a.location, 2)))])
    assert await snapshot(coord, ["a", "n"]) == {"a": [1, 2], "n": None}


async def test_cancelled_transaction_does_not_wedge_its_tables(coord):
    cat = coord.lance
    await table_at(coord, "a", 1)
    table_id = await cat.names.id(("a",))
    # Cancelled right after the part was offered, before the actor took it: the actor must not then hold
    # the table forever waiting for a verdict nobody will give.
    with trio.move_on_after(0):
        await coord.registry.transact([(table_id, Steps())])
    with trio.fail_after(10):
        assert [v.version for v in (await cat.describe_table(("a",))).versions] == [1]
        a = await cat.describe_table(("a",))
        await cat.create_table_version(("a",), create(2, stage(a.location, 2)))


async def test_read_only_part_commits(coord):
    await table_at(coord, "a", 1)
    table_id = await coord.lance.names.id(("a",))
    before = (await coord.store.get_table(table_id)).state
    [state] = await coord.registry.transact([(table_id, ReadTable())])
    assert [v.version for v in state.versions] == [1]
    assert (await coord.store.get_table(table_id)).state == before, "a read must not change the table row"
    a = await coord.lance.describe_table(("a",))
    assert (await coord.lance.create_table_version(("a",), create(2, stage(a.location, 2)))).version == 2


async def test_manifest_of_an_unrecorded_commit_is_removed_before_serving(coord, monkeypatch):
    cat = coord.lance
    a = await table_at(coord, "a", 1)
    real_write = coord.store.write

    async def failing_write(group):
        raise Unavailable("database unavailable: injected")

    monkeypatch.setattr(coord.store, "write", failing_write)
    with pytest.raises(Unavailable):
        await cat.create_table_version(("a",), create(2, stage(a.location, 2)))
    monkeypatch.setattr(coord.store, "write", real_write)
    assert [v.version for v in (await cat.describe_table(("a",))).versions] == [1]   # served after the reload
    # A final manifest is written only once its version is recorded, so a Lance writer probing `_versions/` will
    # not skip version 2.
    assert not to_local_path(manifest_uri(a.location, 2, "V2")).exists()

    # As after a client put final manifests there itself and crashed: versions 2 and 3 on storage, never recorded
    # (and older than the grace a writer's own final name gets).
    monkeypatch.setattr(coord.config, "lance_unrecorded_grace_s", 0.0)
    for v in (2, 3):
        to_local_path(manifest_uri(a.location, v, "V2")).write_bytes(b"uncommitted LANC")
    coord.registry.actors[await cat.names.id(("a",))].unload()      # next request reloads
    with pytest.raises(CommitConflict, match="the next version is 2"):
        await cat.create_table_version(("a",), create(4, stage(a.location, 4)))
    for v in (2, 3):
        assert not to_local_path(manifest_uri(a.location, v, "V2")).exists()
    assert (await cat.create_table_version(("a",), create(2, stage(a.location, 2)))).version == 2


async def test_a_version_taken_back_in_its_own_batch_leaves_no_staged_manifest(coord):
    """Publishing consumes a staged manifest; one whose version a later operation takes back (deleted, or its
    table deregistered) is never published, and is removed all the same, as any other staged manifest."""
    cat = coord.lance
    t = await table_at(coord, "t", 1)
    u = await table_at(coord, "u", 0)
    deleted, kept, dropped = stage(t.location, 2), stage(t.location, 3), stage(u.location, 1)
    assert all(local(p).exists() for p in (deleted, kept, dropped))
    await cat.batch_commit([
        ("create_table_version", ("t",), create(2, deleted)),
        ("delete_table_versions", ("t",), BatchDeleteTableVersionsRequest(ranges=[
            {"start_version": 2, "end_version": 3}])),
        ("create_table_version", ("t",), create(3, kept)),
        ("create_table_version", ("u",), create(1, dropped)),
        ("deregister_table", ("u",), None),
    ])
    assert await snapshot(coord, "tu") == {"t": [1, 3], "u": None}
    assert to_local_path(manifest_uri(t.location, 3, "V2")).exists()
    assert not to_local_path(manifest_uri(t.location, 2, "V2")).exists()
    with trio.fail_after(5):   # (removed after the commit, in the background)
        while any(local(p).exists() for p in (deleted, kept, dropped)):
            await trio.sleep(0.01)
