"""Reading a catalog-managed Delta table's log: the commits a conversion applies, or the whole snapshot it rebuilds
from (PROTOCOL.md "Delta Log Entries", "Checkpoints", "Action Reconciliation"; the catalogManaged RFC).

A version the catalog has ratified but the writer has not yet published (backfilled) lives only in its staged
commit, `_delta_log/_staged_commits/<file_name>`, whose name the catalog's commit log holds; a published version
is `_delta_log/<v>.json` (and its staged file may be gone). So each version is looked for where it is, staged
first: once published the two hold the same actions (version 0, the create, is only `_delta_log/0.json`). A
snapshot starts from the last checkpoint at or below the version (`_last_checkpoint`; classic single-file or
multi-part Parquet checkpoints) and replays the commits after it. Everything is read through the service's file
IO, from within the table's location.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import orjson

from storage import errors as storage_errors
from storage.files import join

from .schema import Refusal


class LogGap(Exception):
    """A version the conversion needs cannot be read (its file is gone, cleaned up by log retention): an
    incremental conversion falls back to rebuilding from the snapshot, which reads a checkpoint instead."""


def log_name(version: int) -> str:
    return f"{version:020d}.json"


def parse_actions(data: bytes, where: str) -> list[dict[str, Any]]:
    """A commit file's actions (newline-delimited JSON objects)."""
    actions = []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            action = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise Refusal(f"{where} is not a Delta commit file: {exc}") from None
        if isinstance(action, dict):
            actions.append(action)
    return actions


def commit_timestamp(actions: list[dict]) -> int | None:
    """The commit's time: its in-commit timestamp (catalog-managed tables always have one), else commitInfo's."""
    for action in actions:
        info = action.get("commitInfo")
        if isinstance(info, dict):
            value = info.get("inCommitTimestamp", info.get("timestamp"))
            return value if isinstance(value, int) else None
    return None


@dataclass
class Snapshot:
    """A table version's state: its live files (`add` actions by path), metaData and protocol, and its time."""

    version: int
    files: dict[str, dict] = field(default_factory=dict)
    metadata: dict | None = None
    protocol: dict | None = None
    timestamp: int | None = None

    def apply(self, version: int, actions: list[dict]) -> None:
        for action in actions:
            if "add" in action and isinstance(action["add"], dict):
                self.files[action["add"]["path"]] = action["add"]
            elif "remove" in action and isinstance(action["remove"], dict):
                self.files.pop(action["remove"].get("path"), None)
            elif "metaData" in action:
                self.metadata = action["metaData"]
            elif "protocol" in action:
                self.protocol = action["protocol"]
        self.version = version
        self.timestamp = commit_timestamp(actions) or self.timestamp


class DeltaLog:
    """One table's log as a conversion reads it (`files`: the service's file IO, used from a worker's thread)."""

    def __init__(self, files, location: str, staged: dict[int, str]):
        self.files = files
        self.location = location.rstrip("/")
        self.staged = staged   # ratified versions -> staged commit file names (tried before the published copy)
        self.log = join(self.location, "_delta_log")

    def _read(self, uri: str) -> bytes | None:
        try:
            return self.files.read_within_sync(uri, self.location)
        except (storage_errors.FileMissing, FileNotFoundError):
            return None
        except storage_errors.FileRefused as exc:
            raise Refusal(f"{uri} cannot be read: {exc}") from None

    def commit(self, version: int) -> list[dict]:
        """The actions of `version`, staged or published; LogGap if neither file is there."""
        candidates = [join(self.log, log_name(version))]
        if version in self.staged:
            candidates.insert(0, join(self.log, "_staged_commits", self.staged[version]))
        for uri in candidates:
            data = self._read(uri)
            if data is not None:
                return parse_actions(data, uri)
        raise LogGap(f"version {version} of the Delta log is gone ({', '.join(candidates)})")

    def snapshot(self, version: int) -> Snapshot:
        """The table at `version`: the last checkpoint at or below it, then the commits after it."""
        snap = self._checkpoint(version) or Snapshot(-1)
        for v in range(snap.version + 1, version + 1):
            snap.apply(v, self.commit(v))
        return snap

    def _checkpoint(self, version: int) -> Snapshot | None:
        raw = self._read(join(self.log, "_last_checkpoint"))
        if raw is None:
            return None
        try:
            last = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        at, parts = last.get("version"), last.get("parts")
        if not isinstance(at, int) or at > version:
            return None   # (a checkpoint above the wanted version: replay from the start, which must be there)
        names = ([f"{at:020d}.checkpoint.parquet"] if not parts else
                 [f"{at:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)])
        snap = Snapshot(at)
        for name in names:
            data = self._read(join(self.log, name))
            if data is None:
                return None   # a V2 checkpoint (UUID-named, with sidecars), or gone: replay from the start
            for action in _checkpoint_actions(data):
                snap.apply(at, [action])
        return snap


def _checkpoint_actions(data: bytes) -> list[dict]:
    """A Parquet checkpoint's actions, as the JSON commit files spell them (maps as objects, no nulls)."""
    import pyarrow.parquet as pq
    table = pq.read_table(io.BytesIO(data), columns=None)
    wanted = [c for c in ("add", "metaData", "protocol") if c in table.column_names]
    actions = []
    for row in table.select(wanted).to_pylist():
        for kind in wanted:
            if row.get(kind) is not None:
                actions.append({kind: _plain(row[kind])})
    return actions


def _plain(value: Any) -> Any:
    """Parquet's maps (lists of key/value pairs) as dicts, nulls dropped, throughout."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list) and value and all(isinstance(x, tuple) and len(x) == 2 for x in value):
        return {k: _plain(v) for k, v in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
