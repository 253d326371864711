"""An Iceberg writer's files, written with pyiceberg's own writers, for tests of appends the service rebases
(coordinator/iceberg/rebase.py): data file entries, manifests, manifest lists and the commit that names them,
as pyiceberg's and Java's fast append write them, and the ways a broken or non-append commit differs.

The data files are only named (no Parquet is written): what these tests read back is the metadata.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (DataFile, DataFileContent, FileFormat, ManifestContent, ManifestEntry,
                                ManifestEntryStatus, ManifestFile, write_manifest, write_manifest_list)
from pyiceberg.table.metadata import TableMetadataUtil
from pyiceberg.typedef import Record

from coordinator.iceberg.rebase import assign_row_ids
from coordinator.iceberg.manifest_lists import (Manifest, as_manifest, as_manifest_file, read_manifest_entries,
                                                read_manifest_list, write_list)

IO = PyArrowFileIO()


def new_snapshot_id() -> int:
    return random.getrandbits(62) + 1


def data_file(location: str, rows: int, content: DataFileContent = DataFileContent.DATA) -> DataFile:
    return DataFile.from_args(content=content, file_path=f"{location}/data/{uuid.uuid4().hex}.parquet",
                              file_format=FileFormat.PARQUET, partition=Record(), record_count=rows,
                              file_size_in_bytes=100 + rows, sort_order_id=None, spec_id=0, equality_ids=None,
                              key_metadata=None)


def manifest(metadata: dict, snapshot_id: int, files: list[DataFile], *,
             status: ManifestEntryStatus = ManifestEntryStatus.ADDED, sequence_number: int | None = None,
             content: ManifestContent = ManifestContent.DATA) -> ManifestFile:
    """A manifest of `files`, all with `status` (and, given, their own data sequence number), written as
    pyiceberg's v2 writer writes it."""
    table = TableMetadataUtil.parse_obj(metadata)
    path = f"{metadata['location']}/metadata/{uuid.uuid4().hex}-m0.avro"
    with write_manifest(min(table.format_version, 2), table.spec(), table.schema(), IO.new_output(path),
                        snapshot_id, "gzip") as writer:
        for f in files:
            entry = ManifestEntry.from_args(status=status, snapshot_id=snapshot_id, sequence_number=sequence_number,
                                            file_sequence_number=None, data_file=f)
            writer.add_entry(entry)
        made = writer.to_manifest_file()
    if content != ManifestContent.DATA:
        made = ManifestFile(*[made[i] for i in range(len(made))])
        made[3] = content
    return made


def manifests_of(metadata: dict, snapshot_id: int | None) -> list[Manifest]:
    """The manifests of a snapshot of the table, read back."""
    if snapshot_id is None:
        return []
    snap = next(s for s in metadata["snapshots"] if s["snapshot-id"] == snapshot_id)
    path = snap["manifest-list"]
    return read_manifest_list(path, IO.new_input(path).open().read())


def write_manifest_list_file(metadata: dict, snapshot_id: int, parent_id: int | None, sequence_number: int,
                             manifests: list, first_row_id: int | None = None) -> str:
    """A manifest list holding `manifests` (pyiceberg ManifestFiles and `Manifest`s read back, in order)."""
    path = f"{metadata['location']}/metadata/snap-{snapshot_id}-0-{uuid.uuid4().hex}.avro"
    version = metadata["format-version"]
    if version <= 2:
        records = [m if isinstance(m, ManifestFile) else as_manifest_file(m, version) for m in manifests]
        with write_manifest_list(version, IO.new_output(path), snapshot_id, parent_id,
                                 sequence_number if version == 2 else None, "gzip") as writer:
            writer.add_manifests(records)
    else:   # (pyiceberg 0.12 writes no v3 list: the service's, which is pyiceberg's Avro writer with its v3 schema)
        plain = [m if isinstance(m, Manifest) else as_manifest(m) for m in manifests]
        plain, _ = assign_row_ids(tuple(plain), first_row_id)   # (as Java's v3 writer does)
        with IO.new_output(path).create() as out:
            out.write(write_list(path, 3, snapshot_id, parent_id, sequence_number, plain, "gzip", first_row_id))
    return path


def head(metadata: dict, ref: str = "main") -> int | None:
    entry = (metadata.get("refs") or {}).get(ref)
    return None if entry is None else entry["snapshot-id"]


def append(metadata: dict, rows: int = 1, *, ref: str = "main", files: list[DataFile] | None = None,
           snapshot_id: int | None = None, own: list | None = None, inherited: list | None = None,
           operation: str = "append", summary: dict | None = None, extra_updates: list | None = None,
           requirements: list | None = None) -> dict[str, Any]:
    """The body of a commit appending `rows` rows (one data file) on the branch's head in `metadata`, as a client
    holding that metadata sends it. `own`/`inherited` replace the list's manifests of this snapshot / of others
    (the parent's by default)."""
    snapshot_id = snapshot_id or new_snapshot_id()
    parent = head(metadata, ref)
    files = files if files is not None else [data_file(metadata["location"], rows)]
    own = own if own is not None else [manifest(metadata, snapshot_id, files)]
    inherited = inherited if inherited is not None else manifests_of(metadata, parent)
    sequence_number = (metadata.get("last-sequence-number") or 0) + 1
    first_row_id = metadata.get("next-row-id") if metadata["format-version"] >= 3 else None
    manifest_list = write_manifest_list_file(metadata, snapshot_id, parent, sequence_number, [*own, *inherited],
                                             first_row_id)
    added = sum(f.record_count for f in files)
    parent_summary = next((s["summary"] for s in metadata.get("snapshots", []) if s["snapshot-id"] == parent), {})
    snapshot = {"snapshot-id": snapshot_id, "timestamp-ms": _now_ms(),
                "manifest-list": manifest_list, "schema-id": metadata.get("current-schema-id", 0),
                "summary": summary or {"operation": operation, "added-data-files": str(len(files)),
                                       "added-records": str(added),
                                       "added-files-size": str(sum(f.file_size_in_bytes for f in files)),
                                       "total-records": str(int(parent_summary.get("total-records", 0)) + added),
                                       "total-data-files": str(int(parent_summary.get("total-data-files", 0))
                                                               + len(files))}}
    if parent is not None:
        snapshot["parent-snapshot-id"] = parent
    if metadata["format-version"] >= 2:
        snapshot["sequence-number"] = sequence_number
    if first_row_id is not None:
        snapshot.update({"first-row-id": first_row_id, "added-rows": added})
    return {"requirements": requirements if requirements is not None else [
                {"type": "assert-table-uuid", "uuid": metadata["table-uuid"]},
                {"type": "assert-ref-snapshot-id", "ref": ref, "snapshot-id": parent}],
            "updates": [{"action": "add-snapshot", "snapshot": snapshot},
                        {"action": "set-snapshot-ref", "ref-name": ref, "type": "branch", "snapshot-id": snapshot_id},
                        *(extra_updates or [])]}


def _now_ms() -> int:
    import time
    return int(time.time() * 1000)


def data_files(metadata: dict, snapshot_id: int | None) -> set[str]:
    """The live data files of a snapshot, read from its manifests."""
    out = set()
    for m in manifests_of(metadata, snapshot_id):
        for entry in read_manifest_entries(m.path, IO.new_input(m.path).open().read()):
            if entry.status != ManifestEntryStatus.DELETED and m.content == 0:
                out.add(entry.data_file.file_path)
    return out
