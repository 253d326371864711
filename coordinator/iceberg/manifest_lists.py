"""Iceberg manifest lists and manifests as the append rebase (rebase.py) reads and writes them, through pyiceberg's
own Avro reader and writers: never hand-written Avro.

A manifest list's entries are kept as `Manifest`s, plain named tuples of the spec's `manifest_file` fields (v3's
field order, `first_row_id` last), not as pyiceberg's records: they are what a prepared rebase carries to the
table's owner, across the cluster channel too (coordinator/cluster/wire.py builds only the project's own types).
Reading and parsing block; callers run them on a file thread (`rebase.read_for_rebase`).

pyiceberg 0.12 reads manifest lists with its v2 schema (which drops v3's `first_row_id`) and writes only v1 and v2
lists. A v3 list is read and written here with pyiceberg's `AvroFile`/`AvroOutputFile` and its own v3 schema
(`MANIFEST_LIST_FILE_SCHEMAS[3]`); those names are checked at import, so a pyiceberg that moved them fails at
start with one line instead of on a commit.
"""

from __future__ import annotations

import io
from typing import Iterable, NamedTuple

from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO, KNOWN_CODECS
from pyiceberg.avro.file import AvroFile, AvroOutputFile
from pyiceberg.io import InputFile, OutputFile
from pyiceberg.manifest import (MANIFEST_ENTRY_SCHEMAS, MANIFEST_LIST_FILE_SCHEMAS, UNASSIGNED_SEQ, DataFile,
                                DataFileContent, FileFormat, ManifestContent, ManifestEntry, ManifestEntryStatus,
                                ManifestFile, PartitionFieldSummary, write_manifest_list)

_V3_FIELDS = [f.name for f in MANIFEST_LIST_FILE_SCHEMAS[3].fields] if 3 in MANIFEST_LIST_FILE_SCHEMAS else []
if _V3_FIELDS[-1:] != ["first_row_id"] or 2 not in MANIFEST_ENTRY_SCHEMAS:
    raise ImportError("coordinator.iceberg.manifest_lists needs pyiceberg 0.12's manifest schemas "
                      "(MANIFEST_LIST_FILE_SCHEMAS[3] ending in first_row_id); install pyiceberg>=0.12,<0.13")

DATA = int(ManifestContent.DATA)
WRITE_AVRO_COMPRESSION = "write.avro.compression-codec"   # pyiceberg's and Java's table property
WRITE_AVRO_COMPRESSION_DEFAULT = "gzip"


class PartitionSummary(NamedTuple):
    contains_null: bool
    contains_nan: bool | None
    lower_bound: bytes | None
    upper_bound: bytes | None


class Manifest(NamedTuple):
    """One entry of a manifest list (the spec's `manifest_file`), in v3's field order."""

    path: str
    length: int
    partition_spec_id: int
    content: int
    sequence_number: int
    min_sequence_number: int
    added_snapshot_id: int
    added_files_count: int | None
    existing_files_count: int | None
    deleted_files_count: int | None
    added_rows_count: int | None
    existing_rows_count: int | None
    deleted_rows_count: int | None
    partitions: tuple[PartitionSummary, ...] | None
    key_metadata: bytes | None
    first_row_id: int | None


class NotAvro(ValueError):
    """A file that pyiceberg's reader cannot read as what it was named as."""


class _Bytes(InputFile):
    def __init__(self, location: str, data: bytes):
        super().__init__(location)
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True):
        return io.BytesIO(self._data)


class _Buffer(OutputFile):
    """An output pyiceberg's writers write into memory; `data` once they closed it."""

    def __init__(self, location: str):
        super().__init__(location)
        self.data = b""

    def __len__(self) -> int:
        return len(self.data)

    def exists(self) -> bool:
        return False

    def to_input_file(self) -> InputFile:
        return _Bytes(self.location, self.data)

    def create(self, overwrite: bool = False):
        out = self

        class Buffer(io.BytesIO):
            def close(self) -> None:
                if not self.closed:
                    out.data = self.getvalue()
                super().close()
        return Buffer()


def as_manifest(record: ManifestFile) -> Manifest:
    values = [record[i] for i in range(len(record))]
    values += [None] * (len(Manifest._fields) - len(values))
    partitions = values[13]
    values[3] = int(values[3])
    values[13] = None if partitions is None else tuple(PartitionSummary(*(p[i] for i in range(4))) for p in partitions)
    return Manifest(*values)


def as_manifest_file(m: Manifest, format_version: int) -> ManifestFile:
    partitions = None if m.partitions is None else [PartitionFieldSummary(*p) for p in m.partitions]
    values = [*m[:3], ManifestContent(m.content), *m[4:13], partitions, m.key_metadata]
    return ManifestFile(*values, *([m.first_row_id] if format_version >= 3 else []))


def read_manifest_list(location: str, data: bytes) -> list[Manifest]:
    """A manifest list's entries (any format version, read with v3's schema: `first_row_id` None before v3)."""
    try:
        with AvroFile[ManifestFile](_Bytes(location, data), MANIFEST_LIST_FILE_SCHEMAS[3],
                                    read_types={-1: ManifestFile, 508: PartitionFieldSummary},
                                    read_enums={517: ManifestContent}) as reader:
            return [as_manifest(record) for record in reader]
    except Exception as exc:  # noqa: BLE001 - any failure of the reader: the bytes are not a manifest list
        raise NotAvro(f"{location} is not an Avro manifest list ({type(exc).__name__}: {exc})"[:500]) from None


def read_manifest_entries(location: str, data: bytes) -> list[ManifestEntry]:
    """A manifest's entries as written (no sequence number inherited from the list, unlike pyiceberg's
    `ManifestFile.fetch_manifest_entry`): what the rebase checks is what the file itself says."""
    try:
        with AvroFile[ManifestEntry](_Bytes(location, data), MANIFEST_ENTRY_SCHEMAS[2],
                                     read_types={-1: ManifestEntry, 2: DataFile},
                                     read_enums={0: ManifestEntryStatus, 101: FileFormat,
                                                 134: DataFileContent}) as reader:
            return list(reader)
    except Exception as exc:  # noqa: BLE001 - as above
        raise NotAvro(f"{location} is not an Avro manifest ({type(exc).__name__}: {exc})"[:500]) from None


def added_only(entry: ManifestEntry, snapshot_id: int) -> str | None:
    """Why `entry` is not a data file this snapshot added; None if it is."""
    if entry.status != ManifestEntryStatus.ADDED:
        return f"an entry with status {entry.status.name}"
    if entry.data_file.content != DataFileContent.DATA:
        return f"a {entry.data_file.content.name.lower().replace('_', ' ')} file"
    if entry.snapshot_id not in (None, snapshot_id):
        return f"an entry of snapshot {entry.snapshot_id}"
    return None


def written_sequence_numbers(entry: ManifestEntry) -> list[int]:
    """The sequence numbers an entry carries itself (most writers leave them to be inherited; DuckDB writes its
    data sequence number)."""
    return [n for n in (entry.sequence_number, entry.file_sequence_number) if n is not None]


def avro_codec(properties: dict[str, str]) -> str:
    """The codec a table's writers use for Avro files (pyiceberg's default, gzip, if the property names none
    pyiceberg writes)."""
    codec = properties.get(WRITE_AVRO_COMPRESSION, WRITE_AVRO_COMPRESSION_DEFAULT)
    return codec if CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec, codec) in KNOWN_CODECS else WRITE_AVRO_COMPRESSION_DEFAULT


def write_list(location: str, format_version: int, snapshot_id: int, parent_snapshot_id: int | None,
               sequence_number: int, manifests: Iterable[Manifest], codec: str,
               first_row_id: int | None = None) -> bytes:
    """A snapshot's manifest list. Manifests this snapshot added whose sequence numbers are UNASSIGNED_SEQ get
    `sequence_number` (pyiceberg's v2 writer assigns them; the v3 path does the same)."""
    out = _Buffer(location)
    if format_version <= 2:
        with write_manifest_list(format_version, out, snapshot_id, parent_snapshot_id,
                                 sequence_number if format_version == 2 else None, codec) as writer:
            writer.add_manifests([as_manifest_file(m, format_version) for m in manifests])
        return out.data
    meta = {"snapshot-id": str(snapshot_id),
            "parent-snapshot-id": "null" if parent_snapshot_id is None else str(parent_snapshot_id),
            "sequence-number": str(sequence_number), "first-row-id": str(first_row_id), "format-version": "3",
            AVRO_CODEC_KEY: codec}
    assigned = [m._replace(sequence_number=sequence_number if m.sequence_number == UNASSIGNED_SEQ else m.sequence_number,
                           min_sequence_number=sequence_number if m.min_sequence_number == UNASSIGNED_SEQ
                           else m.min_sequence_number) for m in manifests]
    with AvroOutputFile[ManifestFile](out, MANIFEST_LIST_FILE_SCHEMAS[3], "manifest_file",
                                      record_schema=MANIFEST_LIST_FILE_SCHEMAS[3], metadata=meta) as writer:
        writer.write_block([as_manifest_file(m, 3) for m in assigned])
    return out.data
