"""The Iceberg metadata files the UniForm catalog serves, as it keeps them in memory: bytes only, never parsed on
the event loop, bounded by bytes.

- `Kept`: a metadata file's bytes and those of its `snapshots=refs` form (only the snapshots a branch or tag
  names), both made once, off the event loop: by the worker process for the service's own conversions
  (`conversion.Converted.refs_json`), on a worker thread (`Kept.parse`) for a file read back from storage (a
  writer's conversion, or the service's after a restart).
- `MetadataCache`: the file each table is served from now (an older one is never served again: one entry per
  table), the least recently used dropped first beyond its bytes in all. A file larger than them all is served
  and not kept.
- `ServedTable`: what a load is answered with (`api/iceberg/` writes `metadata_json` as it is, or the refs
  form); its dict is parsed only if something asks for it, and nothing on the load path does.
"""

from __future__ import annotations

import functools
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from coordinator.iceberg.state import IcebergTable, TableIdent


def refs_only_json(data: bytes) -> bytes:
    """The metadata JSON with only the snapshots a branch or tag references (Iceberg's `snapshots=refs`; the
    snapshot log stays whole), as `IcebergTable.refs_only` answers it; `data` itself if that is all of them."""
    metadata = orjson.loads(data)
    keep = {ref.get("snapshot-id") for ref in (metadata.get("refs") or {}).values()}
    snapshots = metadata.get("snapshots") or []
    kept = [s for s in snapshots if s.get("snapshot-id") in keep]
    if len(kept) == len(snapshots):
        return data
    return orjson.dumps({**metadata, "snapshots": kept})


@dataclass(frozen=True)
class Kept:
    location: str
    data: bytes
    refs: bytes   # `data` itself when every snapshot is referenced

    @property
    def size(self) -> int:
        return len(self.data) + (len(self.refs) if self.refs is not self.data else 0)

    @classmethod
    def parse(cls, location: str, data: bytes) -> "Kept":
        """A file read from storage, checked to be Iceberg table metadata (ValueError if it is not); blocking: run
        on a worker thread."""
        metadata = orjson.loads(data)
        if not isinstance(metadata, dict) or not isinstance(metadata.get("table-uuid"), str):
            raise ValueError("it holds no Iceberg table metadata")
        snapshots, refs = metadata.get("snapshots") or [], metadata.get("refs") or {}
        if not isinstance(snapshots, list) or not all(isinstance(s, dict) for s in snapshots) or \
                not isinstance(refs, dict) or not all(isinstance(r, dict) for r in refs.values()):
            raise ValueError("its snapshots or refs are not Iceberg's")
        return cls(location, data, refs_only_json(data))

    def table(self, ident: TableIdent) -> "ServedTable":
        return ServedTable.of(ident, self.location, self.data, self.refs)


class MetadataCache:
    """One `Kept` per table, least recently used dropped first beyond `max_bytes` in all."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.bytes = 0
        self._kept: OrderedDict[uuid.UUID, Kept] = OrderedDict()

    def get(self, table_id: uuid.UUID, location: str) -> Kept | None:
        kept = self._kept.get(table_id)
        if kept is None or kept.location != location:
            return None
        self._kept.move_to_end(table_id)
        return kept

    def put(self, table_id: uuid.UUID, kept: Kept) -> None:
        old = self._kept.pop(table_id, None)
        if old is not None:
            self.bytes -= old.size
        if kept.size > self.max_bytes:
            return
        self._kept[table_id] = kept
        self.bytes += kept.size
        while self.bytes > self.max_bytes:
            _, dropped = self._kept.popitem(last=False)
            self.bytes -= dropped.size

    def __len__(self) -> int:
        return len(self._kept)


class ServedTable(IcebergTable):
    """A Delta table's Iceberg metadata as loads are answered with it (see the module doc)."""

    refs_json: bytes

    @classmethod
    def of(cls, ident: TableIdent, location: str, data: bytes, refs: bytes) -> "ServedTable":
        table = object.__new__(cls)
        for name, value in (("ident", ident), ("metadata_location", location), ("metadata_json", data),
                            ("list_json", {}), ("owns_location", False), ("refs_json", refs)):
            object.__setattr__(table, name, value)
        return table

    @functools.cached_property
    def metadata(self) -> dict[str, Any]:  # type: ignore[override]
        return orjson.loads(self.metadata_json)

    def refs_only(self) -> "ServedTable":
        return ServedTable.of(self.ident, self.metadata_location, self.refs_json, self.refs_json)
