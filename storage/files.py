"""Table files (Iceberg metadata JSON, Delta logs, Lance manifests) on `file://` paths or `s3://` buckets.

A file is durable before anything points at it: locally we write a temp file, fsync it, rename it into place
and fsync the directory (or, when a file beside it already holds the bytes, Lance's staged manifest, fsync and
rename that one); on S3 a completed PUT is durable. No file write needs to refuse an existing name: which
commit owns a version is decided by the database's compare-and-set, never by the file system.

S3 goes through obstore (Rust's object_store): one well-kept client, credentials from the usual AWS environment,
and no boto stack. Local files use the OS directly so we control fsync.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import os
import re
import stat
import time
import uuid
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlparse

import trio
from obstore.exceptions import InvalidPathError

from .errors import FileMissing, FileRefused

from .grouped import GroupedCall

log = logging.getLogger(__name__)

# What a read from within a table's place (a Lance staged manifest, read whole into memory) may be at most: far
# above any manifest, and a bound on what a writer's file can make the service hold.
MAX_READ_WITHIN_BYTES = 256 << 20

# A file to make durable: (uri, data), or (uri, data, source, within).
# - `source`, a file beside it (same directory), may hold `data` already (Lance's staged manifest): then it is
#   renamed into place instead, its bytes checked first; in any case it is gone once `uri` is in place.
# - `within`, the table's place: locally, the file's directory is then reached from it without following a link
#   (`FileIO._directory`), and everything is done relative to that directory (a link planted in a table's
#   directory leads neither the write nor the rename elsewhere).
FileWrite = tuple[str, bytes] | tuple[str, bytes, str | None, str | None]


def file_write(entry: FileWrite) -> tuple[str, bytes, str | None, str | None]:
    """(uri, data, source, within) of a FileWrite of either form."""
    return (*entry, None, None)[:4]


def local_path(uri: str) -> str | None:
    """The local path for a file:// URI or a bare absolute path; None for object-store URIs."""
    if uri.startswith("/"):  # a bare path (no scheme): the common case, without urlparse's cost
        return uri
    parsed = urlparse(uri)
    if parsed.scheme == "file":  # file:///p and Hadoop's file:/p
        return unquote(parsed.path)
    if not parsed.scheme:
        return uri
    return None


def to_local_path(uri: str) -> Path | None:
    path = local_path(uri)
    return None if path is None else Path(path)


def join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


# What no location a client gives may hold, raw or percent-encoded: control characters (URL parsers drop tabs and
# newlines, the OS cannot open a NUL), backslashes (WHATWG URL parsers, Rust's `url` among them, read them as `/`
# in file:// URIs), `?` and `#` (a query or fragment would cut the path short), and encoded `.` or `/` (`%2e%2e`
# is a `..` segment to some readers and a plain name to others). Refusing them means that every reader of a
# location, our file I/O and every client, resolves it to the same place.
_UNSAFE_IN_LOCATION = re.compile(r"[\x00-\x1f\x7f\\?#]|%(?:[01][0-9a-f]|7f|2e|2f|5c|3f|23)", re.IGNORECASE)


def unsafe_location(uri: str) -> str | None:
    """Why a client-given location is refused whatever the root (see `_UNSAFE_IN_LOCATION`), or None."""
    m = _UNSAFE_IN_LOCATION.search(uri)
    if m is not None:
        return (f"it holds {m.group()!r}: locations cannot hold control characters, backslashes, '?' or '#', nor "
                f"percent-encode '.', '/', '\\\\', '?', '#' or control characters")
    try:
        urlparse(uri)
    except ValueError as exc:   # e.g. "s3://[x/y": an unclosed IPv6 host
        return f"it is not a valid URI ({exc})"
    return None


_UNSAFE_IN_SEGMENT = re.compile(r"[^A-Za-z0-9_.-]")


def path_segment(name: str) -> str:
    """A directory name for a namespace level or table name: readable, harmless in a URI and to every client,
    and never `.` or `..` (so a name like `..` or `%2e%2e` cannot move a default location out of its root).

    One name, one directory: a name that is not already such a segment is cleaned and marked with `~` and a hash
    of the name (`a?b` -> `a_b~3f2c...`). `~` is outside the safe set, so no other name's segment can equal it,
    and with authentication on a namespace's directory (where its tables may be placed) is its own."""
    cleaned = _UNSAFE_IN_SEGMENT.sub("_", name).strip(".")[:100] or "_"
    if cleaned == name:
        return name
    return f"{cleaned}~{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def location_key(uri: str) -> str:
    """One spelling per place (`..` and repeated or trailing slashes resolved): `file:/p` for a local path however
    written (`/p`, `file:/p`, `file:///p/`), `scheme:/bucket/p` for an object store. A place is within another
    when its key equals the other's or starts with it plus `/`."""
    local = local_path(uri)
    if local is not None:
        return "file:" + os.path.normpath(local)
    p = urlparse(uri)
    return f"{p.scheme}:" + os.path.normpath(f"/{p.netloc}{p.path}")


def is_within(root: str, uri: str) -> bool:
    """True if `uri` names `root` itself or a path below it, read the same way by every client: a `uri` that
    `unsafe_location` refuses is never within."""
    if unsafe_location(uri) is not None:
        return False
    r, u = location_key(root), location_key(uri)
    return u == r or u.startswith(r.rstrip("/") + "/")


def is_below(root: str, uri: str) -> bool:
    """`is_within`, but not `root` itself."""
    if unsafe_location(uri) is not None:
        return False
    return location_key(uri).startswith(location_key(root).rstrip("/") + "/")


def _in_worker_thread(run_batch: Callable[[list[Any]], list[Any]]) -> GroupedCall:
    return GroupedCall(functools.partial(trio.to_thread.run_sync, run_batch),
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
        self._stores: dict[str, object] = {}
        # The commit path's file work, one worker-thread hop per moment for all tables (storage/grouped.py):
        # writes before or after a commit's row, reads of staged Lance manifests, deletes of what commits made
        # obsolete.
        self._writes = _in_worker_thread(self._write_batches_sync)
        # CPU seconds spent making files durable (the kernel's copy into the page cache and fsync, mostly):
        # /metrics shows it, so a commit's cost can be told apart from the cost of the file it must write.
        self.write_cpu_s = 0.0
        self._reads = _in_worker_thread(_each(lambda item: self.read_within_sync(*item)))
        self._deletes = _in_worker_thread(_each(lambda item: self.delete_within_sync(*item)))

    # -- public, awaited from trio (blocking work runs in a worker thread) ----------------------------------

    async def write_many(self, files: list[FileWrite]) -> None:
        """Write several files durably, with every other table's files waiting at the same moment (the file
        system's side of group commit). Local files are all written first and fsynced after, each directory
        once: on ext4 the first fsync commits the journal for all of them, so a batch costs about one fsync
        instead of two per file. One caller's failure is its own: the others' files are still written."""
        if files:
            await self._writes(files)

    def _write_batches_sync(self, batches: list[list[FileWrite]]) -> list[Exception | None]:
        """Each caller's files made durable (None), or the exception that stopped them (the others go on)."""
        started = time.thread_time()
        try:
            return self._write_durably(batches)
        finally:
            self.write_cpu_s += time.thread_time() - started  # batches run one at a time (storage/grouped.py)

    def _write_durably(self, batches: list[list[FileWrite]]) -> list[Exception | None]:
        errors: list[Exception | None] = [None] * len(batches)
        # Each file's directory: a descriptor reached without following links when the caller named the table's
        # place (`within`), so that every name below is used relative to it; else None, and names are full paths.
        places: dict[tuple[str, str | None], int | None] = {}
        opened: list[int] = []
        # (batch, fd, tmp or None, name, source name or None, data, directory): a temp file written here, or (tmp
        # None) a caller's `source` that already holds the bytes and is renamed into place (`_adopt`); the source
        # of a file written here is removed once the file is in place.
        staged: list[tuple[int, int, str | None, str, str | None, bytes, int | None]] = []
        # Plain strings and os.path here, not pathlib: this runs for every commit, and building Path objects was
        # a visible share of a commit's CPU in the profile.
        try:
            for i, files in enumerate(batches):
                try:
                    for entry in files:
                        self._stage(i, entry, places, opened, staged)
                except Exception as exc:
                    errors[i] = exc
            for i, fd, tmp, *_ in staged:
                try:
                    if errors[i] is None:
                        os.fsync(fd)
                except Exception as exc:
                    errors[i] = exc
                finally:
                    if tmp is not None:
                        os.close(fd)   # an adopted source's stays open: what lands is checked through it
            dirs: dict[tuple[str, int | None], list[int]] = {}
            for i, fd, tmp, name, source, data, dir_fd in staged:
                try:
                    if errors[i] is None:
                        if tmp is None:
                            if not _renamed_unchanged(fd, source, name, data, dir_fd):
                                # Removed, swapped or rewritten since it was checked (the writer's own file): what
                                # is in place is not what was checked, so write the checked bytes after all.
                                _write_in_place(name, data, dir_fd)
                        else:
                            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                            if source is not None:
                                _quietly(functools.partial(os.unlink, dir_fd=dir_fd), source)
                        dirs.setdefault((os.path.dirname(name), dir_fd), []).append(i)
                        continue
                except Exception as exc:
                    errors[i] = exc
                finally:
                    if tmp is None:
                        os.close(fd)
                if tmp is not None:
                    _quietly(functools.partial(os.unlink, dir_fd=dir_fd), tmp)
            for (d, dir_fd), owners in dirs.items():
                try:
                    if dir_fd is None:
                        _fsync_dir(d)
                    else:
                        os.fsync(dir_fd)
                except Exception as exc:
                    for i in owners:
                        errors[i] = errors[i] or exc
        finally:
            for fd in opened:
                os.close(fd)
        return errors

    def _stage(self, i: int, entry: FileWrite, places: dict, opened: list[int], staged: list) -> None:
        """Start one file of caller `i`: adopt its source, or write a temp file (fsynced and renamed later)."""
        uri, data, source_uri, within_uri = file_write(entry)
        path = local_path(uri)
        if path is None:
            self._put_object(uri, data)
            return
        parent, name = os.path.split(path)
        within = local_path(within_uri) if within_uri else None
        key = (parent, within)
        if key not in places:
            places[key] = self._directory(parent, within, opened)
        dir_fd = places[key]
        if dir_fd is None:
            name = path   # (full paths, from the process's root)
        source = local_path(source_uri) if source_uri else None
        if source is not None:
            if os.path.dirname(source) != parent:
                source = None   # (only a file beside it is renamed, or removed)
            elif dir_fd is not None:
                source = os.path.basename(source)
        if source is not None:
            fd = _adopt(source, data, dir_fd)
            if fd is not None:
                staged.append((i, fd, None, name, source, data, dir_fd))
                return
        tmp = os.path.join(os.path.dirname(name), f".{os.path.basename(name)}.{uuid.uuid4().hex}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
        except FileNotFoundError:  # the directory's first file: make it (three syscalls saved otherwise)
            if dir_fd is not None:
                raise
            _make_dirs(parent)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        staged.append((i, fd, tmp, name, source, data, dir_fd))
        _write_all(fd, data)

    @staticmethod
    def _directory(parent: str, within: str | None, opened: list[int]) -> int | None:
        """A descriptor of `parent`, a directory in the table's place `within`, reached from `within` without
        following a link (`_descend`; made if missing); None when no place is named (full paths). Unlike a purge,
        a write trusts the path to the table's place itself: an operator may have linked a namespace's or a
        table's directory to another disk, and refusing to write there would take those tables down. Below it,
        where the table's writers put their files, a link leads nowhere."""
        if within is None:
            return None
        parts = _parts_below(within, parent)
        if parts is None:
            raise OSError(errno.ENOTDIR, "not in the table's place", parent)   # (never silently by path)
        try:
            fds, _ = _descend(within, within, parts, create=True)
        except FileNotFoundError:   # the place itself is new (a table just moved there by `set-location`)
            _make_dirs(within)
            fds, _ = _descend(within, within, parts, create=True)
        opened.extend(fds)
        return fds[-1]

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

    def object_store(self, uri: str):
        """(obstore store, key) for an s3:// URI: the one place credentials and endpoints are configured."""
        parsed = urlparse(uri)
        if parsed.scheme not in ("s3", "s3a"):
            raise FileRefused(f"unsupported storage scheme {parsed.scheme!r} in {uri}; use file:// or s3://")
        bucket = parsed.netloc
        store = self._stores.get(bucket)
        if store is None:
            from obstore.store import S3Store
            store = S3Store(bucket, **self.s3_options)
            self._stores[bucket] = store
        return store, parsed.path.lstrip("/")

    def _put_object(self, uri: str, data: bytes) -> None:
        import obstore
        store, key = self.object_store(uri)
        obstore.put(store, key, data, mode="overwrite")


def _adopt(source: str, data: bytes, dir_fd: int | None = None) -> int | None:
    """An open descriptor of `source` if it can become the file that holds `data` instead of a copy: a plain file
    (no link, no other name) of this process's own user (a copy written here would be no better guarded), holding
    exactly `data`, and made readable to all as a copy would be (0644). None otherwise: write the bytes."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid()
                and st.st_size == len(data) and os.pread(fd, len(data) + 1, 0) == data):
            if stat.S_IMODE(st.st_mode) != 0o644:
                os.fchmod(fd, 0o644)
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _renamed_unchanged(fd: int, source: str, name: str, data: bytes, dir_fd: int | None = None) -> bool:
    """Rename the adopted `source` (open as `fd`) to `name`; whether what now is `name` is that file, still
    holding exactly `data` (it may have been swapped or rewritten since `_adopt` checked it)."""
    try:
        os.replace(source, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        landed, ours = os.stat(name, dir_fd=dir_fd, follow_symlinks=False), os.fstat(fd)
    except FileNotFoundError:
        return False
    if (landed.st_dev, landed.st_ino) != (ours.st_dev, ours.st_ino):
        if stat.S_ISDIR(landed.st_mode):   # a directory swapped in: put it back where it was (a file can go there)
            os.rename(name, source, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return False
    return ours.st_nlink == 1 and os.pread(fd, len(data) + 1, 0) == data


def _write_in_place(name: str, data: bytes, dir_fd: int | None = None) -> None:
    """Write `name` durably through a temp file (its directory is fsynced by the caller)."""
    tmp = os.path.join(os.path.dirname(name), f".{os.path.basename(name)}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _quietly(functools.partial(os.unlink, dir_fd=dir_fd), tmp)
        raise


def _read_at_most(fd: int, size: int, limit: int) -> bytes:
    """A regular file's bytes from its start, `size` as `fstat` saw it, but at most `limit + 1` (more means it grew
    past the limit). One read in the common case: a buffer of the size expected, not of the limit (a 256 MiB
    buffer per read was allocated and unmapped again each time, which stalls the process's other threads)."""
    data = os.pread(fd, min(size, limit) + 1, 0)
    if len(data) <= size:
        return data   # (a short read of a regular file is its end)
    parts = [data]
    total = len(data)
    while total <= limit:   # grown since fstat
        more = os.pread(fd, min(1 << 20, limit + 1 - total), total)
        if not more:
            break
        parts.append(more)
        total += len(more)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _quietly(remove: Callable[[str], None], path: str) -> None:
    """`remove(path)` (os.unlink, os.rmdir), an OSError ignored: what is left is litter, not a failure."""
    try:
        remove(path)
    except OSError:
        pass


# A path that names no file this process could ever read or delete: a directory, a name below a file, a name too
# long, a symlink loop, a file it may not touch. Skipped by a purge (anything else may be transient: retried).
NOT_A_FILE = {errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EPERM, errno.EACCES}


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _parts_below(base: str, path: str) -> list[str] | None:
    """The names leading from the directory `base` down to `path` (local, decoded paths; [] for `base` itself), or
    None if `path` is not at or below it. By normalised text: what is opened with them follows no link, so the
    text is what the kernel resolves."""
    base, path = os.path.normpath(base), os.path.normpath(path)
    if path == base:
        return []
    prefix = base.rstrip(os.sep) + os.sep
    return path[len(prefix):].split(os.sep) if path.startswith(prefix) else None


def _file_below(base: str, path: str) -> list[str]:
    """`_parts_below` for a file strictly below `base`; an OSError (NOT_A_FILE) for anything else."""
    parts = _parts_below(base, path)
    if parts is None:
        raise OSError(errno.ENOTDIR, "not below the table's place", path)
    if not parts:
        raise OSError(errno.EISDIR, "the table's place itself is not a file", path)
    return parts


def _descend(trusted: str | None, root: str, parts: list[str], create: bool = False) -> tuple[list[int], list[str]]:
    """Descriptors of the directories from the top down to `root`/`parts`, each opened from the one above without
    following a link, and the names of those below the top (`fds[i + 1]` is `names[i]`). The top is `trusted`
    (the warehouse: links in its own path are the operator's) when `root` lies within it, else `root`, which
    must not be a link either. With `create`, missing directories below the top are made (durably)."""
    above = _parts_below(trusted, root) if trusted is not None else None
    fds = [os.open(trusted, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if above is not None
           else os.open(root, _DIRECTORY)]
    above = above or []
    try:
        for part in above + parts:
            try:
                fds.append(os.open(part, _DIRECTORY, dir_fd=fds[-1]))
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, dir_fd=fds[-1])
                except FileExistsError:
                    pass
                os.fsync(fds[-1])   # the new directory's name made durable with it
                fds.append(os.open(part, _DIRECTORY, dir_fd=fds[-1]))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds, above + parts


@contextlib.contextmanager
def _opened_beneath(root: str, path: str, flags: int):
    """A descriptor of the file `path`, below the directory `root` (the table's place, whose own path is trusted),
    reached from `root` without following a link, and opened without following one either."""
    parts = _file_below(root, path)
    fds, _ = _descend(root, root, parts[:-1])
    try:
        fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1])
    finally:
        for d in fds:
            os.close(d)
    try:
        yield fd
    finally:
        os.close(fd)


def _unlink_beneath(root: str, path: str, trusted: str | None = None, prune: bool = True) -> None:
    """Unlink `path`, a file below the directory `root` (by its text: `is_within`), then (`prune`) the directories
    that leaves empty, up to `root` itself. No link below the warehouse (`trusted`), not even one swapped in meanwhile,
    is followed (see `_descend`): such a path fails with ELOOP or ENOTDIR (NOT_A_FILE) instead."""
    parts = _file_below(root, path)
    fds, names = _descend(trusted, root, parts[:-1])
    root_index = len(names) - len(parts)   # `root` is names[root_index] (-1: root is the top itself)
    try:
        os.unlink(parts[-1], dir_fd=fds[-1])
        if not prune:
            return
        for i in range(len(names) - 1, max(root_index, 0) - 1, -1):   # emptied directories, deepest first
            try:
                os.rmdir(names[i], dir_fd=fds[i])
            except OSError:
                return   # not empty (or gone): nor are those above it
    finally:
        for fd in fds:
            os.close(fd)
    if root_index < 0 and prune:
        _quietly(os.rmdir, root)


_SUBDIRECTORY = _DIRECTORY | os.O_NONBLOCK   # (O_DIRECTORY fails on a FIFO before opening it could block)


def _enter(parent_fd: int, name: str) -> int | None:
    """A descriptor of the directory `name` in `parent_fd`, or None: gone, or not a directory (a link, a file, a
    FIFO: the entry itself is removed, nothing it may point at), or unreadable (left, as rmtree's ignore_errors)."""
    try:
        return os.open(name, _SUBDIRECTORY, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            _quietly(functools.partial(os.unlink, dir_fd=parent_fd), name)
        return None


def _entries(fd: int) -> list[os.DirEntry]:
    try:
        with os.scandir(fd) as it:   # (scans a duplicate of `fd`, which stays ours)
            return list(it)
    except OSError:
        return []


def _remove_tree(parent_fd: int, top: str, check: Callable[[], None]) -> None:
    """Remove `top`, in the directory `parent_fd`, and everything below it, bottom-up, best effort, through
    directory descriptors only (as shutil.rmtree does below its top): no link is followed, not even one swapped in
    while it runs. An explicit stack, so that no nesting depth can stop it. `check()` before each file."""
    fd = _enter(parent_fd, top)
    if fd is None:
        return
    stack = [(fd, top, parent_fd, _entries(fd))]   # (descriptor, name, parent's descriptor, entries left)
    try:
        while stack:
            fd, name, parent, entries = stack[-1]
            if entries:
                entry = entries.pop()
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir:
                    child = _enter(fd, entry.name)
                    if child is not None:
                        stack.append((child, entry.name, fd, _entries(child)))
                else:
                    check()
                    _quietly(functools.partial(os.unlink, dir_fd=fd), entry.name)
                continue
            stack.pop()
            os.close(fd)
            try:
                os.rmdir(name, dir_fd=parent)
            except NotADirectoryError:   # swapped for something else meanwhile: that goes instead
                _quietly(functools.partial(os.unlink, dir_fd=parent), name)
            except OSError:
                pass
    finally:
        for fd, *_ in stack:
            os.close(fd)


class DeletionStopped(OSError):
    """A tree deletion ended early, on request (`FileIO.delete_tree`'s `stop`): what is left stays."""


def _make_dirs(path: str) -> None:
    """`os.makedirs(path, exist_ok=True)`, each new directory's name made durable (its parent fsynced)."""
    path = os.path.abspath(path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            pass
        _fsync_dir(os.path.dirname(d))


def _fsync_dir(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
