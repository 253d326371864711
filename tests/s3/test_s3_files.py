"""The file IO against a real S3 server (moto on loopback): writes are creates that never overwrite another's
object, listings, purges, and reads of what a client named."""

from __future__ import annotations

import obstore
import orjson
import pytest

from coordinator.iceberg.files import reachable_files
from storage import files as files_module
from storage.errors import FileRefused, FileTaken
from storage.files import FileIO


@pytest.fixture
def fileio(s3_server, s3_bucket):
    return FileIO(s3_server.options, f"s3://{s3_bucket}/wh")


async def test_a_written_file_is_there_for_any_other_client_once_the_write_returns(s3_server, s3_bucket, fileio):
    """S3 answers a PUT only once the object is stored: what write_many returned from is read back by a client
    of its own (another connection, nothing cached here)."""
    uri = f"s3://{s3_bucket}/wh/ns/t/metadata/00001-a.metadata.json"
    await fileio.write_many([(uri, b'{"v": 1}'), (f"s3://{s3_bucket}/wh/ns/t/_versions/1.manifest", b"m", None,
                                                   f"s3://{s3_bucket}/wh/ns/t")])
    store = s3_server.store(s3_bucket)
    assert bytes(obstore.get(store, "wh/ns/t/metadata/00001-a.metadata.json").bytes()) == b'{"v": 1}'
    assert s3_server.keys(s3_bucket) == ["wh/ns/t/_versions/1.manifest", "wh/ns/t/metadata/00001-a.metadata.json"]
    assert await fileio.read(uri) == b'{"v": 1}' and await fileio.size(uri) == 8 and await fileio.exists(uri)


async def test_an_object_someone_else_put_at_the_name_is_refused_and_left_intact(s3_server, s3_bucket, fileio):
    """Every write is a create (`If-None-Match: *`): another's object at the name makes the write fail (the
    commit then is not applied, or not yet published) and keeps its bytes; the other callers of the same moment
    are written all the same."""
    store = s3_server.store(s3_bucket)
    obstore.put(store, "wh/t/_versions/2.manifest", b"someone else's")
    taken, free = f"s3://{s3_bucket}/wh/t/_versions/2.manifest", f"s3://{s3_bucket}/wh/u/_versions/1.manifest"
    outcomes = fileio._write_batches_sync([[(taken, b"ours")], [(free, b"ours too")]])
    assert isinstance(outcomes[0], FileTaken) and "left intact" in str(outcomes[0]) and outcomes[1] is None
    with pytest.raises(FileTaken):
        await fileio.write_many([(taken, b"ours")])
    assert bytes(obstore.get(store, "wh/t/_versions/2.manifest").bytes()) == b"someone else's"
    assert bytes(obstore.get(store, "wh/u/_versions/1.manifest").bytes()) == b"ours too"


async def test_an_object_already_holding_the_same_bytes_is_the_write_done(s3_server, s3_bucket, fileio):
    """Written again (a retried publish whose first answer was lost, a restore, a writer's own final manifest
    handed in as its name): the object already holds exactly these bytes, which is what the write was for."""
    uri = f"s3://{s3_bucket}/wh/t/_versions/1.manifest"
    await fileio.write_many([(uri, b"manifest")])
    await fileio.write_many([(uri, b"manifest")])
    assert await fileio.read(uri) == b"manifest"


async def test_names_in_lists_one_level_of_a_prefix(s3_server, s3_bucket, fileio):
    """`names_in` (Lance's check for versions cleaned up): the names directly under a prefix, nothing deeper;
    none for a prefix that holds nothing."""
    store = s3_server.store(s3_bucket)
    for key in ("t/_versions/1.manifest", "t/_versions/3.manifest", "t/_versions/sub/x", "t/data/y"):
        obstore.put(store, key, b"x")
    assert await fileio.names_in(f"s3://{s3_bucket}/t/_versions") == {"1.manifest", "3.manifest"}
    assert await fileio.names_in(f"s3://{s3_bucket}/t/nothing/") == set()


async def test_a_purge_deletes_every_object_under_the_location_and_nothing_beside_it(s3_server, s3_bucket, fileio):
    store = s3_server.store(s3_bucket)
    for key in ("wh/t/data/a.parquet", "wh/t/metadata/1.json", "wh/t2/data/b.parquet", "wh/t-other/x"):
        obstore.put(store, key, b"x")
    await fileio.delete_tree(f"s3://{s3_bucket}/wh/t")
    assert s3_server.keys(s3_bucket) == ["wh/t-other/x", "wh/t2/data/b.parquet"]


def test_object_store_paths_it_refuses_to_parse_are_skipped(s3_server, s3_bucket, fileio):
    """A path with an empty or `..` segment is within the location by its key, but obstore refuses to parse it
    (not an OSError): skipped, or the purge would fail on it forever."""
    store = s3_server.store(s3_bucket)
    obstore.put(store, "wh/t/data/a.parquet", b"x")
    root = f"s3://{s3_bucket}/wh/t"
    fileio.delete_listed_sync(root, [f"{root}/data/a.parquet", f"{root}//data/b.parquet",
                                     f"s3://{s3_bucket}/wh/other/../t/data/c.parquet"])
    assert s3_server.keys(s3_bucket, "wh/t") == []
    metadata = f"{root}/metadata/00001.metadata.json"
    obstore.put(store, "wh/t/metadata/00001.metadata.json", orjson.dumps(
        {"snapshots": [{"manifest-list": f"{root}//metadata/snap.avro"}]}))
    assert reachable_files(fileio, root, metadata) == [f"{root}//metadata/snap.avro", metadata]


def test_object_store_reads_are_bounded_in_size(s3_server, s3_bucket, fileio, monkeypatch):
    """A file named as a manifest list is read only up to MAX_READ_BYTES (its size is known before its bytes are
    fetched): a data file of the table's location named there (5 GiB, say) would otherwise be read whole, the
    process killed for memory, the claim resumed at restart and the file read again."""
    monkeypatch.setattr(files_module, "MAX_READ_BYTES", 1024)
    store = s3_server.store(s3_bucket)
    obstore.put(store, "wh/t/data/huge.parquet", b"x" * (64 << 10))
    root = f"s3://{s3_bucket}/wh/t"
    with pytest.raises(FileRefused, match="at most 1024"):
        fileio.read_within_sync(f"{root}/data/huge.parquet")
    obstore.put(store, "wh/t/metadata/00001.metadata.json",
                orjson.dumps({"snapshots": [{"manifest-list": f"{root}/data/huge.parquet"}]}))
    assert reachable_files(fileio, root, f"{root}/metadata/00001.metadata.json") == [
        f"{root}/data/huge.parquet", f"{root}/metadata/00001.metadata.json"]