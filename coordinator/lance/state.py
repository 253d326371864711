"""A Lance table's in-memory state (the table actor's): its location and its version list (the external manifest
store), and how it is built from its table row and commit log and written back to the row.

Immutable values, so a commit rule can build the next state without touching the current one, and so the actor
can hand a snapshot to readers.
"""

from __future__ import annotations

import bisect
import itertools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from storage.records import LogEntry, TableRow, split_namespace

from .layout import object_path

INT64_MAX = 2**63 - 1   # a version number, as the commit log stores it


@dataclass(frozen=True)
class TableRef:
    """What a table's name stands for (coordinator/names.py caches it). A Lance table is never renamed, so (id,
    location) is fixed for the row's life."""

    table_id: uuid.UUID
    location: str


def in_ranges(version: int, ranges: list[tuple[int, int]]) -> bool:
    """Whether `version` is in one of the [start, end) ranges of a version delete (end -1: through the latest)."""
    return any(version >= start and (end < 0 or version < end) for start, end in ranges)


@dataclass(frozen=True)
class TableVersion:
    """One committed version: where its final manifest is, and what the commit that made it carried (so that
    a resubmission of the same commit can be recognised and answered again instead of refused)."""

    version: int
    manifest_uri: str
    size: int | None
    timestamp_ms: int
    scheme: str = "V2"
    staging_uri: str | None = None
    sha256: str | None = None
    e_tag: str | None = None
    metadata: dict[str, str] | None = None

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {"manifest": self.manifest_uri, "size": self.size, "ts": self.timestamp_ms,
                               "scheme": self.scheme}
        for key, value in (("staging", self.staging_uri), ("sha256", self.sha256), ("e_tag", self.e_tag),
                           ("metadata", self.metadata)):
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_payload(cls, version: int, p: dict[str, Any]) -> "TableVersion":
        return cls(version, p["manifest"], p.get("size"), p.get("ts", 0), p.get("scheme", "V2"), p.get("staging"),
                   p.get("sha256"), p.get("e_tag"), p.get("metadata"))

    def to_spec(self) -> dict[str, Any]:
        """The spec's TableVersion."""
        out: dict[str, Any] = {"version": self.version, "manifest_path": object_path(self.manifest_uri),
                               "timestamp_millis": self.timestamp_ms}
        if self.size is not None:
            out["manifest_size"] = self.size
        if self.e_tag is not None:
            out["e_tag"] = self.e_tag
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out


def _number(v: TableVersion) -> int:
    return v.version


class VersionLog(Sequence):
    """A table's versions, ascending, as an immutable sequence that successive states share. Appending to the
    newest state extends the one underlying list in place, where a tuple would copy every version on every
    commit (O(history): a table streamed into for a week has 100,000s). Each state sees only its own prefix, so
    older states stay as they were; appending to an older one (the actor goes back to it when a write is
    refused) copies its prefix first."""

    __slots__ = ("_items", "_n")

    def __init__(self, items=()) -> None:
        self._items: list[TableVersion] = list(items)
        self._n = len(self._items)

    def appended(self, version: TableVersion) -> VersionLog:
        items = self._items if len(self._items) == self._n else self._items[:self._n]
        items.append(version)
        new = VersionLog.__new__(VersionLog)
        new._items, new._n = items, self._n + 1
        return new

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._items[:self._n][i] if len(self._items) != self._n else self._items[i]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("version index out of range")
        return self._items[i]

    def __iter__(self):
        return itertools.islice(self._items, self._n)

    def __eq__(self, other) -> bool:
        return isinstance(other, VersionLog) and list(self) == list(other)

    # Between cluster members (coordinator/cluster/wire.py): its own prefix only.
    def _to_wire(self) -> list:
        return list(self)

    @classmethod
    def _from_wire(cls, items: list) -> "VersionLog":
        return cls(items)

    def __repr__(self) -> str:
        return f"VersionLog({self._n} versions)"


# A table's most recent versions kept in memory. Older ones stay in the commit log and are read from it when asked
# for (an old version's describe, a listing that reaches back): a table streamed into every few seconds has
# 100,000s of versions after weeks, ~650 bytes each in memory.
VERSIONS_KEPT = 1000
VERSIONS_KEPT_IDLE = 4   # while idle (registry.Compaction): the latest, and a few a late retry may resubmit


@dataclass(frozen=True)
class LanceTable:
    namespace: tuple[str, ...]
    name: str
    location: str
    properties: dict[str, str] = field(default_factory=dict)
    versions: VersionLog = field(default_factory=VersionLog)   # ascending by version: the latest ones
    high_water: int = 0                         # highest version ever recorded: numbers are never reused
    # Every recorded version from `log_below` on is in `versions`; those below it may be only in the commit log
    # (0: all are in memory). Deleting versions does not move it; trimming, idling and loading do.
    log_below: int = 0
    # Goes up with every version deletion, never back (loaded as the row's version, which every delete raised): a
    # count of log records made before it moved is stale (DeleteVersions).
    deletes: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.versions, VersionLog):
            object.__setattr__(self, "versions", VersionLog(self.versions))

    def trimmed(self) -> LanceTable:
        """This state with at most 2 x VERSIONS_KEPT versions in memory: over that, the latest VERSIONS_KEPT (so a
        table is trimmed once every VERSIONS_KEPT appends: O(1) per version). Called on the state a commit leaves,
        never between the operations of one batch, whose version deletes count against the batch's first state."""
        return self._latest(VERSIONS_KEPT) if len(self.versions) > 2 * VERSIONS_KEPT else self

    @property
    def complete(self) -> bool:
        """Whether `versions` holds every recorded version."""
        return self.log_below == 0

    def dormant(self) -> LanceTable:
        """What an idle table keeps in memory: its latest few versions; the rest is read back when asked for."""
        return self._latest(VERSIONS_KEPT_IDLE) if len(self.versions) > VERSIONS_KEPT_IDLE else self

    def _latest(self, n: int) -> LanceTable:
        """Only the latest `n` versions (n >= 1) in memory; the older ones are then in the commit log only."""
        kept = VersionLog(self.versions[-n:])
        return replace(self, versions=kept, log_below=kept[0].version)

    def covers(self, version: int) -> bool:
        """Whether `versions` tells if `version` is recorded."""
        return version >= self.log_below

    @property
    def ident(self) -> list[str]:
        return [*self.namespace, self.name]

    @property
    def latest(self) -> TableVersion | None:
        return self.versions[-1] if self.versions else None

    @property
    def only_declared(self) -> bool:
        """Declared but never committed: no data on storage that we know of."""
        return self.high_water == 0

    def find(self, version: int) -> TableVersion | None:
        i = bisect.bisect_left(self.versions, version, key=_number)
        if i < len(self.versions) and self.versions[i].version == version:
            return self.versions[i]
        return None

    def with_version(self, v: TableVersion, trim: bool = True) -> "LanceTable":
        if self.versions and v.version <= self.versions[-1].version:
            raise ValueError("versions are appended in order")
        new = replace(self, versions=self.versions.appended(v), high_water=max(self.high_water, v.version))
        return new.trimmed() if trim else new

    def without_ranges(self, ranges: list[tuple[int, int]]) -> tuple["LanceTable", int]:
        """The table without the versions in `ranges`, and how many of the versions in memory that removed."""
        kept = VersionLog(v for v in self.versions if not in_ranges(v.version, ranges))
        return replace(self, versions=kept, deletes=self.deletes + 1), len(self.versions) - len(kept)

    def page(self, after: int | None, limit: int | None, descending: bool) -> list[TableVersion] | None:
        """Up to `limit` versions after version `after` (below it when descending), found by bisection: a client
        asking for the latest version (`limit=1, descending`) costs the same at any length of history. None if
        the answer may hold versions older than those in memory (then the commit log answers)."""
        versions = self.versions
        if descending:
            end = len(versions) if after is None else bisect.bisect_left(versions, after, key=_number)
            start = 0 if limit is None else max(0, end - limit)
            if start == 0 and not self.complete and (limit is None or end - start < limit):
                return None
            return versions[start:end][::-1]
        if not self.covers(0 if after is None else after + 1):
            return None
        start = 0 if after is None else bisect.bisect_right(versions, after, key=_number)
        return versions[start:] if limit is None else versions[start:start + limit]

    def row_state(self) -> dict[str, Any]:
        """The small JSON kept in the table row; the versions themselves are the commit log."""
        return {"properties": self.properties, "high_water": self.high_water}


def log_entries_to_load() -> int:
    """How many of a table's latest commit-log entries a load reads: the latest VERSIONS_KEPT versions, and one
    more that tells whether there are older ones."""
    return VERSIONS_KEPT + 1


def from_row(row: TableRow, entries: list[LogEntry]) -> LanceTable:
    """The state of a table from its row and its latest commit-log entries (newest first, as loaded)."""
    versions = [TableVersion.from_payload(e.version, e.payload) for e in reversed(entries[:VERSIONS_KEPT])]
    high = max(int(row.state.get("high_water", 0)), versions[-1].version if versions else 0)
    return LanceTable(split_namespace(row.namespace), row.name, row.location or "",
                      dict(row.state.get("properties") or {}), versions, high,
                      log_below=versions[0].version if len(entries) > VERSIONS_KEPT else 0,
                      deletes=row.row_version)


def from_log(entries: list[LogEntry]) -> list[TableVersion]:
    """Versions read back from the commit log (older than those in memory)."""
    return [TableVersion.from_payload(e.version, e.payload) for e in entries]
