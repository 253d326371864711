"""Table files (Iceberg metadata JSON, Delta logs, Lance manifests) on `file://` paths or `s3://` buckets.

A file is durable before anything points at it: locally we write a temp file, fsync it, rename it into place
and fsync the directory (or, when a file beside it already holds the bytes, Lance's staged manifest, fsync and
rename that one); on S3 a completed PUT is durable. Which commit owns a version is decided by the database's
compare-and-set, never by the file system; on S3 every write is still a create (`If-None-Match: *`), so that an
object someone else put under a name is never overwritten (`FileIO._put_object`).

S3 goes through obstore (Rust's object_store): one well-kept client, credentials from the usual AWS environment,
and no boto stack. Local files use the OS directly so we control fsync.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import time
from typing import Any, Callable
from urllib.parse import urlparse

import trio
from obstore.exceptions import InvalidPathError

from .errors import FileMissing, FileRefused, FileTaken
from .grouped import GroupedCall
# The names other layers import from here: the file IO, its file-write tuple, and the location helpers.
from .localfs import (NOT_A_FILE, DeletionStopped, FileWrite, _descend, _opened_beneath, _read_at_most,
                      _remove_tree, _unlink_beneath, file_write, sync_existing, write_durably)
from .paths import (is_below, is_within, join, local_path, location_key, path_segment, to_local_path,
                    unsafe_location)
from .worker import WorkerThread

__all__ = ["FileIO", "FileWrite", "file_write", "DeletionStopped", "NOT_A_FILE", "MAX_READ_WITHIN_BYTES",
           "is_below", "is_within", "join", "local_path", "location_key", "path_segment", "to_local_path",
           "unsafe_location"]

log = logging.getLogger(__name__)

# What a read from within a table's place (a Lance staged manifest, read whole into memory) may be at most: far
# above any manifest, and a bound on what a writer's file can make the service hold.
MAX_READ_WITHIN_BYTES = 256 << 20


def _in_worker_thread(name: str, run_batch: Callable[[list[Any]], list[Any]]) -> GroupedCall:
    """Batches of `run_batch`, one at a time, on a thread of their own (storage/worker.py)."""
    return GroupedCall(functools.partial(WorkerThread(name).run_sync, run_batch),
                       interrupted=lambda: OSError("the file operation was interrupted"))


def _each(fn: Callable[[Any], Any]) -> Callable[[list[Any]], list[Any]]:
    """A batch runner that applies `fn` to each item on its own: one item's exception is its result."""
    def run(items: list[Any]) -> list[Any]:
        outcomes = []
        for item in items:
            try:
                outcomes.append(fn(item))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes
    return run


class FileIO:
    def __init__(self, s3_options: dict[str, str] | None = None, warehouse: str | None = None):
        self.s3_options = dict(s3_options or {})
        self.warehouse = warehouse   # links above it are the operator's and trusted by purges (`leads_elsewhere`)
        self._trusted = local_path(warehouse) if warehouse else None
        self._stores: dict[tuple, object] = {}
        # Other warehouses' roots and their S3 settings (set_roots), longest root first: a location within one is
        # read and written with its settings, anything else with `s3_options`.
        self._roots: list[tuple[str, dict[str, str]]] = []
        # The commit path's file work, one worker-thread hop per moment for all tables (storage/grouped.py):
        # writes before or after a commit's row, reads of staged Lance manifests, deletes of what commits made
        # obsolete.
        self._writes = _in_worker_thread("file-writes", self._write_batches_sync)
        # CPU seconds spent making files durable (the kernel's copy into the page cache and fsync, mostly):
        # /metrics shows it, so a commit's cost can be told apart from the cost of the file it must write.
        self.write_cpu_s = 0.0
        # Told each batch's wall time in seconds (the service's latency histogram); called on a worker thread.
        self.on_write: Callable[[float], None] | None = None
        self._reads = _in_worker_thread("file-reads", _each(lambda item: self.read_within_sync(*item)))
        self._durable_reads = _in_worker_thread("file-durable-reads",
                                                _each(lambda item: self._read_durable_sync(*item)))
        self._deletes = _in_worker_thread("file-deletes", _each(lambda item: self.delete_within_sync(*item)))

    # -- public, awaited from trio (blocking work runs in a worker thread) ----------------------------------

    async def write_many(self, files: list[FileWrite]) -> None:
        """Write several files durably, with every other table's files waiting at the same moment (the file
        system's side of group commit). Local files are all written first and fsynced after, each directory
        once: on ext4 the first fsync commits the journal for all of them, so a batch costs about one fsync
        instead of two per file. One caller's failure is its own: the others' files are still written."""
        if files:
            await self._writes(files)

    async def read_durable(self, uri: str, within: str | None = None) -> bytes:
        """`read`, and the file made durable first: a client's staged file that a commit will adopt may never
        have been synced by its writer, and once the commit is recorded it is the only copy the published file
        can be restored from (`localfs.sync_existing`). Batched with other reads, before the commit is offered:
        never inside a table's serialized commit."""
        return await self._durable_reads((uri, within))

    def _write_batches_sync(self, batches: list[list[FileWrite]]) -> list[Exception | None]:
        """Each caller's files made durable (None), or the exception that stopped them (the others go on)."""
        started, wall = time.thread_time(), time.perf_counter()
        try:
            return self._write_durably(batches)
        finally:
            self.write_cpu_s += time.thread_time() - started  # batches run one at a time (storage/grouped.py)
            if self.on_write is not None:
                self.on_write(time.perf_counter() - wall)

    def _write_durably(self, batches: list[list[FileWrite]]) -> list[Exception | None]:
        return write_durably(batches, self._put_object)

    async def read(self, uri: str, within: str | None = None) -> bytes:
        """A file's bytes; given the table's place it lies `within`, locally only a regular file reached from there
        without following a link (a link planted at the name would hand over another dataset's bytes)."""
        return await self._reads((uri, within))

    async def delete(self, uri: str, within: str | None = None) -> None:
        """Delete one file; given the table's place it lies `within`, locally no link below the warehouse is
        followed on the way to it (`_unlink_beneath`)."""
        await self._deletes((uri, within))

    async def exists(self, uri: str) -> bool:
        return await trio.to_thread.run_sync(self.exists_sync, uri)

    async def names_in(self, directory: str) -> set[str]:
        """The names directly in `directory` (none if it does not exist): one listing to check many files by."""
        return await trio.to_thread.run_sync(self.names_in_sync, directory)

    async def size(self, uri: str, within: str | None = None) -> int | None:
        """The size of the file at `uri`; None if there is none (or, locally, something else is there, or, given
        the table's place, it is reached through a link)."""
        return await trio.to_thread.run_sync(self.size_sync, uri, within)

    async def age_s(self, uri: str) -> float | None:
        """Seconds since the file was last written; None if it does not exist."""
        return await trio.to_thread.run_sync(self.age_sync, uri)

    async def discard(self, uris: list[str], location: str | None) -> None:
        """Remove files a refused change wrote (unique names: nobody else's), then the directories they were
        made in, up to `location` itself, if that leaves them empty: no other directory is touched."""
        await trio.to_thread.run_sync(self.discard_sync, uris, location)

    def discard_sync(self, uris: list[str], location: str | None) -> None:
        for uri in uris:
            root, path = (local_path(location), local_path(uri)) if location is not None else (None, None)
            if root is not None and path is not None and is_within(location, uri):
                try:
                    _unlink_beneath(root, path, self._trusted)
                except FileNotFoundError:
                    pass
            else:
                self.delete_sync(uri)

    def delete_listed_sync(self, location: str, uris: list[str], stop: Callable[[], bool] | None = None) -> None:
        """Delete those of `uris` that lie within `location`, in order, then the directories that leaves empty, up
        to `location` itself: a purge of the files a table's metadata reaches (the paths are the client's word,
        and only the table's own place is touched). Stops as `delete_tree_sync` does."""
        if self.leads_elsewhere(location):
            return
        root = local_path(location)
        for uri in uris:
            if not is_within(location, uri):
                continue
            if stop is not None and stop():
                raise DeletionStopped(f"the deletion of {location}'s files was stopped before it ended")
            try:
                path = local_path(uri)
                if root is not None and path is not None:
                    _unlink_beneath(root, path, self._trusted)   # (and the directories it leaves empty)
                else:
                    self.delete_sync(uri)
            except FileNotFoundError:
                continue
            except (OSError, ValueError, TypeError, InvalidPathError) as exc:
                # (An object store's PermissionDeniedError is raised: denied deletes are denied for every file,
                # a credentials fault to retry after, not a path that names nothing.)
                if isinstance(exc, OSError) and exc.errno not in NOT_A_FILE:
                    raise   # perhaps transient: the purge is retried
                # A path a client wrote into the metadata that names no file to delete (or that the object store
                # refuses to parse): retrying would fail the same way forever, and the location stay claimed.
                log.warning("purge of %s: skipping %s: %s", location, uri, exc)

    async def delete_tree(self, location: str, stop: Callable[[], bool] | None = None) -> None:
        """Delete everything under a table location (a purge). Locations are exclusive to one table (see
        `location_key`), so this never reaches another table's files. Once `stop()` is true the deletion ends at
        its next file (or object-store page) with `DeletionStopped`: a thread cannot be cancelled."""
        await trio.to_thread.run_sync(self.delete_tree_sync, location, stop)

    # -- sync implementations --------------------------------------------------------------------------------

    def _read_durable_sync(self, uri: str, within: str | None) -> bytes:
        data = self.read_within_sync(uri, within)   # first: it refuses links and bad names in its own words
        sync_existing([(uri, within)])
        return data

    def read_within_sync(self, uri: str, within: str | None) -> bytes:
        root, path = (local_path(within), local_path(uri)) if within is not None else (None, None)
        if root is None or path is None:
            return self.read_sync(uri)
        try:
            with _opened_beneath(root, path, os.O_RDONLY | os.O_NONBLOCK) as fd:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise FileRefused(f"not a file: {uri}")
                if st.st_size > MAX_READ_WITHIN_BYTES:
                    raise FileRefused(f"{uri} is {st.st_size} bytes; a file read here may have at most "
                                     f"{MAX_READ_WITHIN_BYTES}")
                data = _read_at_most(fd, st.st_size, MAX_READ_WITHIN_BYTES)
                if len(data) > MAX_READ_WITHIN_BYTES:   # (grown since)
                    raise FileRefused(f"{uri} is larger than {MAX_READ_WITHIN_BYTES} bytes")
                return data
        except FileNotFoundError:
            raise FileMissing(f"file not found: {uri}") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise FileRefused(f"not a file reached without following a link: {uri}") from None
            if exc.errno == errno.ENAMETOOLONG:
                raise FileRefused(f"path too long: {uri[:200]}...") from None
            raise

    def read_sync(self, uri: str) -> bytes:
        path = to_local_path(uri)
        if path is None:
            import obstore
            store, key = self.object_store(uri)
            try:
                return bytes(obstore.get(store, key).bytes())
            except FileNotFoundError:
                raise FileMissing(f"file not found: {uri}") from None
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise FileMissing(f"file not found: {uri}") from None
        except IsADirectoryError:
            raise FileRefused(f"not a file: {uri}") from None
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                raise FileRefused(f"path too long: {uri[:200]}...") from None
            raise

    def delete_within_sync(self, uri: str, within: str | None) -> None:
        root, path = (local_path(within), local_path(uri)) if within is not None else (None, None)
        if root is None or path is None or not is_within(within, uri):
            return self.delete_sync(uri)
        try:
            _unlink_beneath(root, path, self._trusted, prune=False)
        except FileNotFoundError:
            pass

    def delete_sync(self, uri: str) -> None:
        path = to_local_path(uri)
        if path is None:
            import obstore
            store, key = self.object_store(uri)
            obstore.delete(store, key)
            return
        path.unlink(missing_ok=True)

    def delete_tree_sync(self, location: str, stop: Callable[[], bool] | None = None) -> None:
        def check() -> None:
            if stop is not None and stop():
                raise DeletionStopped(f"the deletion of {location} was stopped before it ended")
        if self.leads_elsewhere(location):
            return
        local = local_path(location)
        if local is not None:
            # Bottom-up, file by file, so that it can stop; best effort, as rmtree(ignore_errors=True) was. Every
            # name is removed through its directory's descriptor, reached from the warehouse without following a
            # link (`_descend`, `_remove_tree`): a directory swapped for a link while the walk runs leads nowhere,
            # and a location that is itself a link loses the link, not what it points at.
            parent, top = os.path.split(local.rstrip(os.sep))
            try:
                fds, _ = _descend(self._trusted, parent, [])
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    log.warning("not deleting %s: %s", location, exc)
                return
            try:
                _remove_tree(fds[-1], top, check)
            finally:
                for fd in fds:
                    os.close(fd)
            return
        import obstore
        store, key = self.object_store(location)
        for chunk in obstore.list(store, prefix=key.rstrip("/") + "/"):
            check()
            paths = [meta["path"] for meta in chunk]
            if paths:
                obstore.delete(store, paths)

    def leads_elsewhere(self, location: str) -> bool:
        """Locally, whether `location`'s path could lead the kernel out of the place its text names: a `..`, or a
        link in one of its directories below the warehouse (above it, the operator's links are trusted). A
        purge then deletes nothing (a leak, logged), for it might delete another table's files, or anything."""
        path = local_path(location)
        if path is None:
            return False
        if ".." in path.split(os.sep):
            log.warning("not deleting under %s: '..' in its path may lead out of it", location)
            return True
        parts = [p for p in path.rstrip(os.sep).split(os.sep) if p not in ("", ".")]
        base = local_path(self.warehouse) if self.warehouse else None
        base_parts = [p for p in base.split(os.sep) if p not in ("", ".")] if base else []
        # The warehouse's own path (the operator's links) is trusted only where the location spells it alike.
        trusted = len(base_parts) if base_parts and parts[:len(base_parts)] == base_parts else 0
        for depth in range(trusted, len(parts) - 1):   # the location itself may be a link: the purge removes that
            if os.path.islink(os.sep + os.sep.join(parts[:depth + 1])):
                log.warning("not deleting under %s: %s is a link, which may lead out of it", location,
                            os.sep + os.sep.join(parts[:depth + 1]))
                return True
        return False

    def age_sync(self, uri: str) -> float | None:
        path = to_local_path(uri)
        try:
            if path is None:
                import obstore
                store, key = self.object_store(uri)
                modified = obstore.head(store, key)["last_modified"].timestamp()
            else:
                modified = path.stat().st_mtime
        except FileNotFoundError:
            return None
        return time.time() - modified

    def size_sync(self, uri: str, within: str | None = None) -> int | None:
        path = local_path(uri)
        root = local_path(within) if within is not None else None
        try:
            if path is None:
                import obstore
                store, key = self.object_store(uri)
                return obstore.head(store, key)["size"]
            if root is None:
                st = os.stat(path)
            else:
                with _opened_beneath(root, path, os.O_PATH) as fd:
                    st = os.fstat(fd)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENAMETOOLONG):
                return None
            raise
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def names_in_sync(self, directory: str) -> set[str]:
        path = to_local_path(directory)
        if path is not None:
            try:
                return set(os.listdir(path))
            except (FileNotFoundError, NotADirectoryError):
                return set()
        import obstore
        store, key = self.object_store(directory)
        prefix = key.rstrip("/") + "/"
        names = (meta["path"][len(prefix):] for chunk in obstore.list(store, prefix=prefix) for meta in chunk)
        return {name for name in names if "/" not in name}

    def exists_sync(self, uri: str) -> bool:
        path = to_local_path(uri)
        if path is None:
            import obstore
            store, key = self.object_store(uri)
            try:
                obstore.head(store, key)
                return True
            except FileNotFoundError:
                return False
        return path.exists()

    # -- object stores ----------------------------------------------------------------------------------------

    def set_roots(self, roots: dict[str, dict[str, str]]) -> None:
        """The warehouses besides the default one: root URI -> the S3 settings (obstore S3Store options) files
        within it are read and written with."""
        self._roots = sorted(roots.items(), key=lambda item: len(item[0]), reverse=True)

    def s3_options_for(self, uri: str) -> dict[str, str]:
        for root, options in self._roots:
            if is_within(root, uri):
                return options
        return self.s3_options

    def object_store(self, uri: str):
        """(obstore store, key) for an s3:// URI: the one place credentials and endpoints are configured. One
        store per bucket and settings, kept: a store holds its HTTP connections."""
        parsed = urlparse(uri)
        if parsed.scheme not in ("s3", "s3a"):
            raise FileRefused(f"unsupported storage scheme {parsed.scheme!r} in {uri}; use file:// or s3://")
        bucket = parsed.netloc
        options = self.s3_options_for(uri)
        cache_key = (bucket, tuple(sorted(options.items())))
        store = self._stores.get(cache_key)
        if store is None:
            from obstore.store import S3Store
            store = S3Store(bucket, **options)
            self._stores[cache_key] = store
        return store, parsed.path.lstrip("/")

    def _put_object(self, uri: str, data: bytes) -> None:
        """Create the object, never replace one (`If-None-Match: *`): the service writes only names it made new
        (Iceberg metadata) or that its store gave it (Lance's `_versions/N.manifest`), and an object already there
        is someone else's, or ours from an attempt whose answer was lost. Ours (the same bytes) is the write done,
        as the local path leaves the same file in place; another's is refused and left intact. A PUT answered
        200 is durable: S3 acknowledges only stored objects."""
        import obstore
        from obstore.exceptions import AlreadyExistsError
        store, key = self.object_store(uri)
        try:
            obstore.put(store, key, data, mode="create", use_multipart=False)
        except AlreadyExistsError:
            try:
                there = bytes(obstore.get(store, key).bytes())
            except FileNotFoundError:   # removed since: create it again
                return self._put_object(uri, data)
            if there != data:
                raise FileTaken(f"{uri} already holds an object this service did not write; it was left intact "
                                f"and nothing was written over it") from None
