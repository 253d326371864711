"""Which files only expired snapshots referenced: their manifest lists, and the manifests, data and delete files
that no retained snapshot, branch or tag reaches (Java's `ReachableFileCleanup`). Blocking: run on worker
threads.

Memory stays bounded for tables of many manifests: every Avro file is read as a stream of records, one file at a
time, and only paths are kept: the manifests the retained snapshots name (one string each), and the candidates.

Nothing is ever deleted that a retained snapshot might reference. If a retained snapshot's manifest list or
manifest cannot be read (missing, outside the table's location, not Avro), what it references is unknown: the
plan then deletes nothing (`Unknowable`). Paths in metadata are the client's word: only files within the table's
location are read as candidates and deleted.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator

import fastavro

from storage.errors import FileMissing
from storage.files import is_within

from .files import _read, _Unreadable

log = logging.getLogger(__name__)

DELETED = 2   # a manifest entry's status: the file was removed by that manifest's snapshot


class Unknowable(Exception):
    """What a retained snapshot references cannot be read: nothing may be deleted."""


def _avro(files, location: str, uri: str, *, required: bool) -> Iterator[dict]:
    """The records of a manifest list or manifest. `required` (a retained snapshot's file): any failure to read
    it raises Unknowable; otherwise (an expired snapshot's: a candidate) a missing or unreadable file names
    nothing (an interrupted deletion removed it, after what it names)."""
    if not (isinstance(uri, str) and is_within(location, uri)):
        if required:
            raise Unknowable(f"{uri!r} lies outside the table's location {location}")
        return
    try:
        data = _read(files, uri, location)
        reader = fastavro.reader(io.BytesIO(data))
        for record in reader:
            if isinstance(record, dict):
                yield record
    except (FileMissing, _Unreadable) as exc:
        if required:
            raise Unknowable(f"{uri} cannot be read ({type(exc).__name__}: {exc})") from None
    except Exception as exc:   # noqa: BLE001 - any fault of the bytes
        if required:
            raise Unknowable(f"{uri} is not a readable Avro file ({exc})") from None
        log.warning("expiry clean-up: %s is not Avro (%s); the files it names stay", uri, exc)


def _live_paths(files, location: str, manifest: str, *, required: bool) -> Iterator[str]:
    for entry in _avro(files, location, manifest, required=required):
        if entry.get("status") == DELETED:
            continue
        path = (entry.get("data_file") or {}).get("file_path")
        if isinstance(path, str):
            yield path


class ManifestLists:
    """What each manifest list names (its manifests) and each retained manifest holds live (its data and delete
    files), kept for the next expiry of the table: these files never change, and every expiry would otherwise read
    all the snapshots it keeps again. Bounded by the paths held, least recently used out first; shared by the
    worker threads. Only what a retained snapshot's file was read to say is kept (an expired snapshot's file
    that could not be read names nothing, which is no answer to keep)."""

    def __init__(self, max_paths: int = 200_000):
        self.max_paths = max_paths
        self._held: OrderedDict[tuple[bool, str], tuple[str, ...]] = OrderedDict()
        self._paths = 0
        self._lock = threading.Lock()

    def manifests(self, files, location: str, manifest_list: str, *, required: bool) -> tuple[str, ...]:
        """The manifests `manifest_list` names."""
        return self._read(False, manifest_list, required, lambda: (
            p for p in (r.get("manifest_path") for r in _avro(files, location, manifest_list, required=required))
            if isinstance(p, str)))

    def live(self, files, location: str, manifest: str, *, required: bool) -> tuple[str, ...]:
        """The data and delete files `manifest` holds live (not removed by its snapshot)."""
        return self._read(True, manifest, required, lambda: _live_paths(files, location, manifest,
                                                                         required=required))

    def _read(self, kind: bool, uri: str, required: bool, read) -> tuple[str, ...]:
        key = (kind, uri)
        with self._lock:
            found = self._held.get(key)
            if found is not None:
                self._held.move_to_end(key)
                return found
        paths = tuple(read())
        if not required:
            return paths
        with self._lock:
            if key not in self._held and len(paths) <= self.max_paths:
                self._held[key] = paths
                self._paths += len(paths)
                while self._paths > self.max_paths:
                    _, gone = self._held.popitem(last=False)
                    self._paths -= len(gone)
        return paths

    def forget(self, uri: str) -> None:
        """`uri` is deleted: nothing will name it again."""
        with self._lock:
            for key in ((False, uri), (True, uri)):
                gone = self._held.pop(key, None)
                if gone is not None:
                    self._paths -= len(gone)


@dataclass
class Plan:
    """The files a claim deletes, as checked against the retained snapshots seen so far (`protect` checks
    snapshots committed since). In deletion order: content files, then manifests, then manifest lists, so that a
    deletion cut short and planned again from the same manifest lists still finds what is left."""

    location: str
    content: dict[str, None] = field(default_factory=dict)
    manifests: dict[str, None] = field(default_factory=dict)
    manifest_lists: dict[str, None] = field(default_factory=dict)
    seen_lists: set[str] = field(default_factory=set)       # retained manifest lists checked
    seen_manifests: set[str] = field(default_factory=set)   # the manifests they name
    cpu_s: float = 0.0
    lists: ManifestLists = field(default_factory=ManifestLists)

    @property
    def files(self) -> list[str]:
        return [*self.content, *self.manifests, *self.manifest_lists]

    def next_chunk(self, done: set[str], size: int) -> list[str]:
        """Up to `size` files not `done` yet, all of one kind: content files before manifests before manifest
        lists, each deleted only once none of what names it is left to read."""
        for kind in (self.content, self.manifests, self.manifest_lists):
            chunk = [f for f in kind if f not in done][:size]
            if chunk:
                return chunk
        return []

    def protect(self, files, retained_lists: list[str]) -> None:
        """Take out of the plan whatever the retained snapshots' manifest lists (those not seen before) reach."""
        start = time.thread_time()
        try:
            new_manifests: list[str] = []
            for ml in retained_lists:
                if ml in self.seen_lists:
                    continue
                self.manifest_lists.pop(ml, None)
                for path in self.lists.manifests(files, self.location, ml, required=True):
                    if path not in self.seen_manifests:
                        self.seen_manifests.add(path)
                        new_manifests.append(path)
                        self.manifests.pop(path, None)
                self.seen_lists.add(ml)
            if self.content:
                for manifest in new_manifests:
                    for path in self.lists.live(files, self.location, manifest, required=True):
                        self.content.pop(path, None)
        finally:
            self.cpu_s += time.thread_time() - start


def plan(files, location: str, expired_lists: list[str], retained_lists: list[str],
         lists: ManifestLists | None = None) -> Plan:
    """What only the expired snapshots' manifest lists reach, checked against the retained snapshots' lists
    (`lists`: what earlier plans read of them)."""
    start = time.thread_time()
    p = Plan(location, lists=lists or ManifestLists())
    retained = set(retained_lists)
    for ml in expired_lists:
        if ml in retained or not is_within(location, ml):
            continue
        p.manifest_lists[ml] = None
        p.manifests.update(dict.fromkeys(p.lists.manifests(files, location, ml, required=False)))
    # The manifests still referenced first (the newest snapshot's list names most of them), then the content
    # files of those that are not: only those need the retained manifests read.
    for ml in retained_lists:
        if ml in p.seen_lists:
            continue
        for path in p.lists.manifests(files, location, ml, required=True):
            p.seen_manifests.add(path)
            p.manifests.pop(path, None)
        p.seen_lists.add(ml)
    for manifest in list(p.manifests):
        if is_within(location, manifest):
            p.content.update(dict.fromkeys(_live_paths(files, location, manifest, required=False)))
        else:
            del p.manifests[manifest]
    if p.content:
        for manifest in p.seen_manifests:
            for path in p.lists.live(files, location, manifest, required=True):
                p.content.pop(path, None)
            if not p.content:
                break
    p.content = {path: None for path in p.content if is_within(location, path)}
    p.cpu_s += time.thread_time() - start
    return p
