"""What a Lance table keeps in its location, as the coordinator reads and writes it: the staged manifests writers
hand in, the `_versions/` directory (listed to register a table, to see which versions Lance's own clean-up
removed, and to repair what a crash left at load), and the files a drop deletes. The names it goes by are
layout.py's.

All do I/O through storage.files.FileIO (a listing blocks: callers run it in a thread; it goes through FileIO's
object-store client for s3:// so credentials and endpoints are configured in one place).
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator
from urllib.parse import urlparse

import trio

from storage import errors as storage_errors
from storage.files import NOT_A_FILE, FileIO, join, local_path, to_local_path

from ..errors import from_storage
from .layout import (NAMING_SCHEMES, VERSIONS_DIR, is_lances, is_staged, manifest_uri, show, staged_ahead,
                     version_of_manifest_name)

if TYPE_CHECKING:
    from .state import LanceTable, TableVersion

log = logging.getLogger(__name__)

# -- reading -----------------------------------------------------------------------------------------------------


async def read_staged(files: FileIO, location: str, uri: str) -> bytes | None:
    """A staged manifest's bytes, made durable (it becomes the only copy of the version's manifest once the
    version is recorded); None if it does not exist (a link planted there is refused)."""
    try:
        return await files.read_durable(uri, within=location)
    except storage_errors.FileMissing:
        return None
    except storage_errors.FileRefused as exc:   # not a file, or reached through a link: the request's fault
        raise from_storage(exc) from None


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
            if parsed is None or not entry.is_file(follow_symlinks=False):   # (a link is no manifest of ours)
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


async def cleaned_up(files: FileIO, versions: list[TableVersion], latest: TableVersion | None) -> set[int]:
    """The versions among `versions` whose manifest is gone. Lance's `cleanup_old_versions` deletes old versions'
    manifests itself and tells the namespace nothing; a version that cannot be opened is none (lance's own
    directory namespace lists `_versions/` and shows only what is there). Cleanup never takes the latest
    version, so the commit path's `version/list` limit 1 costs no listing."""
    listed: dict[str, set[str]] = {}   # directory -> its names, listed once (all are usually `_versions/`)
    gone = set()
    for v in versions:
        if latest is not None and v.version >= latest.version:
            continue
        directory, _, name = v.manifest_uri.rpartition("/")
        if directory not in listed:
            listed[directory] = await files.names_in(directory)
        if name not in listed[directory]:
            gone.add(v.version)
    return gone


def own_files(files: FileIO, location: str, _named: str | None = None) -> list[str]:
    """Lance's own files in `location` (`is_lances`), as URIs: what a drop deletes where the client chose the
    table's location, which may hold other files too (purges.Listing). Blocking: a worker thread's."""
    return [uri for relative, uri, _ in _below(files, location) if is_lances(relative)]


def foreign_file(files: FileIO, location: str) -> str | None:
    """A file below `location` that is not one a Lance writer stages ahead of its table's first version (its data
    files, staged manifests: `staged_ahead`), if there is one: anything else, a final manifest, a link. A
    declared table's location must hold none. Blocking: a worker thread's."""
    local = local_path(location)
    if local is not None and os.path.lexists(local) and not os.path.isdir(local):
        return location
    return next((uri for relative, uri, link in _below(files, location) if link or not staged_ahead(relative)),
                None)


def _below(files: FileIO, location: str) -> Iterator[tuple[str, str, bool]]:
    """(path relative to `location`, URI, whether it is a link) of everything below `location` but directories,
    from a listing that follows no link (a link to a directory is listed, not entered)."""
    local = local_path(location)
    if local is None:
        import obstore
        store, key = files.object_store(location)
        prefix = key.rstrip("/") + "/"
        root = urlparse(location)
        for chunk in obstore.list(store, prefix=prefix):
            for meta in chunk:
                yield meta["path"][len(prefix):], f"{root.scheme}://{root.netloc}/{meta['path']}", False
        return
    for directory, dirs, names in os.walk(local):
        below = os.path.relpath(directory, local)
        for name in names + [d for d in dirs if os.path.islink(os.path.join(directory, d))]:
            relative = name if below == "." else f"{below}/{name}"
            yield relative, join(location, relative), os.path.islink(os.path.join(directory, name))


# -- repairs at load ---------------------------------------------------------------------------------------------


async def restore_final_manifests(files: FileIO, state: LanceTable) -> None:
    """A final manifest is written once its version is recorded, so a crash in between leaves a recorded
    version without it. Its staged manifest is gone only once the final one is in place (renamed into it, or
    removed after the copy), so it is still there: copy it back, from the latest version down to the first
    whose final manifest exists (earlier ones were written before that one). Without a matching staged copy
    the version is logged and the table served; a storage error fails the load instead, so that nothing is
    answered while a restorable file is missing."""
    for v in reversed(state.versions):
        # (a directory put in its place is not it, nor a link: only a file reached without following one)
        found = await files.size(v.manifest_uri, within=state.location)
        if found is not None and v.size in (None, found):
            return
        data = None
        if v.staging_uri not in (None, v.manifest_uri):   # a final name the client handed in has no copy
            try:
                data = await files.read(v.staging_uri, within=state.location)
            except (storage_errors.FileMissing, storage_errors.FileRefused):
                pass   # (gone, or not a file: a link, say)
        if data is None or len(data) != v.size or hashlib.sha256(data).hexdigest() != v.sha256:
            log.error("table %s: version %d's manifest %s is missing and %s holds no copy of it",
                      show(state.ident), v.version, v.manifest_uri, v.staging_uri)
            continue
        await files.write_many([(v.manifest_uri, data, None, state.location)])
        log.warning("table %s: restored version %d's manifest %s from %s", show(state.ident), v.version,
                    v.manifest_uri, v.staging_uri)
        if is_staged(v.staging_uri):   # as CreateVersion's clean-up
            try:
                await files.delete(v.staging_uri, within=state.location)
            except Exception as exc:
                log.warning("removing staged manifest %s failed: %s", v.staging_uri, exc)


async def unrecorded_manifests(files: FileIO, state: LanceTable, grace_s: float) -> list[str]:
    """Final manifests above the high-water mark, older than `grace_s`: never recorded. Ours are written only
    after their version is, but a client may put one there itself (a final name handed in as `manifest_path`)
    and its commit then be refused or lost (crash, database failure). Lance probes final paths before
    committing, so such a file would make every writer skip a version we then refuse. Empty when the table's
    place leads elsewhere (a link between the warehouse and it: the manifests found may be anyone's)."""
    orphans = []
    version = state.high_water + 1
    while True:
        ages = [(uri, await files.age_s(uri)) for uri in
                (manifest_uri(state.location, version, s) for s in NAMING_SCHEMES)]
        found = [(uri, age) for uri, age in ages if age is not None]
        if not found:
            break
        # A young one may be a writer's final name handed in as manifest_path, its version/create still on
        # its way: left for a later load (config.lance_unrecorded_grace_s).
        orphans += [uri for uri, age in found if age >= grace_s]
        version += 1
    if orphans:
        if await trio.to_thread.run_sync(files.leads_elsewhere, state.location):
            return []
    return orphans


async def remove_unrecorded(files: FileIO, state: LanceTable, uris: list[str]) -> None:
    for uri in uris:
        log.warning("removing manifest %s: its version was never recorded", uri)
        try:
            await files.delete(uri, within=state.location)
        except OSError as exc:
            if exc.errno not in NOT_A_FILE:
                raise
            # Reached through a link (the table's `_versions/`, say): not ours to delete, and no reason to
            # refuse to load the table either.
            log.warning("not removing %s: %s", uri, exc)
