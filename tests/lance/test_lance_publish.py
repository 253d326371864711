"""Lance's final manifest `_versions/N.manifest` has a fixed name, so the database alone decides who writes it: it
is written once version N is recorded, by the process whose write applied. A refused write leaves none and never
overwrites a committed one; a failure (or crash) between the two is repaired from the staged manifest when the
table loads. In-process on a real PostgreSQL and real files; a second Coordinator plays the table's new owner."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import lance
import pyarrow as pa
import pytest
import trio

from coordinator.errors import NotOwner, Unavailable, Unpublished
from coordinator.lance.layout import manifest_uri, object_path, version_of_manifest_name
from storage.files import to_local_path
from storage.owner import OwnerLock
from storage.records import Refusal, WriteResult

from .conftest import coordinator_in_process, fake_manifest, local, stage
from .test_lance_transactions import create


@pytest.fixture
async def other(config, nursery, monkeypatch):
    """A second process on the same database: the table's next owner while `coord` still holds its old state.
    One owner per database (storage/owner.py) refuses this at start-up; it can still happen for a moment when
    the owner's database session ends (a restart, a failover) and another process claims the database before the
    owner notices, so the rows' compare-and-set must hold on its own: this one skips the claim."""
    async def no_claim(self) -> None:
        return None
    with monkeypatch.context() as m:
        m.setattr(OwnerLock, "take", no_claim)
        m.setattr(OwnerLock, "keep", lambda self: None)
        m.setattr(OwnerLock, "release", no_claim)
        async with coordinator_in_process(config, nursery) as c:
            yield c


def final(location: str, version: int) -> Path:
    return to_local_path(manifest_uri(location, version, "V2"))


def lose_writes_of(coord, path: Path, times: int | None = None) -> None:
    """Make the coordinator's file writes fail whenever they include `path` (`times` times, or always)."""
    real = coord.files.write_many
    left = [times]

    async def write_many(files):
        if any(to_local_path(f[0]) == path for f in files) and left[0] != 0:
            if left[0] is not None:
                left[0] -= 1
            raise OSError("injected: no space left on device")
        await real(files)
    coord.files.write_many = write_many


async def test_a_former_owners_refused_commit_leaves_the_committed_manifest_alone(coord, other):
    t = await coord.lance.declare_table(("t",), None, None)
    await coord.lance.create_table_version(("t",), create(1, stage(t.location, 1)))   # coord now holds the table
    committed = fake_manifest()
    await other.lance.create_table_version(("t",), create(2, stage(t.location, 2, committed)))
    assert final(t.location, 2).read_bytes() == committed
    # coord decides version 2 against its stale state; the database refuses its write.
    with pytest.raises(Unavailable, match="changed concurrently"):
        await coord.lance.create_table_version(("t",), create(2, stage(t.location, 2)))
    assert final(t.location, 2).read_bytes() == committed
    recorded = await coord.lance.describe_table_version(("t",), 2)
    assert recorded.sha256 == hashlib.sha256(committed).hexdigest()


async def test_a_fenced_commit_writes_no_final_manifest(coord, monkeypatch):
    cat = coord.lance
    t = await cat.declare_table(("t",), None, None)
    await cat.create_table_version(("t",), create(1, stage(t.location, 1)))

    async def fenced(group):
        return WriteResult(False, Refusal.FENCED)

    monkeypatch.setattr(coord.store, "write", fenced)
    with pytest.raises(NotOwner):
        await cat.create_table_version(("t",), create(2, stage(t.location, 2)))
    assert not final(t.location, 2).exists()   # checked before any reload could have tidied it away
    with pytest.raises(NotOwner):
        await cat.batch_commit([("create_table_version", ("t",), create(2, stage(t.location, 2)))])
    assert not final(t.location, 2).exists()


async def test_a_failed_final_write_is_restored_at_once_and_answered(coord):
    cat = coord.lance
    t = await cat.declare_table(("t",), None, None)
    data = fake_manifest()
    staged = stage(t.location, 1, data)
    lose_writes_of(coord, final(t.location, 1), times=1)
    assert (await cat.create_table_version(("t",), create(1, staged))).version == 1
    assert final(t.location, 1).read_bytes() == data

    # The same in a batch: applied, so its retry is answered as the same commit.
    data = fake_manifest()
    staged = stage(t.location, 2, data)
    lose_writes_of(coord, final(t.location, 2), times=1)
    with pytest.raises(Unpublished, match="recorded"):
        await cat.batch_commit([("create_table_version", ("t",), create(2, staged))])
    [(_, again)] = await cat.batch_commit([("create_table_version", ("t",), create(2, staged))])
    assert again.version == 2 and final(t.location, 2).read_bytes() == data


def _lance_table_with_staged_version_2(path: Path) -> str:
    """A real Lance dataset with versions 1 and 2, version 2's final manifest moved to a staging name as if its
    writer had staged it and not committed yet. Returns the staged manifest's object-store path."""
    lance.write_dataset(pa.table({"a": [1, 2]}), str(path))
    lance.write_dataset(pa.table({"a": [3]}), str(path), mode="append")
    [name] = [n for n in os.listdir(path / "_versions") if (version_of_manifest_name(n) or (0,))[0] == 2]
    staged = path / "_versions" / f"{name}-{uuid.uuid4()}"
    (path / "_versions" / name).rename(staged)
    return object_path(staged.as_uri())


async def test_commit_recorded_but_final_manifest_lost_is_repaired_on_load(coord, config):
    cat = coord.lance
    path = Path(config.warehouse) / "t.lance"
    staged = await trio.to_thread.run_sync(_lance_table_with_staged_version_2, path)
    data = local(staged).read_bytes()
    t = await cat.register_table(("t",), path.as_uri(), None, None)
    assert [v.version for v in t.versions] == [1]

    # The database records version 2, then every write of its final manifest fails: as a crash in between.
    lose_writes_of(coord, final(t.location, 2))
    with pytest.raises(Unpublished, match="recorded"):
        await cat.create_table_version(("t",), create(2, staged))
    table_id = await cat.names.id(("t",))
    assert [e.version for e in await coord.store.read_log(table_id)] == [1, 2]
    assert not final(t.location, 2).exists() and local(staged).exists()
    # Not served while the file it could restore is missing.
    with pytest.raises(Unavailable, match="cannot load"):
        await cat.describe_table(("t",))

    del coord.files.write_many   # storage works again: the next load restores the file, byte for byte
    assert [v.version for v in (await cat.describe_table(("t",))).versions] == [1, 2]
    assert final(t.location, 2).read_bytes() == data
    assert not local(staged).exists()
    again = await cat.create_table_version(("t",), create(2, staged))   # the client's retry
    assert (again.version, again.sha256) == (2, hashlib.sha256(data).hexdigest())

    def read(version: int) -> list[int]:
        return sorted(lance.dataset(str(path), version=version).to_table()["a"].to_pylist())
    assert await trio.to_thread.run_sync(read, 2) == [1, 2, 3]
    assert await trio.to_thread.run_sync(read, 1) == [1, 2]


async def test_commits_remove_their_staged_manifests_once_the_final_ones_are_durable(coord):
    """The staged manifest is the copy a missing final one is restored from: it goes after the final one is
    written (in the background), through a single commit and through a batch alike."""
    t = await coord.lance.declare_table(("t",), None, None)
    staged = [stage(t.location, 1), stage(t.location, 2), stage(t.location, 3)]
    await coord.lance.create_table_version(("t",), create(1, staged[0]))   # t has an actor now
    await coord.lance.batch_commit([
        ("create_table_version", ("t",), create(2, staged[1])),
        ("create_table_version", ("t",), create(3, staged[2])),
    ])
    assert final(t.location, 3).exists()
    with trio.fail_after(10):
        while any(local(s).exists() for s in staged):
            await trio.sleep(0.01)


async def test_something_else_at_the_final_name_is_not_taken_for_the_manifest(coord):
    """A directory where version 2's manifest must go: the commit is recorded but not answered as done (before,
    finding *something* at the name was enough), and the table is not served until the manifest is in place;
    once the directory is gone, the next load writes the manifest, byte for byte."""
    cat = coord.lance
    t = await cat.declare_table(("t",), None, None)
    await cat.create_table_version(("t",), create(1, stage(t.location, 1)))
    data = fake_manifest()
    staged = stage(t.location, 2, data)
    final(t.location, 2).mkdir()
    with pytest.raises(Unpublished, match="recorded"):
        await cat.create_table_version(("t",), create(2, staged))
    with pytest.raises(Unavailable):
        await cat.describe_table(("t",))
    final(t.location, 2).rmdir()
    assert [v.version for v in (await cat.describe_table(("t",))).versions] == [1, 2]
    assert final(t.location, 2).read_bytes() == data
