"""The files an Iceberg table's metadata reaches, for a purge of a location the table may share with files that
are not its own (coordinator/iceberg/catalog.py, DropTable).

As Java's `CatalogUtil.dropTableData`: every snapshot's manifest list, every manifest it names, every data and
delete file those name (all entries, deleted ones too), statistics files, the metadata log and the metadata file.
Manifests are Avro; fastavro reads them.
"""

from __future__ import annotations

import io
import logging
import os
from typing import Any, Callable

import fastavro
import obstore
import orjson
from obstore.exceptions import InvalidPathError, PermissionDeniedError

from coordinator.errors import BadRequest, NotFound
from storage.errors import FileMissing, FileRefused

from .files import MAX_READ_WITHIN_BYTES, NOT_A_FILE, FileIO, is_within, local_path

log = logging.getLogger(__name__)


def reachable_files(files: FileIO, location: str, metadata_location: str) -> list[str] | None:
    """In deletion order, each file before any that names it (data and delete files, manifests, manifest lists,
    statistics, older metadata files, the metadata file last), so that a purge interrupted half-way and resumed
    from the same metadata still finds what is left. None if the metadata file is gone: the purge had ended.

    Paths in the metadata are the client's word: only files within `location` are read (and deleted), and a file
    that cannot be read as what it should be names nothing (a purge that failed on it would be retried forever)."""
    try:
        meta = orjson.loads(_read(files, metadata_location))
    except (NotFound, FileMissing):
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


# Far above any manifest or manifest list; a purge reads each whole. (Local reads are bounded by FileIO's own
# MAX_READ_WITHIN_BYTES, the same.)
MAX_MANIFEST_BYTES = MAX_READ_WITHIN_BYTES


class _Unreadable(Exception):
    """A path that can never be read as a table file: it names nothing."""


def _read(files: FileIO, uri: str, within: str | None = None) -> bytes:
    """The file's bytes. NotFound if it is gone; `_Unreadable` if it never can be read as a table file (not a
    regular file: a FIFO would block the purge for good; too large; reached through a link below `within`; a path
    the store refuses). Other errors (storage unreachable) are raised: the purge is retried."""
    path = local_path(uri)
    try:
        if path is not None:
            # (a regular file, bounded in size, reached without following a link below its place)
            return files.read_within_sync(uri, within or os.path.dirname(path))
        store, key = files.object_store(uri)
        if obstore.head(store, key)["size"] > MAX_MANIFEST_BYTES:
            raise _Unreadable(f"larger than {MAX_MANIFEST_BYTES} bytes")
        return files.read_sync(uri)
    except FileNotFoundError:
        raise NotFound(uri) from None
    except OSError as exc:
        if exc.errno in NOT_A_FILE:
            raise _Unreadable(str(exc)) from None
        raise
    except (BadRequest, FileRefused, ValueError, TypeError, PermissionDeniedError, InvalidPathError) as exc:
        # A directory, a link, a name too long; a path the object store refuses, or may never be read (S3 answers
        # 403 for a missing key without list rights): retrying would fail the same way forever.
        raise _Unreadable(str(exc)) from None


def _records(files: FileIO, location: str, uri: str) -> list[dict[str, Any]]:
    if not is_within(location, uri):
        return []
    try:
        data = _read(files, uri, location)
    except (NotFound, FileMissing):   # deleted by an earlier, interrupted run of the purge, after what it names
        return []
    except _Unreadable as exc:
        log.warning("purge: cannot read %s (%s); it names nothing", uri, exc)
        return []
    try:
        return [r for r in fastavro.reader(io.BytesIO(data)) if isinstance(r, dict)]
    except Exception as exc:  # noqa: BLE001 - any fault of the bytes: a purge failing on them would never end
        log.warning("purge: %s is not an Avro manifest or manifest list (%s); the files it names stay", uri, exc)
        return []


def delete_reachable_sync(files: FileIO, location: str, metadata_location: str,
                          stop: Callable[[], bool] | None = None) -> None:
    """Delete the files the metadata reaches that lie within `location`, then the directories that leaves
    empty. Runs in a worker thread."""
    files.delete_listed_sync(location, reachable_files(files, location, metadata_location) or [], stop)
