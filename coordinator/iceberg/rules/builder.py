"""The change set being applied: Java's `TableMetadata.Builder` over a JSON-shaped dict (`MetadataBuilder`), the
errors an update raises, and `apply_update`, the one dispatch every update action registers with (in
`schema_updates.py` and `updates.py`).
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any

MAIN_BRANCH = "main"
LAST_ADDED = -1
SUPPORTED_FORMAT_VERSION = 3  # the REST spec's TableMetadata allows format-version 1..3
ROW_LINEAGE_FORMAT_VERSION = 3
PARTITION_DATA_ID_START = 1000  # partition field ids start here (Java PartitionSpec.PARTITION_DATA_ID_START)
UNSORTED_ORDER_ID = 0
INITIAL_SORT_ORDER_ID = 1


class Invalid(Exception):
    """The change set is invalid; `field` names the offending field of the update (becomes BadRequest)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class Stale(Exception):
    """The request carries values behind the table's (becomes CommitConflict: refresh and retry)."""


def implicit_refs(md: dict) -> dict:
    """Java's parser: metadata without `refs` (older writers) has a main branch at current-snapshot-id, if any."""
    current = md.get("current-snapshot-id")
    return {MAIN_BRANCH: {"snapshot-id": current, "type": "branch"}} if current not in (None, -1) else {}


def strip_trailing_slash(location: str) -> str:
    """Java `LocationUtil.stripTrailingSlash`, applied by the TableMetadata constructor."""
    while location.endswith("/") and not location.endswith("://"):
        location = location[:-1]
    return location


# --------------------------------------------------------------------------------------------------
# The change set being applied
# --------------------------------------------------------------------------------------------------


class SnapshotIndexes:
    """id -> snapshot for recently built `snapshots` lists, so that a commit to a table with 10,000 snapshots
    copies its base's index (~0.15 ms) instead of rebuilding it (~1-2 ms). Keyed by the list object: lists are
    copy-on-write, so a built list's entries never change. Bounded by the total number of entries; shared by
    every table of the process (a lock, as embedded services may run in several threads)."""

    MIN_SNAPSHOTS = 64            # below this, building is as cheap as copying
    MAX_ENTRIES = 1_000_000

    def __init__(self) -> None:
        self._by_list: OrderedDict[int, tuple[list, dict]] = OrderedDict()
        self._entries = 0
        self._lock = threading.Lock()

    def get(self, snapshots: list) -> dict | None:
        with self._lock:
            hit = self._by_list.get(id(snapshots))
            if hit is None or hit[0] is not snapshots:
                return None
            self._by_list.move_to_end(id(snapshots))
            return hit[1]

    def put(self, snapshots: list, index: dict) -> None:
        if len(snapshots) < self.MIN_SNAPSHOTS:
            return
        with self._lock:
            old = self._by_list.pop(id(snapshots), None)
            self._entries += len(index) - (len(old[1]) if old else 0)
            self._by_list[id(snapshots)] = (snapshots, index)
            while self._entries > self.MAX_ENTRIES and self._by_list:
                _, (_, evicted) = self._by_list.popitem(last=False)
                self._entries -= len(evicted)


SNAPSHOT_INDEXES = SnapshotIndexes()


class MetadataBuilder:
    """Java's `TableMetadata.Builder` over a JSON-shaped dict, with copy-on-write instead of defensive copies.

    Besides the metadata it tracks what Java keeps in `Builder.changes`: which schemas/specs/orders and
    snapshots were added in this change set (for -1 = "last added" and for snapshot-log times), which
    snapshots became `main` along the way (intermediate snapshot-log entries), and whether anything changed.
    """

    def __init__(self, base: dict, *, last_updated_ms: int, is_new: bool):
        self.base = base
        self.md: dict[str, Any] = dict(base)
        self.is_new = is_new
        self.last_updated_ms = last_updated_ms
        self.changed = False
        self._owned: set[str] = set()
        self._snapshots_by_id: dict[int, dict] | None = None

        self.added_schema_ids: set[int] = set()
        self.last_added_schema_id: int | None = None
        self.added_spec_ids: set[int] = set()
        self.last_added_spec_id: int | None = None
        self.added_order_ids: set[int] = set()
        self.last_added_order_id: int | None = None
        self.added_snapshot_ids: set[int] = set()
        self.main_set_to_added: list[int] = []  # added snapshots made current, in order
        self.removed_snapshots = False
        self.snapshot_log_appended = 0
        self._fill_defaults()

    def _fill_defaults(self) -> None:
        """Defaults Java's TableMetadataParser applies to metadata written by older writers (v1 without the
        list fields, no refs). Only the top-level copy is touched."""
        md = self.md
        if "schemas" not in md and isinstance(md.get("schema"), dict):
            legacy = md["schema"]
            md["schemas"] = [{**legacy, "schema-id": legacy.get("schema-id", 0)}]
            md.setdefault("current-schema-id", md["schemas"][0]["schema-id"])
        if "partition-specs" not in md and isinstance(md.get("partition-spec"), list):
            md["partition-specs"] = [{"spec-id": 0, "fields": md["partition-spec"]}]
            md.setdefault("default-spec-id", 0)
        if "last-partition-id" not in md:
            ids = [f.get("field-id", 0) for s in md.get("partition-specs", ()) for f in s["fields"]]
            md["last-partition-id"] = max(ids, default=PARTITION_DATA_ID_START - 1)
        if "sort-orders" not in md:
            md["sort-orders"] = [{"order-id": UNSORTED_ORDER_ID, "fields": []}]
            md["default-sort-order-id"] = UNSORTED_ORDER_ID
        for key, empty in (
            ("schemas", list),
            ("partition-specs", list),
            ("properties", dict),
            ("snapshots", list),
            ("snapshot-log", list),
            ("metadata-log", list),
            ("statistics", list),
            ("partition-statistics", list),
        ):
            if md.get(key) is None:
                md[key] = empty()
        md.setdefault("last-sequence-number", 0)
        if md.get("refs") is None:
            md["refs"] = implicit_refs(md)

    # copy-on-write ------------------------------------------------------------------------------

    def mutable_list(self, key: str) -> list:
        if key not in self._owned:
            self.md[key] = list(self.md.get(key) or ())
            self._owned.add(key)
        return self.md[key]

    def mutable_dict(self, key: str) -> dict:
        if key not in self._owned:
            self.md[key] = dict(self.md.get(key) or {})
            self._owned.add(key)
        return self.md[key]

    def set(self, key: str, value: Any) -> None:
        """Change a top-level field (or replace a whole list/dict with a new one the caller built)."""
        self.md[key] = value
        self._owned.add(key)
        self.changed = True
        if key == "snapshots":
            self._snapshots_by_id = None

    # lookups ------------------------------------------------------------------------------------

    @property
    def format_version(self) -> int:
        return self.md["format-version"]

    @property
    def current_snapshot_id(self) -> int:
        value = self.md.get("current-snapshot-id")
        return -1 if value is None else value

    def snapshot(self, snapshot_id: int) -> dict | None:
        if self._snapshots_by_id is None:
            cached = SNAPSHOT_INDEXES.get(self.md["snapshots"])
            self._snapshots_by_id = (dict(cached) if cached is not None
                                     else {s["snapshot-id"]: s for s in self.md["snapshots"]})
        return self._snapshots_by_id.get(snapshot_id)

    def remember_snapshot_index(self) -> None:
        """Called once the metadata is built: the next commit's builder starts from this index."""
        if self._snapshots_by_id is not None:
            SNAPSHOT_INDEXES.put(self.md["snapshots"], self._snapshots_by_id)

    def add_snapshot(self, snapshot: dict) -> None:
        self.mutable_list("snapshots").append(snapshot)
        if self._snapshots_by_id is not None:
            self._snapshots_by_id[snapshot["snapshot-id"]] = snapshot
        self.changed = True

    def schema(self, schema_id: int) -> dict | None:
        return next((s for s in self.md["schemas"] if s.get("schema-id") == schema_id), None)

    def current_schema(self) -> dict | None:
        return self.schema(self.md.get("current-schema-id"))


@functools.singledispatch
def apply_update(update: Any, b: MetadataBuilder) -> None:
    """What `update` does to the change set: one function per action, registered in `schema_updates.py` and
    `updates.py`."""
    raise Invalid("action", f"cannot apply {type(update).__name__} to a table")
