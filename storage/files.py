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

from .errors import FileMissing, FileRefused, FileTaken, FileUnavailable
from .grouped import GroupedCall
# The names other layers import from here: the file IO, its file-write tuple, and the location helpers.
from .localfs import (NOT_A_FILE, DeletionStopped, FileWrite, _descend, _opened_beneath, _read_at_most,
                      _remove_tree, _unlink_beneath, file_write, put_if_absent, write_durably)
from .paths import (is_below, is_within, join, local_path, location_key, path_segment, to_local_path,
                    unsafe_location)
from .worker import WorkerThread

__all__ = ["FileIO", "FileWrite", "file_write", "DeletionStopped", "NOT_A_FILE", "MAX_READ_BYTES", "READ_TIMEOUT_S",
           "is_below", "is_within", "join", "local_path", "location_key", "path_segment", "to_local_path",
           "unsafe_location"]

log = logging.getLogger(__name__)

# Every file the service reads is read whole into memory, and most are named by a client (a staged Lance manifest,
# the metadata an Iceberg register names, a Delta table's first commit, the manifests a purge walks): this is the
# most any of them may be. Far above any manifest or metadata file; a bound on what a client's file can make the
# service hold.
MAX_READ_BYTES = 256 << 20
# How long a read may take before it is answered as unavailable (503, nothing changed). A thread cannot be
# cancelled: the one still reading is abandoned until the file system answers, so that stalled reads never hold up
# the threads writes go through, nor other reads (READ_THREADS: the pool of reads off the commit path).
READ_TIMEOUT_S = 30.0
READ_THREADS = 16
READ_WORKERS = 4   # long-lived threads for reads on the commit path (`FileIO.reading`): each reads one file at a time


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
        # Reads. Lance's staged manifests, read on the commit path, a batch per moment on a thread of their own,
        # abandoned at READ_TIMEOUT_S (storage/worker.py) so that the next batch goes on; any other read (rare: a
        # register, a table's load) on a thread of its own from a pool of READ_THREADS, ended there too, so that a
        # read that stalls holds up no other.
        self._read_threads = trio.CapacityLimiter(READ_THREADS)
        self._durable_reads = GroupedCall(
            functools.partial(WorkerThread("file-durable-reads", abandon_on_cancel=True).run_sync,
                              _each(lambda item: self._read_durable_sync(*item))),
            interrupted=lambda: OSError("the file operation was interrupted"),
            timeout_s=READ_TIMEOUT_S, timed_out=lambda: _read_timed_out("a staged file"))
        self._deletes = _in_worker_thread("file-deletes", _each(lambda item: self.delete_within_sync(*item)))
        # Reads a commit needs before it is decided (an Iceberg rebase's manifest lists): see `reading`.
        self._readers = [WorkerThread(f"file-reads-{i}", abandon_on_cancel=True) for i in range(READ_WORKERS)]
        self._next_reader = 0

    # -- public, awaited from trio (blocking work runs in a worker thread) ----------------------------------

    async def write_many(self, files: list[FileWrite]) -> None:
        """Write several files durably, with every other table's files waiting at the same moment (the file
        system's side of group commit). Local files are all written first and fsynced after, each directory
        once: on ext4 the first fsync commits the journal for all of them, so a batch costs about one fsync
        instead of two per file. One caller's failure is its own: the others' files are still written."""
        if files:
            await self._writes(files)

    def put_if_absent_sync(self, directory: str, files: list[tuple[str, bytes]], within: str) -> tuple[int, bool]:
        """Create the files `(name, data)` in `directory`, in order, each only where no file is yet, durably: how
        many now hold their data (written, or already), and whether the next held other bytes (left intact, and
        none after it written: nothing is ever written over). Blocking."""
        path = local_path(directory)
        if path is not None:
            return put_if_absent(path, files, local_path(within))
        done = 0
        for name, data in files:
            try:
                self._put_object(join(directory, name), data)
            except FileTaken:
                return done, True
            done += 1
        return done, False

    async def read_durable(self, uri: str, within: str) -> bytes:
        """`read`, and the file made durable first: a client's staged file that a commit will adopt may never
        have been synced by its writer, and once the commit is recorded it is the only copy the published file
        can be restored from (fsynced through the descriptor it is read by). Batched with other reads, before the commit is offered:
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
        """A file's bytes, read as `read_within_sync` says (a regular file, reached from `within` without following
        a link, of at most MAX_READ_BYTES), on a thread of its own: FileUnavailable after READ_TIMEOUT_S."""
        with trio.move_on_after(READ_TIMEOUT_S):
            return await trio.to_thread.run_sync(self.read_within_sync, uri, within, abandon_on_cancel=True,
                                                 limiter=self._read_threads)
        raise _read_timed_out(uri)

    async def reading(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`, blocking work made of reads (`read_within_sync` calls, and parsing what they read), on
        one of READ_WORKERS long-lived threads in turn (the commit path's reads: a thread of trio's cache per call
        cost a commit more than the reading). The caller bounds its time: a cancelled caller stops waiting at
        once, and the thread is left to end on its own while later calls go to a new one (storage/worker.py)."""
        self._next_reader = (self._next_reader + 1) % len(self._readers)
        return await self._readers[self._next_reader].run_sync(fn, *args)

    async def delete(self, uri: str, within: str) -> None:
        """Delete one file of the place `within` (a table's): see `delete_within_sync`."""
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
            try:
                if location is None:
                    raise FileRefused("it has no place to lie within")
                self.delete_within_sync(uri, location, prune=True)
            except FileRefused as exc:   # (the service's own names: this never happens, and then it is litter)
                log.warning("not removing %s: %s", uri, exc)

    def delete_listed_sync(self, location: str, uris: list[str], stop: Callable[[], bool] | None = None) -> None:
        """Delete those of `uris` that lie within `location`, in order, then the directories that leaves empty, up
        to `location` itself: a purge of the files a table's metadata reaches (the paths are the client's word,
        and only the table's own place is touched). Stops as `delete_tree_sync` does."""
        if self.leads_elsewhere(location):
            return
        for uri in uris:
            if not is_below(location, uri):
                continue
            if stop is not None and stop():
                raise DeletionStopped(f"the deletion of {location}'s files was stopped before it ended")
            try:
                self.delete_within_sync(uri, location, prune=True)
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

    def _read_durable_sync(self, uri: str, within: str) -> bytes:
        return self.read_within_sync(uri, within, durable=True)

    def read_within_sync(self, uri: str, within: str | None = None, durable: bool = False,
                         limit: int | None = None) -> bytes:
        """The one way a file is read, blocking. Locally only a regular file (a FIFO or a device would block the
        thread for good, or hand over a stream), reached from `within` (the place the file must lie in; None:
        its own directory) following no link below it, opened without waiting (a FIFO, a lease), and of at most
        MAX_READ_BYTES (or `limit`, if less); from an object store, the same. FileMissing if it is not there,
        FileRefused if it is not such a file. `durable`: a local file is fsynced too, through the descriptor it was
        read by (see `read_durable`; an object-store PUT is durable already)."""
        path = local_path(uri)
        limit = MAX_READ_BYTES if limit is None else min(limit, MAX_READ_BYTES)
        if path is None:
            return self._get_object(uri, limit)
        root = os.path.dirname(path) if within is None else local_path(within)
        if root is None:
            raise FileRefused(f"{uri} is not within {within}")
        try:
            with _opened_beneath(root, path, os.O_RDONLY | os.O_NONBLOCK) as fd:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise FileRefused(f"not a regular file: {uri}")
                data = _read_at_most(fd, _bounded(uri, st.st_size, limit), limit)
                _bounded(uri, len(data), limit)   # (grown since)
                if durable:
                    os.fsync(fd)
                return data
        except FileNotFoundError:
            raise FileMissing(f"file not found: {uri}") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise FileRefused(f"not a file reached without following a link: {uri}") from None
            if exc.errno == errno.ENAMETOOLONG:
                raise FileRefused(f"path too long: {uri[:200]}...") from None
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):   # (a lease another process holds on it)
                raise FileUnavailable(f"{uri} is held by another process; nothing changed, retry") from None
            raise

    def _get_object(self, uri: str, limit: int = MAX_READ_BYTES) -> bytes:
        import obstore
        store, key = self.object_store(uri)
        try:
            found = obstore.get(store, key)
        except FileNotFoundError:
            raise FileMissing(f"file not found: {uri}") from None
        _bounded(uri, found.meta["size"], limit)   # (before its bytes are fetched)
        return bytes(found.bytes())

    def delete_within_sync(self, uri: str, within: str, prune: bool = False) -> None:
        """Delete the file `uri`, if it is there, in the place `within` (a table's location). Refused (FileRefused)
        unless its path lies below `within` as every reader resolves it (`is_below`: no `..`, no `%2f`): there is
        no other way to delete a file, and so none by a path that could lead elsewhere. Locally it is reached from
        the warehouse without following a link below it (`_unlink_beneath`: an OSError of NOT_A_FILE otherwise);
        with `prune`, the directories that leaves empty go too, up to `within` itself."""
        if not is_below(within, uri):
            raise FileRefused(f"not deleting {uri[:300]}: it is not a file within {within}")
        root, path = local_path(within), local_path(uri)
        if path is None:
            import obstore
            store, key = self.object_store(uri)
            obstore.delete(store, key)
            return
        try:
            _unlink_beneath(root, path, self._trusted, prune=prune)
        except FileNotFoundError:
            pass

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


def _bounded(uri: str, size: int, limit: int = MAX_READ_BYTES) -> int:
    """`size`, if a file of that size may be read (`limit`, MAX_READ_BYTES at most); FileRefused otherwise."""
    if size > limit:
        raise FileRefused(f"{uri} has more than {limit} bytes: a file read here may have at most {limit}")
    return size


def _read_timed_out(what: str) -> FileUnavailable:
    return FileUnavailable(f"reading {what} took longer than {READ_TIMEOUT_S:g} s; nothing changed, retry")
