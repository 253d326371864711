"""The chaos test's rebased Iceberg appends (docs/rebasing.md): the files its writers on the rebasing table write,
with pyiceberg's writers (the lists with the service's, which are pyiceberg's too), and the check of what they
read back.

Each commit appends one data file named after its commit id (`data/<cid>.parquet`, only named: nobody reads it), in
a manifest of its own, listed with its base snapshot's manifests; the writers race on one table, so most commits
are rebased by the service. Read back, every snapshot of main must hold exactly its parent's data files plus its
own: no snapshot missing a data file of its parent, none holding another commit's twice or one nobody sent.
The writers make their files durable (fsync, or an object store's PUT) before they commit, as a client must for
its commit to survive a power loss; the lists the service writes are its own to make durable.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from pyiceberg.manifest import (DataFile, DataFileContent, FileFormat, ManifestEntry, ManifestEntryStatus,
                                write_manifest)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField

from coordinator.iceberg.manifest_lists import MemoryOutput, as_manifest, read_manifest_entries, \
    read_manifest_list, write_list
from coordinator.lance.layout import object_path

TABLE = "tr"
PROPERTIES = {"commit.rebase-appends.enabled": "true"}
SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))


def data_path(location: str, cid: str) -> str:
    return f"{location}/data/{cid}.parquet"


class AppendFiles:
    """Writes one commit's files through the chaos test's client files (local, or the S3 bucket)."""

    def __init__(self, client_files):
        self.client_files = client_files

    def _put(self, location: str, relative: str, data: bytes) -> str:
        uri = f"{location}/{relative}"
        if self.client_files.store is None:
            path = Path("/" + object_path(uri))
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        else:
            self.client_files.put(location, relative, data)
        return uri

    def manifests_of(self, manifest_list: str):
        data = self.client_files.read(object_path(manifest_list))
        if data is None:
            raise FileNotFoundError(manifest_list)
        return read_manifest_list(manifest_list, data)

    def write(self, location: str, cid: str, snapshot_id: int, parent_list: str | None,
              parent: int | None, sequence_number: int) -> str:
        """The commit's manifest and manifest list; the list's URI."""
        entry = ManifestEntry.from_args(
            status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, sequence_number=None, file_sequence_number=None,
            data_file=DataFile.from_args(content=DataFileContent.DATA, file_path=data_path(location, cid),
                                         file_format=FileFormat.PARQUET, partition=Record(), record_count=1,
                                         file_size_in_bytes=64, sort_order_id=None, spec_id=0, equality_ids=None,
                                         key_metadata=None))
        name = f"metadata/{cid}-m0.avro"
        out = MemoryOutput(f"{location}/{name}")
        with write_manifest(2, UNPARTITIONED_PARTITION_SPEC, SCHEMA, out, snapshot_id, "gzip") as writer:
            writer.add(entry)
        own = writer.to_manifest_file()
        self._put(location, name, out.data)
        inherited = self.manifests_of(parent_list) if parent_list else []
        # (the list through the service's writer, which keeps each manifest's encoding: this table's lists grow by
        # one manifest a commit, and pyiceberg's own writer encoding them all again took the load generator's
        # threads the CPU the other writers need)
        name = f"metadata/snap-{snapshot_id}-0-{uuid.uuid4().hex}.avro"
        data = write_list(f"{location}/{name}", 2, snapshot_id, parent, sequence_number,
                          [as_manifest(own), *inherited], "gzip")
        return self._put(location, name, data)


def check(files: AppendFiles, metadata: dict) -> list[str]:
    """Every snapshot of main holds exactly its parent's data files and its own one (`data/<its chaos-id>`)."""
    by_id = {s["snapshot-id"]: s for s in metadata["snapshots"]}
    entries: dict[str, set[str]] = {}   # manifest path -> its live data files

    def data_files(snapshot: dict) -> set[str]:
        out: set[str] = set()
        for m in files.manifests_of(snapshot["manifest-list"]):
            if m.path not in entries:
                data = files.client_files.read(object_path(m.path))
                entries[m.path] = set() if data is None else {
                    e.data_file.file_path for e in read_manifest_entries(m.path, data)
                    if e.status != ManifestEntryStatus.DELETED}
                if data is None:
                    raise FileNotFoundError(m.path)
            out |= entries[m.path]
        return out

    problems, before = [], set()
    chain, at = [], (metadata.get("refs") or {}).get("main", {}).get("snapshot-id")
    while at is not None and at in by_id:
        chain.append(by_id[at])
        at = by_id[at].get("parent-snapshot-id")
    for snapshot in reversed(chain):
        cid = snapshot["summary"].get("chaos-id")
        try:
            held = data_files(snapshot)
        except FileNotFoundError as exc:
            problems.append(f"snapshot {snapshot['snapshot-id']} (commit {cid}): {exc} does not exist")
            break
        lacking, added = before - held, held - before
        if lacking:
            problems.append(f"snapshot {snapshot['snapshot-id']} (commit {cid}) lacks {len(lacking)} data files of "
                            f"its parent, e.g. {sorted(lacking)[0]}")
        if added != {data_path(metadata["location"], cid)}:
            problems.append(f"snapshot {snapshot['snapshot-id']} (commit {cid}) adds {sorted(added)[:3]}, not its "
                            f"own data file")
        before = held
    return problems


def summary(metadata: dict) -> str:
    snapshots = metadata["snapshots"]
    rebased = sum("-rebased-" in s["manifest-list"] for s in snapshots)
    return (f"Iceberg table {TABLE} (rebasing on): {len(snapshots)} snapshots, {rebased} of them rebased by the "
            f"service (on a head their writer had not seen)")
