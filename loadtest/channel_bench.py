"""What a forwarded commit costs on the cluster's internal channel: `python -m loadtest.channel_bench [--code DIR]`.

For each format's commit as a member forwards it to the table's owner (the proposal built as the format's service
builds it from a client's request, and the owner's reply), prints one table: the frame's size, how many extension
values it holds (a type's head, a UUID, a process-local object: each costs Python calls to encode and decode), the
CPU to encode and to decode it (best of 5 runs of 2,000), and the CPU of a whole call over loopback TCP in this one
process (both ends: encode, send, receive, decode, the answer back; sequential calls, so each waits for a wake-up).

`--code DIR` imports the coordinator from another checkout (DIR/coordinator), to compare two versions of the
channel on the same messages: run it for each, alternating, since this machine's speed moves from minute to minute.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
import uuid
from typing import Any

N_CALLS = 2000


class Files:
    """Stands for the file IO: a process-local object, with the one method a proposal's clean-up may name."""

    async def delete(self, uri: str, *, within: str) -> None:
        pass


def iceberg_metadata(snapshots: int) -> dict:
    schema = {"type": "struct", "schema-id": 0, "fields": [
        {"id": 1, "name": "id", "type": "long", "required": False},
        {"id": 2, "name": "data", "type": "string", "required": False}]}
    snaps = [{"snapshot-id": 1000 + i, "parent-snapshot-id": 999 + i if i else None, "sequence-number": i + 1,
              "timestamp-ms": 1795859921740 + i, "manifest-list": f"file:///w/db/t/metadata/snap-{1000 + i}.avro",
              "summary": {"operation": "append", "added-data-files": "1", "added-records": "100"}, "schema-id": 0}
             for i in range(snapshots)]
    return {"format-version": 2, "table-uuid": str(uuid.UUID(int=7)), "location": "file:///w/db/t",
            "last-sequence-number": snapshots, "last-updated-ms": 1795859921740, "last-column-id": 2,
            "current-schema-id": 0, "schemas": [schema], "default-spec-id": 0,
            "partition-specs": [{"spec-id": 0, "fields": []}], "last-partition-id": 999,
            "default-sort-order-id": 0, "sort-orders": [{"order-id": 0, "fields": []}], "properties": {},
            "current-snapshot-id": 999 + snapshots, "snapshots": snaps,
            "refs": {"main": {"snapshot-id": 999 + snapshots, "type": "branch"}},
            "snapshot-log": [{"snapshot-id": s["snapshot-id"], "timestamp-ms": s["timestamp-ms"]} for s in snaps],
            "metadata-log": []}


def forwarded_commits(files: Any) -> dict[str, tuple[Any, Any]]:
    """Each format's commit proposal, built as its service builds it from a client's request (`files` is the
    process-local file IO it refers to), and the owner's reply to it."""
    import orjson

    from coordinator.delta.models import CommitRequest
    from coordinator.delta.proposals import Commit
    from coordinator.iceberg.proposals import CommitTable
    from coordinator.iceberg.rules.requirements import parse_requirements
    from coordinator.iceberg.rules.updates import parse_updates
    from coordinator.iceberg.state import IcebergTable, TableIdent
    from coordinator.lance.proposals import CreateVersion
    from coordinator.lance.state import TableVersion

    ident = TableIdent("", ("db", "inner"), "t")
    snapshot = {"snapshot-id": 2908447184277675711, "parent-snapshot-id": 17, "sequence-number": 2,
                "timestamp-ms": 1795859921740, "manifest-list": "file:///w/db/t/metadata/snap-1.avro",
                "summary": {"operation": "append", "added-records": "100"}, "schema-id": 0}
    iceberg = CommitTable(
        ident,
        parse_requirements([{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": 17},
                            {"type": "assert-table-uuid", "uuid": str(uuid.UUID(int=7))}]),
        parse_updates([{"action": "add-snapshot", "snapshot": snapshot},
                       {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch",
                        "snapshot-id": 2908447184277675711},
                       {"action": "set-properties", "updates": {"k": "v"}}]),
        None, files, "file:///w")
    metadata = iceberg_metadata(10)
    iceberg_reply = IcebergTable(ident, metadata, "file:///w/db/t/metadata/00010-x.metadata.json",
                                 orjson.dumps(metadata))
    delta = Commit(CommitRequest.model_validate({
        "table_id": str(uuid.UUID(int=8)), "table_uri": "file:///w/t",
        "commit_info": {"version": 1, "timestamp": 1795859933286, "file_name": "00000000000000000001.a.json",
                        "file_size": 2048, "file_modification_timestamp": 1795859933286},
        "metadata": {"schema": [{"name": "id", "type_text": "bigint", "type_name": "LONG", "position": 0,
                                 "nullable": True, "comment_extra": "kept"}],
                     "properties": {"delta.minReaderVersion": "3"}}}), 10, 1795859933287)
    lance = CreateVersion(1, "file:///w/t/_versions/1.manifest-x", b"manifest bytes" * 30, "ab" * 32, "V2",
                          1795859927277, {"k": "v"}, True, functools.partial(files.delete, within="file:///w/t"))
    lance_reply = TableVersion(1, "file:///w/t/_versions/18446744073709551614.manifest", 420, 1795859927277,
                               "V2", lance.staging_uri, lance.sha256, None, {"k": "v"})
    return {"iceberg": (iceberg, iceberg_reply), "delta": (delta, None), "lance": (lance, lance_reply)}


def best_us(fn, reps: int = 2000) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(reps):
            fn()
        best = min(best, (time.process_time() - start) / reps * 1e6)
    return best


def extension_values(codec: Any, payload: bytes) -> int:
    count = 0
    ext = codec._ext

    def counting(code: int, data: bytes) -> Any:
        nonlocal count
        count += 1
        return ext(code, data)
    codec._ext = counting
    try:
        codec.loads(payload)
    finally:
        codec._ext = ext
    return count


async def call_us(fmt: str) -> float:
    """CPU per call of `fmt`'s forwarded commit over loopback TCP (both ends in this process), sequential calls."""
    import trio

    from coordinator.cluster.channel import ChannelServer, Peer
    from coordinator.cluster.wire import Codec

    files = Files()
    proposal, reply = forwarded_commits(files)[fmt]

    async def submit(*args: Any) -> Any:
        return reply

    key = b"k" * 32
    server = ChannelServer(Codec({"files": Files()}), {"submit": submit}, key)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(server.serve, "127.0.0.1", 0)
        peer = Peer(f"127.0.0.1:{listeners[0].socket.getsockname()[1]}", Codec({"files": files}), nursery, key)
        args = (uuid.uuid4(), proposal, uuid.uuid4())
        await peer.call("submit", *args)
        start = time.process_time()
        for _ in range(N_CALLS):
            await peer.call("submit", *args)
        used = time.process_time() - start
        nursery.cancel_scope.cancel()
    return used / N_CALLS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", help="import the coordinator from this checkout instead of this one")
    opts = parser.parse_args()
    if opts.code:
        sys.path.insert(0, opts.code)
    import trio

    from coordinator.cluster import wire

    print(f"coordinator from {wire.__file__}")
    files = Files()
    codec = wire.Codec({"files": files})
    print("| format | call bytes | call extension values | reply bytes | reply extension values | encode us "
          "(call + reply) | decode us (call + reply) | whole call, both ends, us CPU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for fmt, (proposal, reply) in forwarded_commits(files).items():
        cells, encode, decode = [], 0.0, 0.0
        for message in ([7, "submit", [uuid.uuid4(), proposal, uuid.uuid4()]], [7, True, reply]):
            payload = codec.dumps(message)
            cells += [str(len(payload)), str(extension_values(codec, payload))]
            encode += best_us(lambda: codec.dumps(message))
            decode += best_us(lambda: codec.loads(payload))
        print(f"| {fmt} | {' | '.join(cells)} | {encode:.1f} | {decode:.1f} | {trio.run(call_us, fmt):.0f} |")


if __name__ == "__main__":
    main()
