"""Iceberg appends that write their files, on tables with rebasing on (docs/rebasing.md): the `iceberg-append` flow.

The `iceberg` flow sends commits whose manifest lists nobody writes, which is all a commit the service never
rebases needs. A rebased commit's files are read by the service, so here each commit is what pyiceberg's fast
append makes, with pyiceberg's own writers: the writer reads its base snapshot's manifest list, writes a manifest
of one data file (named only: no Parquet is written, nobody reads it) and a manifest list holding it and the base's
manifests, then commits `add-snapshot` + `set-snapshot-ref main` guarded by `assert-table-uuid` and
`assert-ref-snapshot-id`. A 409 (a commit that is not rebased) is retried as the `iceberg` flow retries it
(its writer, whose commit body and answer this one's replace).

A manifest list holds one entry per manifest and a fast append adds one, so what a commit costs (the client's
list and the service's, the table's metadata) grows with the table's appends. So that layouts compare at the same
list lengths, the writers of a group of tables start `APPENDS_PER_TABLE` appends on one table between them, then
move to the group's next table (made by whoever reaches it first): one table x 8 writers and 8 tables x 1 writer
then commit on lists of the same lengths, 1 to APPENDS_PER_TABLE manifests, and make a new table as often per
commit. (Counting the appends started, not those landed: moving on once an answer showed the table full let the
other writers' appends in flight land beyond it: 39 per table instead of 32 with 8 writers, 63 with 32.) A group's
next table is looked for and made once, by the writer that reaches it first; its other writers go on from what
that creation answered, as writers that had the table all along go on from their last answer. So every layout
sends the same requests per table (a load that finds none, the create), and only the commits differ: when each
writer looked and raced to create, one table x 8 writers sent 1.71 requests per commit against 8 tables' 1.06, and
one table x 32 writers 3.94, the creates that lost answering 409 after a database lookup (`loadtest.rebase_bench`'s
requests/commit column).
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
import trio
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (DataFile, DataFileContent, FileFormat, ManifestEntry, ManifestEntryStatus,
                                read_manifest_list, write_manifest, write_manifest_list)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from .flows import ICEBERG_SCHEMA, Flow, IcebergWriter, Stats, _check, iceberg_commit_body
from .http import HttpConnection

APPENDS_PER_TABLE = 32
REBASE_PROPERTY = "commit.rebase-appends.enabled"
SCHEMA = Schema(NestedField(1, "id", LongType(), required=False), NestedField(2, "data", StringType(), required=False))
IO = PyArrowFileIO()


@dataclass(frozen=True)
class TableGroup:
    """The tables a group's writers append to in turn: `<namespace>.<prefix>_<k>`, k = 0, 1, ..."""

    namespace: str
    prefix: str
    rebase: bool
    started: Counter = field(default_factory=Counter, compare=False)   # appends its writers started, by table k
    made: dict = field(default_factory=dict, compare=False)   # table k: a trio.Event, set once its metadata is in
    metadata: dict = field(default_factory=dict, compare=False)   # table k's metadata as loaded or created

    def path_of(self, k: int) -> str:
        return f"/v1/namespaces/{self.namespace}/tables/{self.prefix}_{k}"


class AppendWriter(IcebergWriter):
    """The `iceberg` flow's writer (its retries after a 409), committing real fast appends to its group's tables."""

    def __init__(self, base: str, table: TableGroup, stats: Stats, appends_per_table: int):
        super().__init__(base, table, stats)
        self.group, self.k = table, 0
        self.appends_per_table = appends_per_table
        self.metadata: dict[str, Any] = {}

    @property
    def table_path(self) -> str:
        return self.group.path_of(self.k)

    async def start(self) -> None:
        await self.enter()

    async def enter(self) -> None:
        """Begin on the group's current table: loaded as a client loads it (made if it is not there yet) by the
        group's first writer to reach it; the others go on from what it found."""
        made = self.group.made.get(self.k)
        if made is not None:
            await made.wait()
            if self.k not in self.group.metadata:
                raise RuntimeError(f"Iceberg table {self.group.prefix}_{self.k} was not made: see the error above")
            self.metadata = self.group.metadata[self.k]
            return
        made = self.group.made[self.k] = trio.Event()
        try:
            status, body = await self.request("GET", self.table_path)
            if status == 404:
                status, body = await self.request("POST", self.table_path.rsplit("/", 1)[0], {
                    "name": f"{self.group.prefix}_{self.k}", "schema": ICEBERG_SCHEMA,
                    "properties": {REBASE_PROPERTY: str(self.group.rebase).lower()}})
            _check(status, body, f"loading Iceberg table {self.group.prefix}_{self.k}")
            self.metadata = self.group.metadata[self.k] = orjson.loads(body)["metadata"]
        finally:
            made.set()

    async def reload(self) -> None:
        """The current table as it is now (after a 409), as a client reloads it."""
        status, body = await self.request("GET", self.table_path)
        _check(status, body, f"loading Iceberg table {self.group.prefix}_{self.k}")
        self.metadata = orjson.loads(body)["metadata"]

    def commit_body(self, new_id: int) -> dict:
        """Write what pyiceberg's fast append writes for one data file; the commit body that names it."""
        snapshot_id = new_id + 1
        md = self.metadata
        parent = md.get("current-snapshot-id")
        parent = None if parent in (None, -1) else parent
        inherited = []
        if parent is not None:
            listed = next(s for s in reversed(md["snapshots"]) if s["snapshot-id"] == parent)["manifest-list"]
            inherited = list(read_manifest_list(IO.new_input(listed)))
        location = md["location"]
        data = DataFile.from_args(content=DataFileContent.DATA, file_path=f"{location}/data/{uuid.uuid4().hex}.parquet",
                                  file_format=FileFormat.PARQUET, partition=Record(), record_count=100,
                                  file_size_in_bytes=4096, sort_order_id=None, spec_id=0, equality_ids=None,
                                  key_metadata=None)
        with write_manifest(2, UNPARTITIONED_PARTITION_SPEC, SCHEMA,
                            IO.new_output(f"{location}/metadata/{uuid.uuid4().hex}-m0.avro"), snapshot_id,
                            "gzip") as writer:
            writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id,
                                               sequence_number=None, file_sequence_number=None, data_file=data))
        sequence_number = md.get("last-sequence-number", 0) + 1
        manifest_list = f"{location}/metadata/snap-{snapshot_id}-0-{uuid.uuid4().hex}.avro"
        with write_manifest_list(2, IO.new_output(manifest_list), snapshot_id, parent, sequence_number,
                                 "gzip") as lists:
            lists.add_manifests([writer.to_manifest_file(), *inherited])
        body = iceberg_commit_body(parent, snapshot_id, sequence_number, manifest_list=manifest_list)
        body["requirements"].insert(0, {"type": "assert-table-uuid", "uuid": md["table-uuid"]})
        return body

    async def commit(self, deadline: float) -> bool:
        """One append (retried after a 409 as the `iceberg` flow does), on the group's first table on which its
        writers have not started `appends_per_table` yet."""
        while self.group.started[self.k] >= self.appends_per_table:
            self.k += 1
            await self.enter()
        self.group.started[self.k] += 1   # (no wait between the check and this: the writers share one trio thread)
        return await super().commit(deadline)

    async def landed(self, new_id: int, answer: bytes) -> None:
        """Go on from what the answer says was committed (a rebased append's parent is not the one it sent)."""
        self.metadata = orjson.loads(answer)["metadata"]


class IcebergAppendFlow(Flow):
    """`iceberg-append`: tables with rebasing on; `iceberg-append-409`: the same appends, rebasing off."""

    durable_file = True

    def __init__(self, rebase: bool = True, appends_per_table: int = APPENDS_PER_TABLE):
        self.rebase = rebase
        self.appends_per_table = appends_per_table
        self.name = "iceberg-append" if rebase else "iceberg-append-409"

    async def prepare(self, base: str, count: int, tag: str) -> list[TableGroup]:
        conn = HttpConnection(base)
        status, body = await conn.request("POST", "/v1/namespaces", {"namespace": [tag]})
        await conn.close()
        _check(status, body, f"creating Iceberg namespace {tag}")
        return [TableGroup(tag, f"g{i}", self.rebase) for i in range(count)]

    def writer(self, base: str, table: TableGroup, stats: Stats) -> AppendWriter:
        return AppendWriter(base, table, stats, self.appends_per_table)

    def sample_request(self, table: int = 0) -> tuple[str, Any]:
        return f"/v1/namespaces/bench/tables/g{table}_0", iceberg_commit_body(7, 8, 2)
