"""What Iceberg reads and writes in table locations: metadata file names and versions, reading a metadata file
(a table's state, a registered table's metadata), the files a drop with purge deletes, and the deletion of replaced
metadata files after a commit.

A purge of a location the table may share with files that are not its own deletes what the metadata reaches, as
Java's `CatalogUtil.dropTableData`: every snapshot's manifest list, every manifest it names, every data and delete
file those name (all entries, deleted ones too), statistics files, the metadata log and the metadata file.
Manifests are Avro; fastavro reads them.
"""

from __future__ import annotations

import io
import logging
import uuid
from typing import Any

import fastavro
import orjson
import trio
from obstore.exceptions import InvalidPathError, PermissionDeniedError

from storage.errors import FileMissing, FileRefused
from storage.files import NOT_A_FILE, FileIO, is_below, is_within
from storage.records import TableRow

from coordinator.errors import BadRequest

from .state import IcebergTable, TableIdent, UnreadableTable, expand, ident_of

log = logging.getLogger(__name__)


def metadata_file_name(version: int) -> str:
    return f"{version:05d}-{uuid.uuid4()}.metadata.json"


def metadata_version(location: str) -> int:
    """The NNNNN of `.../metadata/NNNNN-<uuid>.metadata.json`; -1 for names not written by us."""
    name = location.rsplit("/", 1)[-1]
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


# -- reading metadata files ----------------------------------------------------------------------------------


async def read_table(files: FileIO, row: TableRow) -> IcebergTable | UnreadableTable:
    """A table's state from its row and its current metadata file; `UnreadableTable` if the file is gone or not
    JSON (other errors, e.g. storage unreachable, are raised)."""
    location = row.state["metadata-location"]
    # (a registered table's metadata file may lie outside its location: then only that file may not be a link)
    within = row.location if row.location and is_below(row.location, location) else None
    try:
        return expand(row, await files.read(location, within))
    except (FileMissing, orjson.JSONDecodeError) as exc:
        log.error("table %s.%s: metadata file %s cannot be read: %s", row.namespace, row.name, location, exc)
        return UnreadableTable(ident_of(row), location,
                               "missing" if isinstance(exc, FileMissing) else "not valid JSON")


async def read_registered(files: FileIO, metadata_location: str, within: str) -> dict[str, Any]:
    """The metadata a register names: an existing file holding Iceberg table metadata, with a UUID and location.
    The client's word: read only as a regular file reached from `within` (where the client may place tables)
    without following a link, and bounded in size (FileIO.read)."""
    try:
        metadata = orjson.loads(await files.read(metadata_location, within))
    except FileMissing:
        raise BadRequest(f"metadata-location does not exist: {metadata_location}") from None
    except FileRefused as exc:
        raise BadRequest(f"metadata-location cannot be read: {exc}") from None
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"metadata-location is not valid JSON: {exc}") from None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("table-uuid"), str) \
            or not isinstance(metadata.get("location"), str):
        raise BadRequest("metadata-location does not hold Iceberg table metadata")
    try:
        uuid.UUID(metadata["table-uuid"])
    except ValueError:
        raise BadRequest(f"table-uuid {metadata['table-uuid']!r} in metadata-location is not a UUID") from None
    return metadata


# -- what a purge deletes ------------------------------------------------------------------------------------


def reachable_files(files: FileIO, location: str, metadata_location: str) -> list[str] | None:
    """In deletion order, each file before any that names it (data and delete files, manifests, manifest lists,
    statistics, older metadata files, the metadata file last), so that a purge interrupted half-way and resumed
    from the same metadata still finds what is left. None if the metadata file is gone: the purge had ended.

    Paths in the metadata are the client's word: only files within `location` are read (and deleted), and a file
    that cannot be read as what it should be names nothing (a purge that failed on it would be retried forever)."""
    try:
        meta = orjson.loads(_read(files, metadata_location))
    except FileMissing:
        return None
    except (orjson.JSONDecodeError, _Unreadable) as exc:
        meta = exc
    if not isinstance(meta, dict):
        log.warning("purge: %s holds no table metadata (%s); deleting only that file", metadata_location, meta)
        return [metadata_location]
    snapshots = _dicts(meta.get("snapshots"))
    manifest_lists = [s.get("manifest-list") for s in snapshots]
    manifests = [m for s in snapshots for m in _list(s.get("manifests"))]   # v1 snapshots without a list
    manifests += [r.get("manifest_path") for ml in _unique(manifest_lists) for r in _records(files, location, ml)]
    content = [f.get("file_path") for m in _unique(manifests) for r in _records(files, location, m)
               for f in _dicts([r.get("data_file")])]
    statistics = [s.get("statistics-path") for key in ("statistics", "partition-statistics")
                  for s in _dicts(meta.get(key))]
    previous = [e.get("metadata-file") for e in _dicts(meta.get("metadata-log"))]
    return _unique([*content, *manifests, *manifest_lists, *statistics, *previous, metadata_location])


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in _list(value) if isinstance(v, dict)]


def _unique(uris: list[Any]) -> list[str]:
    return [uri for uri in dict.fromkeys(u for u in uris if isinstance(u, str) and u)]


class _Unreadable(Exception):
    """A path that can never be read as a table file: it names nothing."""


def _read(files: FileIO, uri: str, within: str | None = None) -> bytes:
    """The file's bytes. FileMissing if it is gone; `_Unreadable` if it never can be read as a table file (not a
    regular file: a FIFO would block the purge for good; too large; reached through a link below `within`; a path
    the store refuses). Other errors (storage unreachable) are raised: the purge is retried."""
    try:
        return files.read_within_sync(uri, within)
    except FileNotFoundError:
        raise FileMissing(uri) from None
    except OSError as exc:
        if exc.errno in NOT_A_FILE:
            raise _Unreadable(str(exc)) from None
        raise
    except (BadRequest, FileRefused, ValueError, TypeError, PermissionDeniedError, InvalidPathError) as exc:
        # A directory, a link, a name too long, too large; a path the object store refuses, or may never be read
        # (S3 answers 403 for a missing key without list rights): retrying would fail the same way forever.
        raise _Unreadable(str(exc)) from None


def _records(files: FileIO, location: str, uri: str) -> list[dict[str, Any]]:
    if not is_within(location, uri):
        return []
    try:
        data = _read(files, uri, location)
    except FileMissing:   # deleted by an earlier, interrupted run of the purge, after what it names
        return []
    except _Unreadable as exc:
        log.warning("purge: cannot read %s (%s); it names nothing", uri, exc)
        return []
    try:
        return [r for r in fastavro.reader(io.BytesIO(data)) if isinstance(r, dict)]
    except Exception as exc:  # noqa: BLE001 - any fault of the bytes: a purge failing on them would never end
        log.warning("purge: %s is not an Avro manifest or manifest list (%s); the files it names stay", uri, exc)
        return []


async def not_purged(ident: TableIdent, location: str | None) -> None:
    log.warning("purge of %s: location %s is not below the warehouse; no files deleted", ident, location)


async def purge_named_files(files, store, location: str, table: IcebergTable) -> None:
    """A purge with `gc.enabled=false` (DropTable): the files the metadata names in the table's location."""
    if await store.location_taken(location):
        log.warning("purge of %s: another table lives at, above or below %s; no files deleted", table.ident,
                    location)
        return
    meta = table.metadata
    named = [table.metadata_location, *(e.get("metadata-file") for e in meta.get("metadata-log", [])),
             *(s.get("manifest-list") for s in meta.get("snapshots", [])),
             *(f.get("statistics-path") for f in (*meta.get("statistics", []), *meta.get("partition-statistics", [])))]
    # As any purge of listed files: only within the location (links included), paths naming nothing skipped.
    await trio.to_thread.run_sync(files.delete_listed_sync, location, [u for u in named if isinstance(u, str)])


def gc_enabled(metadata: dict[str, Any]) -> bool:
    """Java's `gc.enabled` guard: false when data files may be shared with another table."""
    return str(metadata.get("properties", {}).get("gc.enabled", "true")).lower() != "false"


# -- replaced metadata files ---------------------------------------------------------------------------------


def delete_after_commit(fileio, old: IcebergTable, new: dict[str, Any], warehouse: str | None = None):
    """`write.metadata.delete-after-commit.enabled`: once the new metadata is durable, delete the metadata
    files that fell off the metadata-log (trimmed to `write.metadata.previous-versions-max`). Only those in the
    table's own location (now, or before this commit moved it), and through the guards of any purge of listed
    files: a registered table's log is the client's word and may name another table's current metadata."""
    if fileio is None or warehouse is None or new.get("properties", {}).get(
            "write.metadata.delete-after-commit.enabled", "false").lower() != "true":
        return None
    kept = {e["metadata-file"] for e in new.get("metadata-log", [])}
    dropped = [e["metadata-file"] for e in old.metadata.get("metadata-log", []) if e["metadata-file"] not in kept]
    if old.metadata_location not in kept:
        dropped.append(old.metadata_location)
    places = {loc for loc in (new.get("location"), old.metadata.get("location"))
              if isinstance(loc, str) and is_below(warehouse, loc)}
    batches = [(place, [u for u in dropped if isinstance(u, str) and is_within(place, u)]) for place in places]
    batches = [(place, uris) for place, uris in batches if uris]
    if not batches:
        return None

    async def delete() -> None:
        for place, uris in batches:
            await trio.to_thread.run_sync(fileio.delete_listed_sync, place, uris)
    return delete

