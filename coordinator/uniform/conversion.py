"""One conversion of a Delta table to Iceberg: from the last converted version (or nothing) to a newer one, the way
Delta's own converter does it (delta-io/delta `IcebergConverter.convertSnapshot`, `IcebergConversionTransaction`),
with pyiceberg's own models and writers (`TableMetadataV2`, `DataFile`, its snapshot producers and its manifest
and manifest-list writers).

- The commits since the last conversion are read from the Delta log (`deltalog.DeltaLog.commit`) and their net
  effect becomes ONE Iceberg snapshot: appends only an `append` (pyiceberg's merge-append, which also compacts
  manifests), OPTIMIZE-like commits (adds and removes all with `dataChange=false`) a `replace`, removes only a
  `delete`, anything else an `overwrite`. Commits that arrive while a conversion runs are the next one's: a hot
  table is converted as often as conversions finish, never once per commit behind a queue.
- With nothing converted before, or a version gone from the log, the snapshot is rebuilt from the table's state
  (`deltalog.DeltaLog.snapshot`): every live file, replacing whatever the Iceberg table held.
- A metaData change is a new schema (Delta's column-mapping ids kept as field ids), with its name mapping.
  Schemas no kept snapshot uses (and that are not current) are removed, as Iceberg's `RemoveSchemas` (Java's
  expiry with metadata clean-up) does: a writer that changes its schema on every commit leaves at most
  `SNAPSHOTS_KEPT` + 1 of them.
- The metadata file stays within `Job.max_metadata_bytes` (`uniform_max_metadata_bytes`): beyond it the oldest
  snapshots expire early, down to the current one alone; a table whose current snapshot and schema alone are larger
  is refused, with the sizes, as is a Delta schema larger than that (before it is parsed).
- Each snapshot's table properties say which Delta version it is (`delta-version`, `delta-timestamp`, and
  `base-delta-version`, the version it was converted from), and so does the snapshot's summary.
- Old snapshots expire (the latest `SNAPSHOTS_KEPT`); their manifest lists, the manifests no kept snapshot needs
  and the metadata files that fell off the metadata log are handed back as `obsolete`, for the service to delete
  once no reader can still be planning with them. Data files are the Delta table's: never among them.

`convert(job)` runs in a worker process (`worker.py`; the service's event loop never waits on it): it reads
through a file IO of its own, writes nothing, and returns the new files' bytes for the service to write durably,
with the JSON `snapshots=refs` loads are answered with (so that the service never parses the metadata). What it
cannot convert is refused with the reason: what Iceberg cannot express (`Refusal`), and any other error of the
conversion itself, a compiled extension's panic included (the same input fails the same way again: retrying it
would only spend the worker). Only the storage's and the machine's errors are raised, for the service to retry.
"""

from __future__ import annotations

import io
import time
import uuid
from dataclasses import dataclass, field

from obstore.exceptions import BaseError as ObjectStoreError
from pyiceberg.io import FileIO as IcebergFileIO, InputFile, OutputFile
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import MetadataLogEntry, TableMetadataUtil, TableMetadataV2
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import (AddSchemaUpdate, AddSnapshotUpdate, RemoveSchemasUpdate, RemoveSnapshotsUpdate,
                                    SetCurrentSchemaUpdate, SetPropertiesUpdate, SetSnapshotRefUpdate,
                                    update_table_metadata)
from pyiceberg.table.update.snapshot import _OverwriteFiles

from storage.errors import StorageError
from storage.files import FileIO, join

from coordinator.config import Config
from coordinator.iceberg.files import metadata_file_name, metadata_version

from .deltalog import DeltaLog, LogGap, commit_timestamp
from .metadata import refs_only_json
from .schema import Layout, Refusal, SharedSchema, data_file, file_path, layout, layout_of, name_mapping
from .tables import BASE_DELTA_VERSION, DELTA_TIMESTAMP, DELTA_VERSION

SNAPSHOTS_KEPT = 10          # snapshots a converted table keeps for time travel (Delta's own history is longer)
METADATA_LOG_KEPT = 10       # previous metadata files listed in the metadata log
# The table properties every converted table has. `gc.enabled=false`: its data files are the Delta table's,
# which Iceberg engines' own maintenance must never delete.
FIXED_PROPERTIES = {"gc.enabled": "false", "write.metadata.previous-versions-max": str(METADATA_LOG_KEPT),
                    "commit.manifest.min-count-to-merge": "16"}
REASON_CHARS = 1000          # a refusal's reason is kept with the table and answered to readers: a writer's names in it
                             # (columns, types, paths) are cut to this
# What the storage or the machine raised: the same conversion may succeed later, so the service retries it.
RETRIED = (OSError, MemoryError, StorageError, ObjectStoreError, LogGap)


@dataclass(frozen=True)
class Job:
    """What a conversion needs, all plain data (it crosses to a worker process)."""

    table_id: str
    location: str                     # the Delta table's root
    s3_options: dict[str, str]        # for reading `location` from a worker of its own
    target: int                       # the version to convert
    staged: dict[int, str]            # ratified versions -> their staged commit files (the catalog's log)
    base_version: int | None = None   # the last converted version, and its metadata file and bytes
    base_location: str | None = None
    base_metadata: bytes | None = None
    max_metadata_bytes: int = Config.uniform_max_metadata_bytes


@dataclass(frozen=True)
class Converted:
    metadata_location: str
    metadata_json: bytes
    refs_json: bytes                           # the metadata with only the snapshots a ref names (`snapshots=refs`)
    delta_version: int
    delta_timestamp: int
    files: list[tuple[str, bytes]]             # to make durable, metadata file last
    obsolete: list[str] = field(default_factory=list)   # to delete once no reader can be using them


@dataclass(frozen=True)
class Refused:
    version: int
    reason: str


def convert(job: Job) -> Converted | Refused:
    """One conversion (see the module doc); a worker process runs it (`worker.py`)."""
    try:
        return Conversion(job, FileIO(job.s3_options)).run()
    except Refusal as exc:
        return refused(job.target if exc.version is None else exc.version, str(exc))
    except RETRIED:
        raise
    except Exception as exc:
        return refused(job.target, f"the converter cannot convert it ({failure(exc)})")
    except BaseException as exc:
        if not extension_panic(exc):
            raise   # (KeyboardInterrupt, SystemExit: the worker is stopping)
        return refused(job.target, f"the converter cannot convert it ({failure(exc)})")


def refused(version: int, reason: str) -> Refused:
    return Refused(version, reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS] + "...")


def failure(exc: BaseException) -> str:
    """An exception as a reason names it: its type, and its first line (pydantic's run on for pages)."""
    lines = str(exc).strip().splitlines()
    return type(exc).__name__ + (f": {lines[0]}" if lines else "")


def extension_panic(exc: BaseException) -> bool:
    """A Rust panic in a compiled extension (pydantic-core, obstore, pyiceberg-core): pyo3 raises it as
    `pyo3_runtime.PanicException`, which derives from BaseException, not Exception, and of which each extension has
    a class of its own; so it is known by its name."""
    return any(c.__module__ == "pyo3_runtime" and c.__qualname__ == "PanicException" for c in type(exc).__mro__)


class _Files(IcebergFileIO):
    """pyiceberg's view of the table's files: reads through the service's file IO, from within the table; writes
    stay in memory (`written`), for the service to make durable."""

    def __init__(self, files: FileIO, location: str):
        super().__init__({})
        self.files, self.location = files, location
        self.written: dict[str, bytes] = {}

    def new_input(self, location: str) -> InputFile:
        return _Input(self, location)

    def new_output(self, location: str) -> OutputFile:
        return _Output(self, location)

    def delete(self, location) -> None:
        self.written.pop(location if isinstance(location, str) else location.location, None)

    def read(self, location: str) -> bytes:
        if location in self.written:
            return self.written[location]
        return self.files.read_within_sync(location, self.location)


class _Input(InputFile):
    def __init__(self, files: _Files, location: str):
        super().__init__(location)
        self._files = files

    def __len__(self) -> int:
        return len(self._files.read(self.location))

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True):
        return io.BytesIO(self._files.read(self.location))


class _Output(OutputFile):
    def __init__(self, files: _Files, location: str):
        super().__init__(location)
        self._files = files

    def __len__(self) -> int:
        return len(self._files.written[self.location])

    def exists(self) -> bool:
        return self.location in self._files.written

    def to_input_file(self) -> InputFile:
        return _Input(self._files, self.location)

    def create(self, overwrite: bool = False):
        files, location = self._files, self.location

        class Buffer(io.BytesIO):
            def close(self) -> None:
                if not self.closed:
                    files.written[location] = self.getvalue()
                super().close()
        return Buffer()


class Conversion:
    def __init__(self, job: Job, files: FileIO):
        self.job = job
        self.location = job.location.rstrip("/")
        self.log = DeltaLog(files, self.location, job.staged)
        self.io = _Files(files, self.location)
        self.base = _shared(TableMetadataUtil.parse_raw(job.base_metadata)) if job.base_metadata is not None else None

    def run(self) -> Converted:
        job = self.job
        if self.base is not None and job.base_version is not None and job.base_version < job.target:
            try:
                return self._incremental()
            except LogGap:
                pass   # a commit since the last conversion is gone: rebuild from the snapshot
        return self._rebuild()

    # -- the two ways ----------------------------------------------------------------------------------------

    def _incremental(self) -> Converted:
        """The commits after the last converted version, as one snapshot of their net effect."""
        job = self.job
        commits = [(v, self.log.commit(v)) for v in range(job.base_version + 1, job.target + 1)]
        metadata_action = next((a["metaData"] for _, actions in reversed(commits) for a in actions
                                if "metaData" in a), None)
        meta = self.base
        if metadata_action is not None:
            meta = self._with_metadata(meta, metadata_action, job.target)
        lay = self._layout(meta)
        added: dict[str, dict] = {}
        removed: set[str] = set()
        data_change = False
        for v, actions in commits:
            for action in actions:
                if "add" in action:
                    add = action["add"]
                    added[add["path"]] = {**add, "_version": v}
                    data_change |= add.get("dataChange", True) is not False
                elif "remove" in action:
                    path = action["remove"]["path"]
                    data_change |= action["remove"].get("dataChange", True) is not False
                    if added.pop(path, None) is None:
                        removed.add(path)
        timestamp = self._timestamp(commits)
        current = self._current_files(meta) if removed else {}   # (every manifest is read: only when needed)
        gone = [current[self._path(p)] for p in sorted(removed) if self._path(p) in current]
        if len(gone) != len(removed):
            raise LogGap("a removed file is not in the converted snapshot: rebuild")
        new = [data_file(add, self.location, lay, add["_version"]) for add in added.values()]
        if new and gone:
            operation = Operation.OVERWRITE if data_change else Operation.REPLACE
        else:
            operation = Operation.APPEND if new else Operation.DELETE if gone else None
        return self._commit(meta, operation, new, gone, job.target, timestamp)

    def _rebuild(self) -> Converted:
        """The whole snapshot at the target version: the Iceberg table (if any) loses the files the snapshot does
        not have and gains those it lacks."""
        job = self.job
        snap = self.log.snapshot(job.target)
        if snap.metadata is None:
            raise Refusal(f"the Delta log up to version {job.target} has no metaData action")
        meta = self._with_metadata(self.base, snap.metadata, job.target)
        lay = self._layout(meta)
        live = {self._path(p): add for p, add in snap.files.items()}
        current = self._current_files(meta)
        converted = {p: data_file(add, self.location, lay, job.target) for p, add in live.items()}   # (all checked)
        new = [f for p, f in converted.items() if p not in current]
        gone = [f for p, f in current.items() if p not in live]
        operation = Operation.OVERWRITE if gone and new else Operation.DELETE if gone else \
            Operation.APPEND if new else None
        return self._commit(meta, operation, new, gone, job.target, snap.timestamp or int(time.time() * 1000))

    # -- pieces ----------------------------------------------------------------------------------------------

    def _path(self, path: str) -> str:
        return file_path(self.location, path)

    def _layout(self, meta: TableMetadataV2) -> Layout:
        return layout_of(meta.schema(), meta.spec(), meta.name_mapping())

    def _with_metadata(self, meta: TableMetadataV2 | None, action: dict, version: int) -> TableMetadataV2:
        """The metadata with Delta's schema and partitioning as of `action` (new table metadata if none)."""
        partitions = list(action.get("partitionColumns") or [])
        schema_id = 0 if meta is None else max(s.schema_id for s in meta.schemas) + 1
        schema_string = action.get("schemaString") or "{}"
        if not isinstance(schema_string, str) or len(schema_string) > self.job.max_metadata_bytes:
            raise Refusal(f"the Delta schema takes {len(schema_string)} bytes, more than the "
                          f"{self.job.max_metadata_bytes} an Iceberg metadata file of this service may "
                          f"(uniform_max_metadata_bytes)", version)
        lay = layout(schema_string, partitions, schema_id, 0 if meta is None else meta.default_spec_id)
        props = {"schema.name-mapping.default": name_mapping(lay.schema, lay.by_physical).model_dump_json()}
        if meta is None:
            return TableMetadataV2(
                location=self.location, table_uuid=uuid.UUID(self.job.table_id),
                last_updated_ms=int(time.time() * 1000), last_column_id=lay.last_column_id,
                schemas=[lay.schema], current_schema_id=schema_id, partition_specs=[lay.spec], default_spec_id=0,
                last_partition_id=max([f.field_id for f in lay.spec.fields], default=999),
                properties={**FIXED_PROPERTIES, **props}, sort_orders=[UNSORTED_SORT_ORDER], default_sort_order_id=0)
        if [f.source_id for f in meta.spec().fields] != [f.source_id for f in lay.spec.fields]:
            raise Refusal(f"the partition columns change to {partitions or 'none'}: Iceberg readers of the "
                          f"converted table would lose its partitioning (Delta's own converter refuses this too)",
                          version)
        updates: list = [SetPropertiesUpdate(updates=props)]
        if not _same_schema(meta.schema(), lay.schema):
            updates += [AddSchemaUpdate(schema_=lay.schema), SetCurrentSchemaUpdate(schema_id=-1)]
        return update_table_metadata(meta, tuple(updates))

    def _current_files(self, meta: TableMetadataV2) -> dict[str, DataFile]:
        snapshot = meta.current_snapshot()
        if snapshot is None:
            return {}
        return {entry.data_file.file_path: entry.data_file for manifest in snapshot.manifests(self.io)
                for entry in manifest.fetch_manifest_entry(self.io, discard_deleted=True)}

    def _timestamp(self, commits: list[tuple[int, list[dict]]]) -> int:
        return commit_timestamp(commits[-1][1]) or int(time.time() * 1000)

    def _commit(self, meta: TableMetadataV2, operation: Operation | None, new: list[DataFile],
                gone: list[DataFile], version: int, timestamp: int) -> Converted:
        """One snapshot (unless nothing changed in the files), the properties, the expiry; the files to write."""
        job = self.job
        tracking = {DELTA_VERSION: str(version), DELTA_TIMESTAMP: str(timestamp)}
        if job.base_version is not None:
            tracking[BASE_DELTA_VERSION] = str(job.base_version)
        updates: list = [SetPropertiesUpdate(updates=tracking)]
        if operation is not None:
            snapshot = self._snapshot(meta, operation, new, gone, tracking)
            expired = [s.snapshot_id for s in [*meta.snapshots, snapshot][:-SNAPSHOTS_KEPT]]
            updates += [AddSnapshotUpdate(snapshot=snapshot),
                        SetSnapshotRefUpdate(ref_name=MAIN_BRANCH, type=SnapshotRefType.BRANCH,
                                             snapshot_id=snapshot.snapshot_id)]
            if expired:
                updates.append(RemoveSnapshotsUpdate(snapshot_ids=expired))
        result = update_table_metadata(meta, tuple(updates))
        if job.base_location is not None and self.base is not None:
            entry = MetadataLogEntry(metadata_file=job.base_location, timestamp_ms=self.base.last_updated_ms)
            result = result.model_copy(update={"metadata_log": [*self.base.metadata_log, entry][-METADATA_LOG_KEPT:]})
        result, data = self._bounded(result, version)
        number = metadata_version(job.base_location) + 1 if job.base_location else 0
        location = join(self.location, "metadata", metadata_file_name(number))
        files = [*self.io.written.items(), (location, data)]
        return Converted(location, data, refs_only_json(data), version, timestamp, files,
                         self._obsolete(self.base, result))

    def _bounded(self, meta: TableMetadataV2, version: int) -> tuple[TableMetadataV2, bytes]:
        """`meta` without the schemas its snapshots no longer use, and its JSON, within the size limit: the oldest
        snapshots expire early while it is beyond (the current one stays); Refusal if it is beyond even then."""
        limit = self.job.max_metadata_bytes
        while True:
            meta = _without_unused_schemas(meta)
            data = meta.model_dump_json().encode()
            if len(data) <= limit:
                return meta, data
            older = [s.snapshot_id for s in meta.snapshots if s.snapshot_id != meta.current_snapshot_id]
            if not older:
                raise Refusal(f"its Iceberg metadata would take {len(data)} bytes with no snapshot but the current "
                              f"one, more than the {limit} this service writes (uniform_max_metadata_bytes): its "
                              f"schema, {len(meta.schema().fields)} top-level columns with "
                              f"{meta.schema().highest_field_id} ids, and their name mapping are that large", version)
            meta = update_table_metadata(meta, (RemoveSnapshotsUpdate(snapshot_ids=older[:1]),))

    def _snapshot(self, meta: TableMetadataV2, operation: Operation, new: list[DataFile], gone: list[DataFile],
                  tracking: dict[str, str]) -> Snapshot:
        """The snapshot pyiceberg's producer makes of `new` and `gone` (its manifests and manifest list written to
        `self.io`). pyiceberg's transaction copies the whole metadata each time it is looked at, a dozen times a
        snapshot: the producer works on the metadata reduced to what it reads (the current snapshot and schema,
        specs, properties), and its snapshot is added to the whole metadata once, by the caller."""
        current = meta.current_snapshot()
        reduced = meta.model_copy(update={
            "snapshots": [current] if current else [], "snapshot_log": [], "metadata_log": [],
            "schemas": [meta.schema()], "refs": {MAIN_BRANCH: meta.refs[MAIN_BRANCH]} if current else {}})
        txn = Transaction(Table(("uniform", self.job.table_id), reduced, self.job.base_location or "", self.io, None))
        if operation is Operation.APPEND:
            producer = txn.update_snapshot(snapshot_properties=tracking).merge_append()
        else:
            # (a `replace` is produced as an overwrite and relabelled below: pyiceberg 0.12 makes no `replace`)
            producer = _OverwriteFiles(operation=Operation.OVERWRITE if operation is Operation.REPLACE else operation,
                                       transaction=txn, io=self.io, snapshot_properties=tracking)
            for f in gone:
                producer.delete_data_file(f)
        for f in new:
            producer.append_data_file(f)
        producer.commit()
        snapshot = txn.table_metadata.current_snapshot()
        if operation is Operation.REPLACE:
            # Files rewritten, table data unchanged (OPTIMIZE): readers of changes (streaming) skip a `replace`.
            snapshot = snapshot.model_copy(update={
                "summary": Summary(Operation.REPLACE, **snapshot.summary.additional_properties)})
        return snapshot

    def _obsolete(self, before: TableMetadataV2 | None, after: TableMetadataV2) -> list[str]:
        """What `after` no longer needs of `before`: expired snapshots' manifest lists and the manifests no kept
        snapshot names, the metadata files that fell off its log. Only files in the table's `metadata/`."""
        if before is None:
            return []
        kept_ids = {s.snapshot_id for s in after.snapshots}
        expired = [s for s in before.snapshots if s.snapshot_id not in kept_ids]
        if not expired and len(after.metadata_log) >= len(before.metadata_log):
            return []
        # A snapshot's manifests are its parent's, less those it rewrote, plus new ones (never an older one again):
        # whatever an expired snapshot names that the oldest kept one does not, no kept snapshot names.
        kept_manifests = {m.manifest_path for m in after.snapshots[0].manifests(self.io)} if after.snapshots else set()
        out = [s.manifest_list for s in expired]
        out += [m.manifest_path for s in expired for m in s.manifests(self.io) if m.manifest_path not in kept_manifests]
        logged = {e.metadata_file for e in after.metadata_log}
        out += [e.metadata_file for e in before.metadata_log if e.metadata_file not in logged]
        own = join(self.location, "metadata") + "/"
        return sorted({uri for uri in out if uri.startswith(own)})


def _same_schema(a: Schema, b: Schema) -> bool:
    return a.as_struct() == b.as_struct()


def _shared(meta: TableMetadataV2) -> TableMetadataV2:
    return meta.model_copy(update={"schemas": [SharedSchema.of(s) for s in meta.schemas]})


def _without_unused_schemas(meta: TableMetadataV2) -> TableMetadataV2:
    """Iceberg's `RemoveSchemas` of every schema that is not current and that no snapshot of `meta` uses."""
    used = {meta.current_schema_id, *(s.schema_id for s in meta.snapshots)}
    unused = [s.schema_id for s in meta.schemas if s.schema_id not in used]
    return update_table_metadata(meta, (RemoveSchemasUpdate(schema_ids=unused),)) if unused else meta


