"""What a Lance table keeps in its location, by name: manifest names and URIs, the paths Lance speaks, and which
files in a table's place are Lance's own. Pure functions, no I/O (files.py reads and writes by these names).

Paths. Lance speaks in object-store paths without a scheme ("tmp/wh/t.lance/_versions/1.manifest": relative to
the root of a local filesystem, or to the bucket on S3); the coordinator keeps full URIs. `object_path` and
`resolve_path` translate at the protocol edge, relative to the table's own location so a client can never point
us at a file outside the table.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

from storage.files import join, local_path, to_local_path, unsafe_location

from ..errors import BadRequest

U64_MAX = 2**64 - 1
NAMING_SCHEMES = ("V1", "V2")
VERSIONS_DIR = "_versions"
MANIFEST_MAGIC = b"LANC"  # the last four bytes of every Lance manifest (and data) file
_FINAL_NAME = re.compile(r"^(\d+)\.manifest$")


def show(ident: list[str] | tuple[str, ...]) -> str:
    return ".".join(ident)


# -- manifest names ----------------------------------------------------------------------------------------------


def manifest_name(version: int, scheme: str) -> str:
    """V1: `{version}.manifest`; V2: `{u64::MAX - version}.manifest`, zero-padded to 20 digits so that a
    lexicographic listing finds the latest first (spec: ManifestNamingScheme)."""
    if scheme == "V1":
        return f"{version}.manifest"
    return f"{U64_MAX - version:020d}.manifest"


def version_of_manifest_name(name: str) -> tuple[int, str] | None:
    """(version, scheme) for a final manifest file name, None for anything else (staging files, hints)."""
    m = _FINAL_NAME.match(name)
    if not m:
        return None
    digits = m.group(1)
    n = int(digits)
    if len(digits) == 20 and n > U64_MAX // 2:
        return U64_MAX - n, "V2"
    return n, "V1"


def is_staged(uri: str) -> bool:
    """Whether a version's manifest_path names a staging file, the server's to remove once the final manifest is
    written; a final manifest name the client handed in is the client's own file and stays."""
    return version_of_manifest_name(uri.rpartition("/")[2]) is None


def infer_scheme(staging_name: str, version: int) -> str | None:
    for scheme in NAMING_SCHEMES:
        if staging_name.startswith(manifest_name(version, scheme)):
            return scheme
    return None


# -- paths -----------------------------------------------------------------------------------------------------


def _store_root(location: str) -> tuple[str, str]:
    """(scheme, bucket) of the object store a location lives in; bucket is "" for local files."""
    if local_path(location) is not None:
        return "file", ""
    p = urlparse(location)
    return p.scheme, p.netloc


def object_path(uri: str) -> str:
    """The object-store path Lance expects for a URI: no scheme, no bucket, no leading slash."""
    local = to_local_path(uri)
    if local is not None:
        return str(local).lstrip("/")
    return urlparse(uri).path.lstrip("/")


def resolve_path(location: str, path: str) -> str:
    """The URI for a path a client sent: an object-store path (as pylance sends) or a full URI. A path that some
    reader would resolve elsewhere than its text says (`..%2f`, `%5c`, a `..` segment: `unsafe_location`) is
    refused here, before anything reads or deletes by it."""
    if not path:
        raise BadRequest(f"invalid path: {path!r}")
    unsafe = unsafe_location(path)
    if unsafe is not None:
        raise BadRequest(f"path {path[:300]!r} is refused: {unsafe}")
    if "://" in path:
        return path
    scheme, bucket = _store_root(location)
    if scheme == "file":
        return Path("/" + path.lstrip("/")).as_uri()
    return f"{scheme}://{bucket}/{path.lstrip('/')}"


def versions_dir(location: str) -> str:
    return join(location, VERSIONS_DIR)


def manifest_uri(location: str, version: int, scheme: str) -> str:
    return join(location, VERSIONS_DIR, manifest_name(version, scheme))


# -- what a drop deletes ---------------------------------------------------------------------------------------

# Lance's own names in a table's location (the dataset layout, as Lance writes it): the directories only Lance
# writes, its data files (`.lance` files in `data/`), a legacy V1 pointer, and each branch's (`tree/<branch>/`)
# layout again.
_OWN_DIRECTORIES = frozenset({VERSIONS_DIR, "_transactions", "_deletions", "_indices", "_refs"})
_BRANCHES_DIR = "tree"


def is_lances(relative: str) -> bool:
    """Whether a path relative to a table's location names one of Lance's own files there."""
    parts = relative.split("/")
    while len(parts) > 2 and parts[0] == _BRANCHES_DIR:
        parts = parts[2:]
    if parts[0] in _OWN_DIRECTORIES:
        return len(parts) > 1
    if parts[0] == "data":
        return len(parts) > 1 and parts[-1].endswith(".lance")
    return parts == ["_latest.manifest"]


def own_files_claim(location: str) -> str:
    """What a drop's claim names (`PurgeClaim.metadata_location`) when it deletes only Lance's own files: the
    table's `_versions/` directory, a trailing `/` telling it from a metadata file (coordinator/purges.py)."""
    return versions_dir(location) + "/"


def staged_ahead(relative: str) -> bool:
    """One of Lance's own files, but no final manifest: what a writer puts in a table's place before the table
    has a version (data files, a staged manifest), e.g. to declare it and create its first version in one batch."""
    if not is_lances(relative) or relative == "_latest.manifest":
        return False
    directory, _, name = relative.rpartition("/")
    return not (directory.endswith(VERSIONS_DIR) and version_of_manifest_name(name) is not None)
