"""Grouped file work (`storage.files.GroupedHop`, behind `FileIO.write_many`, `read` and `delete`): every caller
waiting at the same moment is served by one worker-thread hop, each caller's files are durable when it returns,
and one caller's failure is only its own."""

from __future__ import annotations

import os
import stat

import pytest
import trio
import trio.testing

import storage.files as files_module
import storage.localfs as localfs_module
from storage.files import FileIO


def _count_hops(monkeypatch, fileio: FileIO) -> list[int]:
    """Record how many callers' batches each worker-thread hop carried."""
    hops: list[int] = []
    real = fileio._writes.run_batch

    async def counted(batches):
        hops.append(len(batches))
        return await real(batches)
    monkeypatch.setattr(fileio._writes, "run_batch", counted)
    return hops


async def test_concurrent_callers_share_hops_and_each_gets_its_files(tmp_path, monkeypatch):
    fileio = FileIO()
    hops = _count_hops(monkeypatch, fileio)
    callers = 40

    async def write(i: int) -> None:
        await fileio.write_many([(f"file://{tmp_path}/t{i}/meta.json", f"table {i}".encode()),
                                 (str(tmp_path / f"t{i}" / "extra.bin"), bytes([i]) * 1000)])
        # Durable and in place by the time the caller hears back.
        assert (tmp_path / f"t{i}" / "meta.json").read_bytes() == f"table {i}".encode()

    async with trio.open_nursery() as nursery:
        for i in range(callers):
            nursery.start_soon(write, i)
    assert sum(hops) == callers
    assert len(hops) < callers / 4, f"callers were not grouped: {hops}"
    assert not [n for n in os.listdir(tmp_path / "t0") if n.endswith(".tmp")], "temp files left behind"


async def test_one_callers_failure_is_its_own(tmp_path, monkeypatch):
    fileio = FileIO()
    hops = _count_hops(monkeypatch, fileio)
    (tmp_path / "blocker").write_bytes(b"a file where a directory would have to be")
    outcomes: dict[str, object] = {}

    async def write(name: str, uri: str) -> None:
        try:
            await fileio.write_many([(uri, b"x")])
            outcomes[name] = "ok"
        except OSError as exc:
            outcomes[name] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write, "first", str(tmp_path / "a" / "1.json"))  # leads the first hop alone
        for name in ("good", "bad", "good2"):
            uri = str(tmp_path / "blocker" / "x.json") if name == "bad" else str(tmp_path / name / "1.json")
            nursery.start_soon(write, name, uri)
    assert outcomes["first"] == outcomes["good"] == outcomes["good2"] == "ok"
    assert isinstance(outcomes["bad"], OSError)
    assert (tmp_path / "good" / "1.json").read_bytes() == b"x" and (tmp_path / "good2" / "1.json").exists()
    assert hops == [1, 3], hops


class Interrupt(BaseException):
    """Stands for what can cut a batch short (KeyboardInterrupt, a bug): not an outcome of the work."""


async def test_callers_queued_behind_a_failed_or_interrupted_batch_are_not_stranded(tmp_path, monkeypatch):
    fileio = FileIO()
    real = fileio._writes.run_batch
    # What each batch does in turn: a held batch is written once the next callers have queued behind it.
    plan = ["hold", "fail", "hold", "interrupt"]
    held, release = trio.Event(), trio.Event()

    async def run_batch(items):
        nonlocal held, release
        step = plan.pop(0)
        if step == "hold":
            held.set()
            await release.wait()
            held, release = trio.Event(), trio.Event()
            return await real(items)
        if step == "fail":
            raise RuntimeError("the worker thread hop failed")   # the batch fails as a whole
        raise Interrupt()                                          # the batch's own task is cut short
    monkeypatch.setattr(fileio._writes, "run_batch", run_batch)
    heard: dict[str, str] = {}

    async def write(name: str) -> None:
        try:
            await fileio.write_many([(str(tmp_path / f"{name}.json"), b"x")])
            heard[name] = "ok"
        except BaseException as exc:  # noqa: BLE001 - what each caller heard is the point
            heard[name] = type(exc).__name__

    async def two_behind_a_held_batch(lead: str, queued: tuple[str, str]) -> None:
        heard.clear()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(write, lead)
                await held.wait()
                for name in queued:
                    nursery.start_soon(write, name)
                await trio.testing.wait_all_tasks_blocked()
                release.set()

    await two_behind_a_held_batch("lead", ("a1", "a2"))
    assert heard == {"lead": "ok", "a1": "RuntimeError", "a2": "RuntimeError"}
    # An interrupted batch: its leader's task sees the interruption; the caller it carried hears an OSError.
    await two_behind_a_held_batch("lead2", ("b1", "b2"))
    assert heard["lead2"] == "ok" and sorted([heard["b1"], heard["b2"]]) == ["Interrupt", "OSError"]

    monkeypatch.setattr(fileio._writes, "run_batch", real)
    await fileio.write_many([(str(tmp_path / "after.json"), b"y")])
    assert (tmp_path / "after.json").read_bytes() == b"y"


async def test_a_lone_caller_is_written_at_once(tmp_path, monkeypatch):
    fileio = FileIO()
    hops = _count_hops(monkeypatch, fileio)
    await fileio.write_many([(str(tmp_path / "only.json"), b"{}")])
    assert hops == [1] and (tmp_path / "only.json").read_bytes() == b"{}"


async def test_concurrent_reads_and_deletes_keep_their_own_errors(tmp_path):
    fileio = FileIO()
    for i in range(20):
        (tmp_path / f"{i}.manifest").write_bytes(bytes([i]) * 10)
    got: dict[int, object] = {}

    async def read(i: int) -> None:
        try:
            got[i] = await fileio.read(str(tmp_path / f"{i}.manifest"))
        except Exception as exc:  # noqa: BLE001
            got[i] = exc

    async with trio.open_nursery() as nursery:
        for i in range(25):   # 20..24 do not exist
            nursery.start_soon(read, i)
    assert all(got[i] == bytes([i]) * 10 for i in range(20))
    assert all(type(got[i]).__name__ == "FileMissing" for i in range(20, 25))

    async with trio.open_nursery() as nursery:
        for i in range(0, 25, 2):
            nursery.start_soon(fileio.delete, str(tmp_path / f"{i}.manifest"), str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{i}.manifest" for i in range(1, 20, 2))


def test_a_tree_deletion_removes_everything_or_stops_when_asked(tmp_path):
    import pytest

    from storage.files import DeletionStopped

    def tree(root):
        (root / "data" / "part").mkdir(parents=True)
        (root / "data" / "part" / "a.parquet").write_bytes(b"a")
        (root / "metadata").mkdir()
        (root / "metadata" / "v1.json").write_bytes(b"{}")
        outside = tmp_path / "outside"
        outside.mkdir(exist_ok=True)
        (outside / "keep").write_bytes(b"k")
        (root / "link").symlink_to(outside, target_is_directory=True)   # a link is removed, never followed
        return outside

    files = FileIO()
    stopped = tmp_path / "stopped"
    tree(stopped)
    with pytest.raises(DeletionStopped):
        files.delete_tree_sync(stopped.as_uri(), lambda: True)
    assert (stopped / "metadata" / "v1.json").exists()
    whole = tmp_path / "whole"
    outside = tree(whole)
    files.delete_tree_sync(whole.as_uri(), lambda: False)
    assert not whole.exists() and (outside / "keep").exists()


# -- a source file renamed into place (Lance's staged manifest becoming its final manifest) -------------------------


async def test_a_source_holding_the_bytes_is_renamed_into_place(tmp_path):
    fileio = FileIO()
    staged, final = tmp_path / "7.manifest-abc", tmp_path / "7.manifest"
    staged.write_bytes(b"manifest bytes")
    inode = staged.stat().st_ino
    await fileio.write_many([(str(final), b"manifest bytes", f"file://{staged}")])
    assert final.read_bytes() == b"manifest bytes"
    assert final.stat().st_ino == inode, "the source was copied, not renamed"
    assert not staged.exists()
    assert sorted(os.listdir(tmp_path)) == ["7.manifest"]


async def test_a_source_that_does_not_hold_the_bytes_is_replaced_by_them(tmp_path):
    """What was checked is what lands: a source changed since (or a link, or a file with another name too) is not
    taken; the checked bytes are written and the source is removed all the same."""
    fileio = FileIO()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"checked")
    cases = {
        "changed": lambda p: p.write_bytes(b"changed"),
        "longer": lambda p: p.write_bytes(b"checked and more"),
        "link": lambda p: p.symlink_to(elsewhere),
        "two names": lambda p: os.link(elsewhere, p),
        "missing": lambda p: None,
    }
    for n, (case, make) in enumerate(cases.items()):
        staged, final = tmp_path / f"{n}.manifest-x", tmp_path / f"{n}.manifest"
        make(staged)
        await fileio.write_many([(str(final), b"checked", str(staged))])
        assert final.read_bytes() == b"checked", case
        assert not final.is_symlink(), case
        assert not os.path.lexists(staged), case
        if case == "two names":
            assert final.stat().st_ino != elsewhere.stat().st_ino
    assert elsewhere.read_bytes() == b"checked"   # a link's target is never renamed, written or removed
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")], "temp files left behind"


async def test_a_source_in_another_directory_is_copied_not_moved(tmp_path):
    fileio = FileIO()
    (tmp_path / "a").mkdir()
    staged = tmp_path / "a" / "1.manifest-x"
    staged.write_bytes(b"m")
    inode = staged.stat().st_ino
    await fileio.write_many([(str(tmp_path / "b" / "1.manifest"), b"m", str(staged))])
    assert (tmp_path / "b" / "1.manifest").read_bytes() == b"m"
    assert (tmp_path / "b" / "1.manifest").stat().st_ino != inode


async def test_what_lands_is_what_was_checked(tmp_path, monkeypatch):
    """The source is a writer's file: rewritten in place, or swapped for a directory, between the check and the
    rename, the checked bytes are written instead, and a swapped-in directory is put back, not made the file."""
    fileio = FileIO()
    real = localfs_module._adopt
    for n, meddle in enumerate((lambda p: p.write_bytes(b"EVIL" + b"x" * 3), lambda p: (p.unlink(), p.mkdir()))):
        staged, final = tmp_path / f"{n}.manifest-x", tmp_path / f"{n}.manifest"
        staged.write_bytes(b"checked")

        def adopt(source, data, dir_fd=None, *, meddle=meddle, staged=staged):
            fd = real(source, data, dir_fd)
            meddle(staged)
            return fd
        monkeypatch.setattr(localfs_module, "_adopt", adopt)
        await fileio.write_many([(str(final), b"checked", str(staged))])
        assert final.is_file() and final.read_bytes() == b"checked"
    assert (tmp_path / "1.manifest-x").is_dir()   # the writer's directory, left where it put it
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")], "temp files left behind"


async def test_an_adopted_file_is_readable_to_all_as_a_copy_would_be(tmp_path):
    staged, final = tmp_path / "1.manifest-x", tmp_path / "1.manifest"
    staged.write_bytes(b"m")
    staged.chmod(0o600)
    inode = staged.stat().st_ino
    await FileIO().write_many([(str(final), b"m", str(staged))])
    assert final.stat().st_ino == inode and stat.S_IMODE(final.stat().st_mode) == 0o644


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user takes root")
async def test_another_users_file_is_copied_not_adopted(tmp_path):
    """A copy is the service's own file; another user's staged file would stay that user's to change."""
    staged, final = tmp_path / "1.manifest-x", tmp_path / "1.manifest"
    staged.write_bytes(b"m")
    os.chown(staged, 54321, 54321)
    await FileIO().write_many([(str(final), b"m", str(staged))])
    assert final.read_bytes() == b"m" and final.stat().st_uid == 0 and not staged.exists()


async def test_within_a_tables_place_no_link_leads_a_write_or_a_rename_elsewhere(tmp_path):
    """Given the table's place, a file's directory is reached from it without following a link: a `_versions/`
    swapped for a link to another dataset's fails the write, and neither that dataset's manifest nor a file of
    its that matches the bytes is written, renamed or removed. A link above the place (an operator's: a namespace
    moved to another disk) is followed as before."""
    victim = tmp_path / "victim" / "_versions"
    victim.mkdir(parents=True)
    (victim / "2.manifest").write_bytes(b"the victim's version 2")
    (victim / "2.manifest-x").write_bytes(b"attacker's")
    table = tmp_path / "wh" / "ns" / "t"
    table.mkdir(parents=True)
    os.symlink(victim, table / "_versions")
    fileio = FileIO(warehouse=str(tmp_path / "wh"))
    with pytest.raises(OSError):
        await fileio.write_many([(str(table / "_versions" / "2.manifest"), b"attacker's",
                                  str(table / "_versions" / "2.manifest-x"), str(table))])
    assert sorted(os.listdir(victim)) == ["2.manifest", "2.manifest-x"]
    assert (victim / "2.manifest").read_bytes() == b"the victim's version 2"

    disk2 = tmp_path / "disk2" / "ns2"
    (disk2 / "t" / "_versions").mkdir(parents=True)
    os.symlink(disk2, tmp_path / "wh" / "ns2")
    place = tmp_path / "wh" / "ns2" / "t"
    (place / "_versions" / "1.manifest-x").write_bytes(b"m")
    await fileio.write_many([(str(place / "_versions" / "1.manifest"), b"m", str(place / "_versions" / "1.manifest-x"),
                              str(place))])
    assert sorted(os.listdir(disk2 / "t" / "_versions")) == ["1.manifest"]


async def test_directories_are_made_for_a_relative_path_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    await FileIO().write_many([("rel/a/b/f.json", b"{}")])
    assert (tmp_path / "rel" / "a" / "b" / "f.json").read_bytes() == b"{}"


async def test_a_read_from_within_a_place_is_bounded_in_size(tmp_path, monkeypatch):
    from storage.errors import FileRefused
    monkeypatch.setattr(files_module, "MAX_READ_BYTES", 10)
    (tmp_path / "_versions").mkdir()
    (tmp_path / "_versions" / "small").write_bytes(b"x" * 10)
    (tmp_path / "_versions" / "big").write_bytes(b"x" * 11)
    fileio = FileIO()
    assert await fileio.read(str(tmp_path / "_versions" / "small"), within=str(tmp_path)) == b"x" * 10
    with pytest.raises(FileRefused, match="at most 10"):
        await fileio.read(str(tmp_path / "_versions" / "big"), within=str(tmp_path))


def test_a_bounded_read_sees_a_file_that_grew_or_shrank_since_it_was_measured(tmp_path):
    """`_read_at_most` is given the size fstat saw: a file grown since is still read to its end (or to just past
    the limit, which the caller refuses), and one shrunk since to its end."""
    path = tmp_path / "f"
    path.write_bytes(b"0123456789" * 300)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert files_module._read_at_most(fd, 10, 10_000) == b"0123456789" * 300        # grew: read on
        assert files_module._read_at_most(fd, 10, 2_000) == (b"0123456789" * 300)[:2_001]   # past the limit
        assert files_module._read_at_most(fd, 3_000, 3_000) == b"0123456789" * 300     # as measured
        assert files_module._read_at_most(fd, 5_000, 10_000) == b"0123456789" * 300     # shrank
    finally:
        os.close(fd)


async def test_names_in_lists_one_directory_level(tmp_path):
    """`names_in` (Lance's check for versions cleaned up): the names directly in a directory, nothing below it, and
    none for a directory that is not there (on S3: tests/s3/test_s3_files.py)."""
    fileio = FileIO()
    versions = tmp_path / "t" / "_versions"
    (versions / "sub").mkdir(parents=True)
    for name in ("1.manifest", "2.manifest", "sub/deeper.manifest"):
        (versions / name).write_bytes(b"x")
    assert await fileio.names_in(versions.as_uri()) == {"1.manifest", "2.manifest", "sub"}
    assert await fileio.names_in((tmp_path / "missing").as_uri()) == set()
