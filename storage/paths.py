"""Table locations as text: what a URI names locally, one spelling per place (`location_key`), which places lie
within which, and what no client-given location may hold. Pure functions, no file system access."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse


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


# What no location or file path a client gives may hold, raw or percent-encoded: control characters (URL parsers
# drop tabs and newlines, the OS cannot open a NUL), backslashes (WHATWG URL parsers, Rust's `url` among them, read
# them as `/` in file:// URIs), `?` and `#` (a query or fragment would cut the path short), encoded `.` or `/`
# (`%2e%2e` is a `..` segment to some readers and a plain name to others, `..%2f` a name to the text and a step
# up to whoever decodes it), and `.` or `..` segments (the text resolves `x/..` before the link `x`, the kernel
# after it). Refusing them means that every reader of a location, our file I/O, the kernel and every client,
# resolves it to the same place.
_UNSAFE_IN_LOCATION = re.compile(r"[\x00-\x1f\x7f\\?#]|%(?:[01][0-9a-f]|7f|2e|2f|5c|3f|23)|(?:^|/)\.\.?(?:/|$)",
                                 re.IGNORECASE)


def unsafe_location(uri: str) -> str | None:
    """Why a client-given location or file path is refused whatever the root (see `_UNSAFE_IN_LOCATION`), or
    None."""
    m = _UNSAFE_IN_LOCATION.search(uri)
    if m is not None:
        return (f"it holds {m.group()!r}: locations and paths cannot hold control characters, backslashes, '?' or "
                f"'#', '.' or '..' segments, nor percent-encode '.', '/', '\\\\', '?', '#' or control characters")
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
