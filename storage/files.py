"""Table files (Iceberg metadata JSON, Delta logs, Lance manifests) on `file://` paths or `s3://` buckets.

A file is durable before anything points at it: locally we write a temp file, fsync it, link it into place and
fsync the directory; on S3 a completed PUT is durable. `put_if_absent` is the one primitive the formats' "never
overwrite a committed version" rules need (local: link(2) fails on an existing name; S3: conditional PUT).

S3 goes through obstore (Rust's object_store): one well-kept client with conditional PUT, credentials from the
usual AWS environment, and no boto stack. Local files use the OS directly so we control fsync.
"""

from __future__ import annotations

import errno
import os
import re
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

import trio

from coordinator.errors import AlreadyExists, BadRequest, NotFound


def local_path(uri: str) -> str | None:
    """The local path for a file:// URI or a bare absolute path; None for object-store URIs."""
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
    if m is None:
        return None
    return (f"it holds {m.group()!r}: locations cannot hold control characters, backslashes, '?' or '#', nor "
            f"percent-encode '.', '/', '\\\\', '?', '#' or control characters")


_UNSAFE_IN_SEGMENT = re.compile(r"[^A-Za-z0-9_.-]")


def path_segment(name: str) -> str:
    """A directory name for a namespace level or table name: readable, harmless in a URI and to every client,
    and never `.` or `..` (so a name like `..` or `%2e%2e` cannot move a default location out of its root)."""
    cleaned = _UNSAFE_IN_SEGMENT.sub("_", name).strip(".") or "_"
    return cleaned[:100]


def is_within(root: str, uri: str) -> bool:
    """True if `uri` names `root` itself or a path below it (after normalising `..` and slashes), read the same
    way by every client: a `uri` that `unsafe_location` refuses is never within."""
    if unsafe_location(uri) is not None:
        return False

    def norm(u: str) -> tuple[str, str]:
        local = to_local_path(u)
        if local is not None:
            return "file", os.path.normpath(str(local))
        p = urlparse(u)
        return p.scheme, os.path.normpath(f"/{p.netloc}{p.path}")
    rs, rp = norm(root)
    us, up = norm(uri)
    return rs == us and (up == rp or up.startswith(rp.rstrip("/") + "/"))


class FileIO:
    def __init__(self, s3_options: dict[str, str] | None = None):
        self.s3_options = dict(s3_options or {})
        self._stores: dict[str, object] = {}

    # -- public, awaited from trio (blocking work runs in a worker thread) ----------------------------------

    async def write(self, uri: str, data: bytes) -> None:
        await trio.to_thread.run_sync(self.write_sync, uri, data, False)

    async def write_many(self, files: list[tuple[str, bytes]]) -> None:
        """Write several files durably with one worker-thread hop. Local files are all written first and fsynced
        after, each directory once: on ext4 the first fsync commits the journal for all of them, so a batch
        costs about one fsync instead of two per file."""
        await trio.to_thread.run_sync(self._write_many_sync, files)

    def _write_many_sync(self, files: list[tuple[str, bytes]]) -> None:
        # Plain strings and os.path here, not pathlib: this runs for every commit, and building Path objects was
        # a visible share of a commit's CPU in the profile.
        local, remote = [], []
        for uri, data in files:
            path = local_path(uri)
            if path is None:
                remote.append((uri, data))
            else:
                local.append((path, data))
        for uri, data in remote:
            self._put_object(uri, data, False)
        fds, dirs = [], set()
        try:
            for path, data in local:
                parent, name = os.path.split(path)
                os.makedirs(parent, exist_ok=True)
                tmp = os.path.join(parent, f".{name}.{uuid.uuid4().hex}.tmp")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                fds.append((fd, tmp, path))
                _write_all(fd, data)
            for fd, _, _ in fds:
                os.fsync(fd)
        finally:
            for fd, _, _ in fds:
                os.close(fd)
        for _, tmp, path in fds:
            os.replace(tmp, path)
            dirs.add(os.path.dirname(path))
        for d in dirs:
            _fsync_dir(d)

    async def put_if_absent(self, uri: str, data: bytes) -> None:
        """Raises AlreadyExists when a file is already there."""
        await trio.to_thread.run_sync(self.write_sync, uri, data, True)

    async def read(self, uri: str) -> bytes:
        return await trio.to_thread.run_sync(self.read_sync, uri)

    async def delete(self, uri: str) -> None:
        await trio.to_thread.run_sync(self.delete_sync, uri)

    async def exists(self, uri: str) -> bool:
        return await trio.to_thread.run_sync(self.exists_sync, uri)

    # -- sync implementations --------------------------------------------------------------------------------

    def write_sync(self, uri: str, data: bytes, exclusive: bool = False) -> None:
        path = to_local_path(uri)
        if path is None:
            return self._put_object(uri, data, exclusive)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            if exclusive:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise AlreadyExists(f"file already exists: {uri}") from None
            else:
                os.replace(tmp, path)
        finally:
            if exclusive or tmp.exists():
                tmp.unlink(missing_ok=True)
        _fsync_dir(path.parent)

    def read_sync(self, uri: str) -> bytes:
        path = to_local_path(uri)
        if path is None:
            import obstore
            store, key = self.object_store(uri)
            try:
                return bytes(obstore.get(store, key).bytes())
            except FileNotFoundError:
                raise NotFound(f"file not found: {uri}") from None
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"file not found: {uri}") from None
        except IsADirectoryError:
            raise BadRequest(f"not a file: {uri}") from None
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:
                raise BadRequest(f"path too long: {uri[:200]}...") from None
            raise

    def delete_sync(self, uri: str) -> None:
        path = to_local_path(uri)
        if path is None:
            import obstore
            store, key = self.object_store(uri)
            obstore.delete(store, key)
            return
        path.unlink(missing_ok=True)

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
            raise BadRequest(f"unsupported storage scheme {parsed.scheme!r} in {uri}; use file:// or s3://")
        bucket = parsed.netloc
        store = self._stores.get(bucket)
        if store is None:
            from obstore.store import S3Store
            store = S3Store(bucket, **self.s3_options)
            self._stores[bucket] = store
        return store, parsed.path.lstrip("/")

    def _put_object(self, uri: str, data: bytes, exclusive: bool) -> None:
        import obstore
        store, key = self.object_store(uri)
        try:
            obstore.put(store, key, data, mode="create" if exclusive else "overwrite")
        except Exception as exc:  # obstore raises AlreadyExistsError for a failed conditional PUT
            if exclusive and type(exc).__name__ == "AlreadyExistsError":
                raise AlreadyExists(f"file already exists: {uri}") from None
            raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
