"""Listing a table's manifests (to register an existing table): the directory-level file operation Lance needs
beyond storage.files.FileIO. Blocking; callers run it in a thread. It goes through FileIO's object-store client for
s3:// so credentials and endpoints are configured in one place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlparse

from storage.files import FileIO, join, to_local_path

from .table import VERSIONS_DIR, version_of_manifest_name


@dataclass(frozen=True)
class FoundManifest:
    version: int
    scheme: str
    uri: str
    size: int
    mtime_ms: int


def list_manifests(files: FileIO, location: str) -> list[FoundManifest]:
    """Final manifests in `<location>/_versions/`, ascending by version; staging files and hints are skipped.
    If one version exists under both naming schemes (a table migrated from V1), V2 wins, as in Lance."""
    found: dict[int, FoundManifest] = {}
    local = to_local_path(location)
    if local is not None:
        try:
            entries = list(os.scandir(local / VERSIONS_DIR))
        except (FileNotFoundError, NotADirectoryError):
            return []
        for entry in entries:
            parsed = version_of_manifest_name(entry.name)
            if parsed is None or not entry.is_file():
                continue
            st = entry.stat()
            _keep(found, FoundManifest(parsed[0], parsed[1], join(location, VERSIONS_DIR, entry.name), st.st_size,
                                       int(st.st_mtime * 1000)))
    else:
        import obstore
        store, key = files.object_store(location)
        prefix = key.rstrip("/") + f"/{VERSIONS_DIR}/"
        root = urlparse(location)
        for chunk in obstore.list(store, prefix=prefix):
            for meta in chunk:
                name = meta["path"].rsplit("/", 1)[-1]
                parsed = version_of_manifest_name(name)
                if parsed is None:
                    continue
                _keep(found, FoundManifest(parsed[0], parsed[1], f"{root.scheme}://{root.netloc}/{meta['path']}",
                                           int(meta["size"]), int(meta["last_modified"].timestamp() * 1000)))
    return [found[v] for v in sorted(found)]


def _keep(found: dict[int, FoundManifest], m: FoundManifest) -> None:
    if m.version not in found or m.scheme == "V2":
        found[m.version] = m

