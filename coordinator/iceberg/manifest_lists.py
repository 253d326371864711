"""Iceberg manifest lists and manifests as the append rebase (rebase.py) reads and writes them, through pyiceberg's
own Avro reader and writers: never hand-written Avro.

A manifest list's entries are kept as `Manifest`s, plain named tuples of the spec's `manifest_file` fields (v3's
field order, `first_row_id` last), not as pyiceberg's records: they are what a prepared rebase carries to the
table's owner, across the cluster channel too (coordinator/cluster/wire.py builds only the project's own types).
Reading and parsing block; callers run them on a file thread (`rebase.read_for_rebase`).

pyiceberg 0.12 reads manifest lists with its v2 schema (which drops v3's `first_row_id`) and writes only v1 and v2
lists. So every list is read and written here with pyiceberg's `AvroFile`/`AvroOutputFile` and its own schemas
(`MANIFEST_LIST_FILE_SCHEMAS`), as its own list writers do (the v1/v2 header fields, sequence numbers assigned to the
snapshot's own manifests), with the schema work done once (`_AvroFile`, `_ListWriter`).
"""

from __future__ import annotations

import functools
import io
import json
import os
import threading
from collections import OrderedDict
from typing import Any, Iterable, NamedTuple

import pyiceberg.avro.file as avro_file
from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO, KNOWN_CODECS
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.encoder import BinaryEncoder
from pyiceberg.avro.file import AvroFile, AvroFileHeader, AvroOutputFile
from pyiceberg.avro.resolver import construct_reader, construct_writer, resolve_reader, resolve_writer
from pyiceberg.io import InputFile, OutputFile
from pyiceberg.manifest import (MANIFEST_ENTRY_SCHEMAS, MANIFEST_LIST_FILE_SCHEMAS, UNASSIGNED_SEQ, DataFile,
                                DataFileContent, FileFormat, ManifestContent, ManifestEntry, ManifestEntryStatus,
                                ManifestFile, PartitionFieldSummary)
from pyiceberg.typedef import StructProtocol
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

# What of pyiceberg 0.12 this module leans on beyond its public API (see _AvroFile, _ListWriter): checked here, so a
# pyiceberg that moved any of it fails at start with one line instead of on a commit.
_V3_FIELDS = [f.name for f in MANIFEST_LIST_FILE_SCHEMAS[3].fields] if 3 in MANIFEST_LIST_FILE_SCHEMAS else []
if (_V3_FIELDS[-1:] != ["first_row_id"] or 2 not in MANIFEST_ENTRY_SCHEMAS
        or not all(hasattr(avro_file, name) for name in ("MAGIC", "META_SCHEMA", "SYNC_SIZE", "_SCHEMA_KEY"))
        or not hasattr(AvroFile, "_read_header") or not hasattr(AvroOutputFile, "_write_header")):
    raise ImportError("coordinator.iceberg.manifest_lists needs pyiceberg 0.12's Avro file classes and manifest "
                      "schemas (MANIFEST_LIST_FILE_SCHEMAS[3] ending in first_row_id); install pyiceberg>=0.12,<0.13")

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


class TooManyManifests(ValueError):
    """A manifest list with more entries than its reader may hold."""


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


class _Buffer(io.BytesIO):
    def __init__(self, out: "MemoryOutput"):
        super().__init__()
        self.out = out

    def close(self) -> None:
        if not self.closed:
            self.out.data = self.getvalue()
        super().close()


class MemoryOutput(OutputFile):
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

    def create(self, overwrite: bool = False) -> _Buffer:
        return _Buffer(self)


# -- pyiceberg's Avro reader and writer, their schema work done once ----------------------------------------------
#
# Reading a small manifest, or writing a small list, was nearly all per-file schema work: resolving a reader for
# the header's fixed schema, converting the file's Avro schema to Iceberg's and resolving a reader for it (a
# writer's files all carry the same schema), and for a list, resolving the writer and converting its schema back
# to Avro. Each is done once per distinct schema here.

_READERS: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
_READERS_LOCK = threading.Lock()
READERS_KEPT = 64
SCHEMA_KEPT_BYTES = 64 << 10   # a file's schema longer than this is resolved each time, never kept


@functools.lru_cache(maxsize=None)
def _header_reader() -> Any:
    return construct_reader(avro_file.META_SCHEMA, {-1: AvroFileHeader})


class _AvroFile(AvroFile):
    """pyiceberg's AvroFile, whose `__enter__` (read the header, resolve the reader) takes the reader of a schema
    it resolved before from `_READERS`, and reads the header with one reader made once (pyiceberg resolves the
    header's fixed schema again for every file: half of reading a small manifest)."""

    def _read_header(self) -> AvroFileHeader:
        return _header_reader().read(self.decoder)

    def __enter__(self) -> "_AvroFile":
        with self.input_file.open() as f:
            self.decoder = new_decoder(f.read())
        self.header = self._read_header()
        text = self.header.meta.get(avro_file._SCHEMA_KEY)
        # (a reader builds the records of the types and enums it was resolved with: named by value, since an id
        # of a dict that was freed can name another one later)
        key = (text, id(self.read_schema), tuple(self.read_types.items()), tuple(self.read_enums.items()))
        with _READERS_LOCK:
            hit = _READERS.get(key)
            if hit is not None:
                _READERS.move_to_end(key)
        if hit is not None:
            self.schema, self.reader = hit
            return self
        self.schema = self.header.get_schema()
        self.reader = resolve_reader(self.schema, self.read_schema, self.read_types, self.read_enums)
        if text is not None and len(text) <= SCHEMA_KEPT_BYTES:
            with _READERS_LOCK:
                _READERS[key] = (self.schema, self.reader)
                while len(_READERS) > READERS_KEPT:
                    _READERS.popitem(last=False)
        return self


ENCODINGS_KEPT = 20_000   # manifests whose encoding in a list is kept (a few hundred bytes each)


class _KeptEncodings:
    """pyiceberg's writer of a list's records, each `Manifest`'s encoding kept: a branch's manifests are written
    again, unchanged, in every list after them, and encoding them (pyiceberg's encoder is Python) was most of what
    a list cost. A `Manifest` is a tuple in v3's field order, which the writer reads by position as it reads
    pyiceberg's records."""

    def __init__(self, writer: Any):
        self.writer = writer
        self.kept: OrderedDict[Manifest, bytes] = OrderedDict()
        self.lock = threading.Lock()

    def write(self, encoder: BinaryEncoder, manifest: Manifest) -> None:
        data = self.kept.get(manifest)   # (a lookup is atomic; changes take the lock)
        if data is None:
            out = io.BytesIO()
            self.writer.write(BinaryEncoder(out), manifest)
            data = out.getvalue()
            with self.lock:
                self.kept[manifest] = data
                if len(self.kept) > ENCODINGS_KEPT:
                    self.kept.popitem(last=False)
        encoder.write(data)


@functools.lru_cache(maxsize=None)
def _list_writer(format_version: int) -> tuple[_KeptEncodings, str]:
    """The writer of a v`format_version` list from v3-shaped records, and that file schema as Avro JSON."""
    schema = MANIFEST_LIST_FILE_SCHEMAS[format_version]
    return (_KeptEncodings(resolve_writer(record_schema=MANIFEST_LIST_FILE_SCHEMAS[3], file_schema=schema)),
            json.dumps(AvroSchemaConversion().iceberg_to_avro(schema, schema_name="manifest_file")))


@functools.lru_cache(maxsize=None)
def _header_writer() -> Any:
    return construct_writer(avro_file.META_SCHEMA)


class _ListWriter(AvroOutputFile):
    """pyiceberg's AvroOutputFile for a manifest list of `format_version` (records in v3's shape), its writer and
    header schema taken from `_list_writer` instead of made again for each file."""

    def __init__(self, output_file: OutputFile, format_version: int, metadata: dict[str, str]):
        self.output_file = output_file
        self.file_schema = MANIFEST_LIST_FILE_SCHEMAS[format_version]
        self.schema_name = "manifest_file"
        self.sync_bytes = os.urandom(avro_file.SYNC_SIZE)
        self.writer, self._schema_json = _list_writer(format_version)
        self.metadata = metadata

    def _write_header(self) -> None:
        codec = self.metadata[AVRO_CODEC_KEY]
        meta = {**self.metadata, avro_file._SCHEMA_KEY: self._schema_json,
                AVRO_CODEC_KEY: CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec, codec)}
        _header_writer().write(self.encoder, AvroFileHeader(avro_file.MAGIC, meta, self.sync_bytes))


class _Fields(list):
    """A record as pyiceberg's Avro reader fills it, field by position: a list, whose item assignment is C, where
    pyiceberg's own records (`ManifestFile`, `PartitionFieldSummary`) take a Python call per field, a quarter of
    decoding a manifest list. Only this module reads them, by the positions of v3's `manifest_file`
    (`Manifest`'s field order); `content` stays the spec's int."""

    __slots__ = ()

    def __init__(self, *values: Any):   # (how the reader makes a record: one argument per field)
        super().__init__(values)


StructProtocol.register(_Fields)
_PATH, _ADDED_SNAPSHOT_ID = Manifest._fields.index("path"), Manifest._fields.index("added_snapshot_id")
_LIST_TYPES = {-1: _Fields, 508: _Fields}   # a manifest_file and its partition field summaries
_ENTRY_TYPES = {-1: ManifestEntry, 2: DataFile}
_ENTRY_ENUMS = {0: ManifestEntryStatus, 101: FileFormat, 134: DataFileContent}


def as_manifest(record: ManifestFile | _Fields) -> Manifest:
    values = [record[i] for i in range(len(record))]
    values += [None] * (len(Manifest._fields) - len(values))
    partitions = values[13]
    values[3] = int(values[3])
    values[13] = None if partitions is None else tuple(PartitionSummary(*(p[i] for i in range(4))) for p in partitions)
    return Manifest(*values)


def as_manifest_file(m: Manifest, format_version: int = 3) -> ManifestFile:
    """pyiceberg's record of `m`: with v3's fields (as `_ListWriter` writes it), or as its v1/v2 writers want."""
    partitions = None if m.partitions is None else [PartitionFieldSummary(*p) for p in m.partitions]
    values = [*m[:3], ManifestContent(m.content), *m[4:13], partitions, m.key_metadata]
    return ManifestFile(*values, *([m.first_row_id] if format_version >= 3 else []))


def _records(location: str, data: bytes, limit: int | None) -> list[_Fields]:
    """A manifest list's entries, read with v3's schema (`first_row_id` None before v3)."""
    out: list[_Fields] = []
    try:
        with _AvroFile(_Bytes(location, data), MANIFEST_LIST_FILE_SCHEMAS[3],
                       read_types=_LIST_TYPES) as reader:
            for record in reader:
                if limit is not None and len(out) >= limit:
                    raise TooManyManifests(f"{location} lists more than {limit} manifests: rewrite the table's "
                                           f"manifests (Spark: CALL system.rewrite_manifests)")
                out.append(record)
    except TooManyManifests:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the reader: the bytes are not a manifest list
        raise NotAvro(f"{location} is not an Avro manifest list ({type(exc).__name__}: {exc})"[:500]) from None
    return out


def read_manifest_list(location: str, data: bytes, limit: int | None = None) -> list[Manifest]:
    """A manifest list's entries (any format version); at most `limit` of them (TooManyManifests beyond)."""
    return [as_manifest(record) for record in _records(location, data, limit)]


def split_manifest_list(location: str, data: bytes, snapshot_id: int, limit: int | None = None
                        ) -> tuple[list[Manifest], list[str]]:
    """A snapshot's manifest list as the manifests that snapshot added and the paths of the others (which are
    only compared, so not converted: a third of reading a long list)."""
    own, others = [], []
    for record in _records(location, data, limit):
        if record[_ADDED_SNAPSHOT_ID] == snapshot_id:
            own.append(as_manifest(record))
        else:
            others.append(record[_PATH])
    return own, others


def read_manifest_entries(location: str, data: bytes) -> list[ManifestEntry]:
    """A manifest's entries as written (no sequence number inherited from the list, unlike pyiceberg's
    `ManifestFile.fetch_manifest_entry`): what the rebase checks is what the file itself says."""
    try:
        with _AvroFile(_Bytes(location, data), MANIFEST_ENTRY_SCHEMAS[2],
                       read_types=_ENTRY_TYPES, read_enums=_ENTRY_ENUMS) as reader:
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
    """A snapshot's manifest list, as pyiceberg's (and Java's) list writers write it: its header names the
    snapshot, its parent and (v2+) sequence number, (v3) its first row id; the manifests this snapshot added whose
    sequence numbers are UNASSIGNED_SEQ get `sequence_number` (a v1 list has none)."""
    meta = {"snapshot-id": str(snapshot_id),
            "parent-snapshot-id": "null" if parent_snapshot_id is None else str(parent_snapshot_id),
            "format-version": str(format_version), AVRO_CODEC_KEY: codec}
    if format_version >= 2:
        meta["sequence-number"] = str(sequence_number)
    if format_version >= 3:
        meta["first-row-id"] = str(first_row_id)
    records = []
    for m in manifests:
        if format_version == 1 and m.content != DATA:
            raise ValueError("a v1 manifest list holds no delete manifests")
        if m.sequence_number == UNASSIGNED_SEQ or m.min_sequence_number == UNASSIGNED_SEQ:
            if m.added_snapshot_id != snapshot_id:
                raise ValueError(f"manifest {m.path} of snapshot {m.added_snapshot_id} has no sequence number")
            m = m._replace(sequence_number=sequence_number if m.sequence_number == UNASSIGNED_SEQ
                           else m.sequence_number,
                           min_sequence_number=sequence_number if m.min_sequence_number == UNASSIGNED_SEQ
                           else m.min_sequence_number)
        records.append(m)
    out = MemoryOutput(location)
    with _ListWriter(out, format_version, meta) as writer:
        writer.write_block(records)
    return out.data
