"""An Iceberg table's (or view's) in-memory state, as its actor holds it: value types, the serialized metadata
kept with them, and the table row's form of it (`row_state`, `expand`).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from storage.records import TableRow, join_namespace, split_namespace

from coordinator.errors import Unavailable

@dataclass(frozen=True)
class TableIdent:
    catalog: str                # the REST `{prefix}`, "" when none
    namespace: tuple[str, ...]
    name: str

    @property
    def ns_path(self) -> str:
        return join_namespace(self.namespace)

    def __str__(self) -> str:
        return ".".join([*self.namespace, self.name])

    # Between cluster members (coordinator/cluster/wire.py): three plain values (as a dataclass, its namespace
    # would cross as a tuple with its own type head, inside a dict of field names).
    def _to_wire(self) -> list:
        return [self.catalog, list(self.namespace), self.name]

    @classmethod
    def _from_wire(cls, state: list) -> "TableIdent":
        catalog, namespace, name = state
        return cls(catalog, tuple(namespace), name)


# The metadata lists that grow with every commit. Their JSON is kept between commits and extended by appending
# only the new entries, so a commit to a table with 10,000 snapshots copies bytes instead of re-serializing them.
GROWING_LISTS = ("snapshots", "snapshot-log")


def _extends(new: list, old: list) -> bool:
    """Whether `new` is `old` with entries appended. These lists are only ever appended to or filtered in order
    (remove-snapshots, snapshot-log reconciliation), never reordered, and entries are copied on write, never
    edited: so if `new[n-1]` is the very object `old[n-1]`, nothing before it was removed and `new[:n]` holds
    exactly `old`'s objects. An O(1) test instead of comparing 10,000 entries."""
    n = len(old)
    return n > 0 and len(new) > n and new[n - 1] is old[n - 1] and new[0] is old[0]


def _list_parts(new: list, cached: tuple[list, memoryview] | None) -> list:
    """The JSON of a growing list as parts for one join: the previous commit's bytes (a view into its metadata
    file, not a copy) plus the new entries, or the whole list serialized."""
    if cached is not None:
        old, old_json = cached
        if new is old:
            return [old_json]
        if _extends(new, old):
            return [old_json[:-1], b",", orjson.dumps(new[len(old):])[1:]]
    return [orjson.dumps(new)]


def serialize_metadata(metadata: dict[str, Any], previous: "IcebergTable | None") -> tuple[bytes, dict]:
    """The metadata file's bytes, plus where each growing list's JSON lies in them, kept for the next commit.
    Lists are shared with the previous state by copy-on-write, so identity tells which entries are old. The file
    is assembled in one join: the cost of a commit to a table with 10,000 snapshots is one copy of its bytes."""
    lists = [k for k in GROWING_LISTS if isinstance(metadata.get(k), list) and metadata[k]]
    if not lists:
        return orjson.dumps(metadata), {}
    head = orjson.dumps({k: v for k, v in metadata.items() if k not in lists})
    parts: list = [head[:-1]]
    spans: dict[str, tuple[int, int]] = {}
    size = len(head) - 1
    for i, key in enumerate(lists):
        label = (b"," if i or len(head) > 2 else b"") + b'"' + key.encode() + b'":'
        parts.append(label)
        size += len(label)
        start = size
        for part in _list_parts(metadata[key], previous.list_json.get(key) if previous is not None else None):
            parts.append(part)
            size += len(part)
        spans[key] = (start, size)
    parts.append(b"}")
    data = b"".join(parts)
    view = memoryview(data)
    return data, {key: (metadata[key], view[a:b]) for key, (a, b) in spans.items()}



@dataclass(frozen=True)
class IcebergTable:
    """A table's in-memory state: its current metadata, where it was written, and its serialized JSON (kept so
    loads never re-serialize). `list_json` holds the JSON of the growing lists for the next commit.
    `owns_location`: the table lives in the directory the service gave it at creation and never left it, so
    nothing but its own files can be there (a purge deletes the whole tree; see DropTable). `rebased`: the
    manifest lists this actor wrote for appends it rebased, newest first, as (path, manifests) (rebase.py), so the
    next appends rebase onto them without reading them back; a cache like `list_json`, kept only by the owner."""

    ident: TableIdent
    metadata: dict[str, Any]
    metadata_location: str
    metadata_json: bytes
    list_json: dict[str, tuple[list, memoryview]] = field(default_factory=dict, compare=False, repr=False)
    owns_location: bool = field(default=False, compare=False)
    rebased: tuple = field(default=(), compare=False, repr=False)

    # Between cluster members (coordinator/cluster/wire.py) the JSON bytes are the compact form, and `list_json`
    # and `rebased` (caches for the owner's next commit) stay behind.
    def _to_wire(self) -> list:
        return [self.ident, self.metadata_location, self.metadata_json, self.owns_location]

    @classmethod
    def _from_wire(cls, state: list) -> "IcebergTable":
        ident, metadata_location, metadata_json, owns_location = state
        return _received_table(ident, metadata_location, metadata_json, bool(owns_location))

    @property
    def etag(self) -> str:
        """Each metadata file is written once, so its location identifies the content."""
        return '"' + hashlib.sha256(self.metadata_location.encode()).hexdigest()[:32] + '"'

    def refs_only(self) -> "IcebergTable":
        """`snapshots=refs`: only snapshots referenced by a branch or tag; the snapshot-log stays whole."""
        keep = {ref["snapshot-id"] for ref in self.metadata.get("refs", {}).values()}
        meta = {**self.metadata, "snapshots": [s for s in self.metadata.get("snapshots", [])
                                               if s["snapshot-id"] in keep]}
        return IcebergTable(self.ident, meta, self.metadata_location, orjson.dumps(meta),
                            owns_location=self.owns_location)


class _ReceivedTable(IcebergTable):
    """A table state that came from another member: its dict is parsed from the bytes only if something asks for
    it. A forwarded commit is answered with the bytes alone, and parsing them anyway was ~5% of a member's CPU."""

    @functools.cached_property
    def metadata(self) -> dict[str, Any]:  # type: ignore[override]
        return orjson.loads(self.metadata_json)


def _received_table(ident: TableIdent, metadata_location: str, metadata_json: bytes,
                    owns_location: bool = False) -> IcebergTable:
    table = object.__new__(_ReceivedTable)
    for name, value in (("ident", ident), ("metadata_location", metadata_location), ("metadata_json", metadata_json),
                        ("list_json", {}), ("owns_location", owns_location), ("rebased", ())):
        object.__setattr__(table, name, value)
    return table



def ident_of(row: TableRow) -> TableIdent:
    return TableIdent(row.catalog, split_namespace(row.namespace), row.name)


def expand(row: TableRow, data: bytes) -> IcebergTable:
    """A table's state from its row and the bytes of its current metadata file (read, or kept while idle)."""
    return IcebergTable(ident_of(row), orjson.loads(data), row.state["metadata-location"], data,
                        owns_location=row.state.get(OWN_LOCATION) is True)


OWN_LOCATION = "own-location"   # in a table row's state: IcebergTable.owns_location (absent: False)


def row_state(metadata_location: str, owns_location: bool) -> dict[str, Any]:
    return {"metadata-location": metadata_location, **({OWN_LOCATION: True} if owns_location else {})}


@dataclass(frozen=True)
class UnreadableTable:
    """A table whose current metadata file is gone or not JSON (removed or damaged behind the catalog's back). It
    cannot be loaded or committed to until the file is restored, but it can be dropped: otherwise nothing, not
    even its namespace, could ever be removed through the API."""

    ident: TableIdent
    metadata_location: str
    reason: str

    def refuse(self) -> Unavailable:
        # (reload: the actor reads the file again before a later request, so a restored file serves at once)
        return Unavailable(f"table {self.ident}'s metadata file {self.metadata_location} cannot be read "
                           f"({self.reason}): restore the file, or drop the table", retry_after_s=30, reload=True)
