"""The local file system's side of the file IO: durable writes (temp file, fsync, rename, directory fsync) and
everything done relative to a directory descriptor reached without following a link (`_descend`), so that a
link planted in a table's place leads no read, write or delete elsewhere."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import uuid
from pathlib import Path
from typing import Callable

from .paths import local_path

# How a file a client wrote is opened: never through a link, and without waiting (opening a FIFO for reading
# waits for a writer, for good; a lease another process holds makes an open wait too): a thread that waits there
# holds up every commit's files.
_CLIENTS_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

# A file to make durable: (uri, data), or (uri, data, source, within).
# - `source`, a file beside it (same directory), may hold `data` already (Lance's staged manifest): then it is
#   renamed into place instead, its bytes checked first; in any case it is gone once `uri` is in place.
# - `within`, the table's place: locally, the file's directory is then reached from it without following a link
#   (`_directory`), and everything is done relative to that directory (a link planted in a table's
#   directory leads neither the write nor the rename elsewhere).
FileWrite = tuple[str, bytes] | tuple[str, bytes, str | None, str | None]


def file_write(entry: FileWrite) -> tuple[str, bytes, str | None, str | None]:
    """(uri, data, source, within) of a FileWrite of either form."""
    return (*entry, None, None)[:4]


def write_durably(batches: list[list[FileWrite]], put_object: Callable[[str, bytes], None]) -> list[Exception | None]:
    """Each caller's files made durable (None), or the exception that stopped them (the others go on): local
    files all written first and fsynced after, each directory once (see `FileIO.write_many`); `put_object`
    writes an object-store file."""
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
                    _stage(put_object, i, entry, places, opened, staged)
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


def _stage(put_object: Callable[[str, bytes], None], i: int, entry: FileWrite, places: dict, opened: list[int],
           staged: list) -> None:
    """Start one file of caller `i`: adopt its source, or write a temp file (fsynced and renamed later)."""
    uri, data, source_uri, within_uri = file_write(entry)
    path = local_path(uri)
    if path is None:
        put_object(uri, data)
        return
    parent, name = os.path.split(path)
    within = local_path(within_uri) if within_uri else None
    key = (parent, within)
    if key not in places:
        places[key] = _directory(parent, within, opened)
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


def _adopt(source: str, data: bytes, dir_fd: int | None = None) -> int | None:
    """An open descriptor of `source` if it can become the file that holds `data` instead of a copy: a plain file
    (no link, no other name) of this process's own user (a copy written here would be no better guarded), holding
    exactly `data`, and made readable to all as a copy would be (0644). None otherwise: write the bytes."""
    try:
        fd = os.open(source, _CLIENTS_FILE, dir_fd=dir_fd)
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


def put_if_absent(directory: str, files: list[tuple[str, bytes]], within: str) -> tuple[int, bool]:
    """Create the files `(name, data)` in `directory` (a full path in the place `within`, reached without following
    a link below it), in order, each only where no file is yet, and durably: how many of them now hold their data
    (written here, or held it already), and whether the next one held other bytes (left intact, and none after
    it written). Atomic per file: a temp file is written and fsynced, then linked to its name, which fails if the
    name exists, so nothing is ever written over. The temp files are fsynced before any is linked (on ext4 the
    first fsync commits the journal for all), and the directory once after the links."""
    opened: list[int] = []
    temps: list[str] = []
    try:
        dir_fd = _directory(directory, within, opened)
        for name, data in files:
            tmp = f".{name}.{uuid.uuid4().hex}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
            temps.append(tmp)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        done, refused = 0, False
        for (name, data), tmp in zip(files, temps):
            try:
                os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except FileExistsError:
                if not _holds(name, data, dir_fd):
                    refused = True
                    break
            done += 1
        os.fsync(dir_fd)
        return done, refused
    finally:
        for tmp in temps:
            _quietly(functools.partial(os.unlink, dir_fd=dir_fd), tmp)
        for fd in opened:
            os.close(fd)


def _holds(name: str, data: bytes, dir_fd: int) -> bool:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        return stat.S_ISREG(st.st_mode) and st.st_size == len(data) and os.pread(fd, len(data) + 1, 0) == data
    finally:
        os.close(fd)
