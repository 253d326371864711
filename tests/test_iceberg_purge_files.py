"""What a purge of a client-chosen place reads and deletes (coordinator/iceberg/files.py): paths in the metadata are
the client's word. Real manifests are covered with pyiceberg (tests/test_iceberg_pyiceberg.py); these are the
files a client could name that are not manifests, or not the table's."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import orjson
import trio

from coordinator.iceberg.files import reachable_files
from storage.files import FileIO



def delete_reachable(files, location: str, metadata_location: str) -> None:
    """What a purge claim naming the metadata file deletes (coordinator/purges.py with Iceberg's listing)."""
    files.delete_listed_sync(location, reachable_files(files, location, metadata_location) or [])

def test_only_files_within_the_location_are_read_or_deleted_and_junk_names_nothing(tmp_path):
    table, elsewhere = tmp_path / "table", tmp_path / "elsewhere"
    (table / "metadata").mkdir(parents=True)
    elsewhere.mkdir()
    outside = elsewhere / "snap-outside.avro"
    outside.write_bytes(b"not read")
    junk = table / "metadata" / "snap-junk.avro"
    junk.write_bytes(b"not avro at all")
    older = table / "metadata" / "00000-a.metadata.json"
    older.write_bytes(b"{}")
    current = table / "metadata" / "00001-b.metadata.json"
    current.write_bytes(orjson.dumps({
        "location": table.as_uri(),
        "snapshots": [{"snapshot-id": 1, "manifest-list": outside.as_uri()},
                      {"snapshot-id": 2, "manifest-list": junk.as_uri()}, "not a snapshot"],
        "statistics": [{"statistics-path": (elsewhere / "stats.puffin").as_uri()}],
        "metadata-log": [{"metadata-file": older.as_uri()}]}))
    files = FileIO()
    listed = reachable_files(files, table.as_uri(), current.as_uri())
    assert listed[-1] == current.as_uri() and listed.index(junk.as_uri()) < listed.index(older.as_uri())
    keep = table / "data" / "not-named.parquet"
    keep.parent.mkdir()
    keep.write_bytes(b"x")
    delete_reachable(files, table.as_uri(), current.as_uri())
    assert outside.exists() and keep.exists()
    assert not junk.exists() and not older.exists() and not current.exists()
    assert not (table / "metadata").exists()   # emptied: removed; `data` holds a file: stays
    assert reachable_files(files, table.as_uri(), current.as_uri()) is None   # a resumed purge that had ended


def test_paths_that_name_nothing_deletable_are_skipped_so_the_purge_ends(tmp_path):
    """A purge that failed on the same path every time would keep its location claimed forever: paths naming a
    directory, a name below a file, a name too long, and a metadata that is no object are skipped."""
    import fastavro

    table = tmp_path / "table"
    (table / "data").mkdir(parents=True)
    (table / "data" / "a.parquet").write_bytes(b"x")
    (table / "metadata").mkdir()
    odd = table / "metadata" / "snap-odd.avro"   # Avro, but its records hold no data_file record
    with odd.open("wb") as out:
        fastavro.writer(out, {"type": "record", "name": "r", "fields": [
            {"name": "data_file", "type": "string"}, {"name": "manifest_path", "type": "long"}]},
            [{"data_file": "not a record", "manifest_path": 7}])
    current = table / "metadata" / "00001-b.metadata.json"
    current.write_bytes(orjson.dumps({"location": table.as_uri(), "snapshots": [
        {"snapshot-id": 1, "manifest-list": odd.as_uri(), "manifests": "not a list"}],
        "statistics": [{"statistics-path": p} for p in (
            (table / "data").as_uri(), (table / "data" / "a.parquet" / "x").as_uri(), (table / ("n" * 300)).as_uri())]}))
    files = FileIO()
    delete_reachable(files, table.as_uri(), current.as_uri())
    assert not current.exists() and not odd.exists() and (table / "data" / "a.parquet").exists()
    not_an_object = table / "00002-c.metadata.json"   # `metadata/` went with the last file in it
    not_an_object.write_bytes(b"[1, 2]")
    assert reachable_files(files, table.as_uri(), not_an_object.as_uri()) == [not_an_object.as_uri()]
    assert reachable_files(files, table.as_uri(), (table / "data").as_uri()) == [(table / "data").as_uri()]


def test_links_fifos_and_loops_neither_lead_out_of_the_location_nor_stall_the_purge(tmp_path):
    """`is_within` reads the text; the kernel follows links in a path's directories. A directory link in the
    table's place pointing out of it leads nowhere; a FIFO named as a manifest list would block the purge's thread
    for good (its claim renewed all the while); a link loop fails every time: each names nothing."""
    import os
    import threading

    table, outside = tmp_path / "table", tmp_path / "another-table" / "data"
    (outside / "sub").mkdir(parents=True)
    precious = outside / "sub" / "precious.parquet"
    precious.write_bytes(b"not the purged table's")
    (table / "metadata").mkdir(parents=True)
    os.symlink(outside, table / "data")
    os.mkfifo(table / "metadata" / "snap-fifo.avro")
    os.symlink(table / "loop", table / "loop")
    current = table / "metadata" / "00001-m.metadata.json"
    current.write_bytes(orjson.dumps({"location": table.as_uri(), "snapshots": [
        {"snapshot-id": 1, "manifest-list": (table / "metadata" / "snap-fifo.avro").as_uri()},
        {"snapshot-id": 2, "manifest-list": (table / "loop" / "x.avro").as_uri()}],
        "statistics": [{"statistics-path": (table / "data" / "sub" / "precious.parquet").as_uri()},
                       {"statistics-path": (table / "loop" / "y.puffin").as_uri()}]}))
    done = threading.Event()

    def purge():
        delete_reachable(FileIO(), table.as_uri(), current.as_uri())
        done.set()
    threading.Thread(target=purge, daemon=True).start()
    assert done.wait(10), "the purge blocked"
    assert precious.exists() and (outside / "sub").is_dir() and not current.exists()


def test_a_location_that_is_itself_a_link_leads_nowhere(tmp_path):
    """A location that is itself a link (to another table's directory): nothing below it is deleted, and a whole-
    tree purge removes the link, not what it points at."""
    other = tmp_path / "wh" / "ns" / "other-table"
    (other / "data").mkdir(parents=True)
    precious = other / "data" / "00000-0-precious.parquet"
    precious.write_bytes(b"the other table's")
    table = tmp_path / "wh" / "ns" / "t"
    os.symlink(other, table)
    FileIO().delete_listed_sync(table.as_uri(), [(table / "data" / "00000-0-precious.parquet").as_uri()])
    assert precious.exists(), "deleted a file of another table through the location's own link"
    FileIO().delete_tree_sync(table.as_uri())
    assert precious.exists() and not os.path.lexists(table)


def test_a_gc_disabled_purge_keeps_within_the_location_too(tmp_path):
    """`gc.enabled=false`: the files the metadata names, through the same guard as any listed purge (a path
    through a directory link in the table's place leads out of it)."""
    from coordinator.iceberg.files import purge_named_files

    outside = tmp_path / "another-table" / "metadata"
    outside.mkdir(parents=True)
    precious = outside / "snap-1.avro"
    precious.write_bytes(b"the other table's manifest list")
    table = tmp_path / "wh" / "t"
    (table / "metadata").mkdir(parents=True)
    os.symlink(outside, table / "linked")
    current = table / "metadata" / "00001.metadata.json"
    current.write_bytes(b"{}")
    state = SimpleNamespace(ident="ns.t", metadata_location=current.as_uri(), metadata={
        "snapshots": [{"manifest-list": (table / "linked" / "snap-1.avro").as_uri()}]})

    class Store:
        async def location_taken(self, location, *a, **k):
            return False
    trio.run(purge_named_files, FileIO(), Store(), table.as_uri(), state)
    assert precious.exists(), "gc.enabled=false purge deleted a file outside the location through a link"


def test_manifests_are_read_only_within_the_location(tmp_path):
    """A manifest list named through a directory link is not read from wherever the link points (/proc/kmsg, say,
    would block the purge for good)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.avro").write_bytes(b"not avro")
    table = tmp_path / "t"
    (table / "metadata").mkdir(parents=True)
    os.symlink(outside, table / "l")
    current = table / "metadata" / "v1.metadata.json"
    current.write_bytes(orjson.dumps({"snapshots": [{"manifest-list": (table / "l" / "secret.avro").as_uri()}]}))
    files = FileIO()
    reads = []
    real = files.read_within_sync
    files.read_within_sync = lambda uri, within=None: [real(uri, within), reads.append(uri)][0]   # (read ones)
    reachable_files(files, table.as_uri(), current.as_uri())
    assert (table / "l" / "secret.avro").as_uri() not in reads, "read a file outside the location through a link"


def test_a_dot_dot_after_a_link_leads_nowhere_either(tmp_path):
    """`<wh>/a/x/../t` with `x` a link: the kernel resolves `..` after the link, the text before it. Neither kind of
    purge deletes under such a location; links above the warehouse (the operator's) are trusted."""
    wh, outside = tmp_path / "wh", tmp_path / "outside"
    (outside / "t").mkdir(parents=True)
    kept = outside / "t" / "kept.parquet"
    kept.write_bytes(b"x")
    (wh / "a").mkdir(parents=True)
    os.symlink(outside / "t", wh / "a" / "x")
    files = FileIO(warehouse=wh.as_uri())
    tricky = f"{wh.as_uri()}/a/x/../t"
    files.delete_tree_sync(tricky)
    files.delete_listed_sync(tricky, [f"{tricky}/kept.parquet"])
    assert kept.exists()
    linked_wh = tmp_path / "linked-wh"
    os.symlink(wh, linked_wh)   # a warehouse reached through the operator's link: purges work as usual
    (wh / "b" / "t").mkdir(parents=True)
    (wh / "b" / "t" / "f.parquet").write_bytes(b"x")
    FileIO(warehouse=linked_wh.as_uri()).delete_tree_sync(f"{linked_wh.as_uri()}/b/t")
    assert not (wh / "b" / "t").exists()


def test_a_dot_dot_anywhere_in_the_path_stops_the_purge(tmp_path):
    """With an operator's alias of the warehouse (trusted: above it), a client's link reached through it and
    followed by `..` leads out, although the text normalizes into the warehouse."""
    from storage.files import is_below

    wh = tmp_path / "srv" / "a" / "b" / "wh"           # the warehouse (4 components below tmp_path)
    wh.mkdir(parents=True)
    os.symlink(wh, tmp_path / "w")                       # the operator's short alias of it: above it, trusted
    victim = tmp_path / "victim"
    (victim / "x" / "y").mkdir(parents=True)
    os.symlink(victim / "x" / "y", wh / "evil")          # the client's link, below the warehouse
    precious = victim / "srv" / "a" / "b" / "wh" / "t" / "precious"   # e.g. a copy/backup of the warehouse
    precious.parent.mkdir(parents=True)
    precious.write_bytes(b"x")
    location = f"{(tmp_path / 'w').as_uri()}/evil/../../srv/a/b/wh/t"   # text: <tmp>/srv/a/b/wh/t
    assert not is_below(wh.as_uri(), location), "a '..' segment is never within: the kernel reads it otherwise"
    FileIO(warehouse=wh.as_uri()).delete_tree_sync(location)
    assert precious.exists(), "a purge deleted outside the warehouse: the '..'s sit before the trusted index"


def _swap_for_a_link_once(directory, target):
    """A `stop` callback that, the first time a deletion asks it, moves `directory` aside and puts a link to
    `target` in its place: a directory swapped for a link between the moment it was checked and its files'
    deletion (it never asks to stop)."""
    done = []

    def stop() -> bool:
        if not done:
            os.rename(directory, directory.with_name(directory.name + ".moved"))
            os.symlink(target, directory)
            done.append(True)
        return False
    return stop


def test_a_directory_swapped_for_a_link_during_a_purge_leads_nowhere(tmp_path):
    """Both kinds of purge delete through directory descriptors, each opened from the one above without following
    links, from the warehouse down: a link swapped in while they run, in the location or between the warehouse
    and it, leads neither out of the location."""
    for kind in ("listed", "tree"):
        for swapped in ("data", "ns"):
            wh = tmp_path / kind / swapped / "wh"
            table = wh / "ns" / "t"
            outside = tmp_path / kind / swapped / "outside"
            for place in (table, outside / "t"):
                (place / "data").mkdir(parents=True)
                for n in range(3):
                    (place / "data" / f"f{n}.parquet").write_bytes(str(place).encode())
            if swapped == "data":
                stop = _swap_for_a_link_once(table / "data", outside / "t" / "data")
            else:
                stop = _swap_for_a_link_once(wh / "ns", outside)
            files = FileIO(warehouse=str(wh))
            if kind == "listed":
                files.delete_listed_sync(table.as_uri(), [(table / "data" / f"f{n}.parquet").as_uri()
                                                          for n in range(3)], stop)
            else:
                files.delete_tree_sync(table.as_uri(), stop)
            left = sorted(os.listdir(outside / "t" / "data"))
            assert left == ["f0.parquet", "f1.parquet", "f2.parquet"], (kind, swapped)


def test_a_whole_tree_purge_of_nothing_or_of_a_non_directory_ends(tmp_path):
    """A location that does not exist (a table never written to, or a purge resumed after it had deleted all), a
    dangling link, a FIFO (opening it could block the thread for good) or a file: the purge ends without an error
    (or it would be retried forever, its location claimed), removing the entry itself, never what it points at.
    A FIFO swapped in for a subdirectory while the walk runs is removed the same way."""
    wh = tmp_path / "wh"
    (wh / "ns").mkdir(parents=True)
    files = FileIO(warehouse=str(wh))
    os.symlink(tmp_path / "nowhere", wh / "ns" / "dangling")
    os.mkfifo(wh / "ns" / "fifo")
    (wh / "ns" / "file").write_bytes(b"x")
    (wh / "ns" / "t" / "d").mkdir(parents=True)
    (wh / "ns" / "t" / "d" / "f").write_bytes(b"x")
    (wh / "ns" / "t" / "z").write_bytes(b"x")

    def swap_in_a_fifo() -> bool:
        if (wh / "ns" / "t" / "d").is_dir() and not (wh / "ns" / "t" / "d.moved").exists():
            os.rename(wh / "ns" / "t" / "d", wh / "ns" / "t" / "d.moved")
            os.mkfifo(wh / "ns" / "t" / "d")
        return False

    def purge_all() -> None:
        for name in ("never-written", "dangling", "fifo", "file"):
            files.delete_tree_sync((wh / "ns" / name).as_uri())
        files.delete_tree_sync((wh / "ns" / "t").as_uri(), swap_in_a_fifo)
    done = threading.Thread(target=purge_all, daemon=True)
    done.start()
    done.join(10)
    assert not done.is_alive(), "a purge hung"
    # (What was moved aside while the walk was in it was emptied through its descriptor; it is left.)
    assert sorted(os.listdir(wh / "ns")) == ["t"] and sorted(os.listdir(wh / "ns" / "t")) == ["d.moved"]
    assert os.listdir(wh / "ns" / "t" / "d.moved") == []


def test_a_whole_tree_purge_is_not_stopped_by_deep_nesting(tmp_path):
    table = tmp_path / "wh" / "t"
    table.mkdir(parents=True)
    fd = os.open(table, os.O_RDONLY)
    for _ in range(1200):   # deeper than Python's recursion limit
        os.mkdir("d", dir_fd=fd)
        fd, above = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(above)
    os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)
    FileIO(warehouse=str(tmp_path / "wh")).delete_tree_sync(table.as_uri())
    assert not table.exists()
