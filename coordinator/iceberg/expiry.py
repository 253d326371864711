"""Snapshot expiry by the coordinator: which snapshots and refs a table's own properties expire (Iceberg's
`ExpireSnapshots` semantics), and the commit of the coordinator's own that removes them (`ExpireSnapshots`,
decided by the table's actor like any commit).

The policy, as Java's `RemoveSnapshots` reads it:

- `history.expire.max-snapshot-age-ms` (5 days), `history.expire.min-snapshots-to-keep` (1) and
  `history.expire.max-ref-age-ms` (forever) are the table's defaults; a ref's own `max-snapshot-age-ms`,
  `min-snapshots-to-keep` and `max-ref-age-ms` take their place for that ref;
- a ref other than `main` whose snapshot is older than its max ref age is removed (and one naming no snapshot);
- every retained ref keeps its snapshot (a tag keeps exactly that one); a branch keeps its newest ancestors while
  fewer than its min-snapshots-to-keep are kept or they are younger than its max snapshot age;
- a snapshot no retained ref reaches is kept while younger than the table's max snapshot age.

It runs only on tables with `maintenance.expire-snapshots.enabled=true`, or, without that property, when the
service's `maintenance_expire_snapshots` is on (`false` on the table turns it off there).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from coordinator.crossable import crossing
from coordinator.decision import Change, Decision

from . import changes as m
from .proposals import check_ident, next_version
from .rules import apply_commit
from .state import IcebergTable, TableIdent, serialize_metadata

ENABLED = "maintenance.expire-snapshots.enabled"
MAX_SNAPSHOT_AGE_MS = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS_TO_KEEP = "history.expire.min-snapshots-to-keep"
MAX_REF_AGE_MS = "history.expire.max-ref-age-ms"
DEFAULT_MAX_SNAPSHOT_AGE_MS = 5 * 24 * 3600 * 1000
DEFAULT_MIN_SNAPSHOTS_TO_KEEP = 1
FOREVER = 2 ** 63 - 1   # Java's Long.MAX_VALUE: the default max ref age
MAIN = "main"


def enabled(metadata: dict[str, Any], service_default: bool) -> bool:
    """Whether the table opted in (or, without the property, the service's default)."""
    value = (metadata.get("properties") or {}).get(ENABLED)
    if value is None:
        return service_default
    return str(value).strip().lower() == "true"


@dataclass(frozen=True)
class Expiry:
    """What the policy expires: snapshot ids (oldest first) and the names of refs removed."""

    snapshot_ids: tuple[int, ...] = ()
    refs: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.snapshot_ids or self.refs)


def _number(properties: dict[str, Any], key: str, default: int) -> int:
    try:
        return int(str(properties.get(key, default)).strip())
    except ValueError:   # a value Java would refuse too: the default, rather than never expiring
        return default


def _branches(metadata: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The table's refs; a table written without refs has its current snapshot as `main`."""
    refs = dict(metadata.get("refs") or {})
    current = metadata.get("current-snapshot-id")
    if MAIN not in refs and current not in (None, -1):
        refs[MAIN] = {"snapshot-id": current, "type": "branch"}
    return refs


def plan(metadata: dict[str, Any], now_ms: int) -> Expiry:
    """The snapshots and refs the table's properties expire at `now_ms` (pure)."""
    snapshots = [s for s in metadata.get("snapshots") or [] if isinstance(s, dict)]
    if not snapshots:
        return Expiry()
    props = metadata.get("properties") or {}
    older_than = now_ms - _number(props, MAX_SNAPSHOT_AGE_MS, DEFAULT_MAX_SNAPSHOT_AGE_MS)
    min_keep = _number(props, MIN_SNAPSHOTS_TO_KEEP, DEFAULT_MIN_SNAPSHOTS_TO_KEEP)
    max_ref_age = _number(props, MAX_REF_AGE_MS, FOREVER)
    by_id = {s["snapshot-id"]: s for s in snapshots}

    refs = _branches(metadata)
    retained: dict[str, dict[str, Any]] = {}
    for name, ref in refs.items():
        snap = by_id.get(ref.get("snapshot-id"))
        if name == MAIN:
            retained[name] = ref
        elif snap is not None and now_ms - snap.get("timestamp-ms", 0) <= ref.get("max-ref-age-ms", max_ref_age):
            retained[name] = ref
    keep: set[int] = {ref["snapshot-id"] for ref in retained.values()}
    reachable: set[int] = set(keep)
    for ref in retained.values():
        if ref.get("type", "branch") != "branch":
            continue
        ref_older_than = now_ms - ref["max-snapshot-age-ms"] if "max-snapshot-age-ms" in ref else older_than
        ref_min = ref.get("min-snapshots-to-keep", min_keep)
        kept = 0
        counting = True
        for ancestor in _ancestors(ref["snapshot-id"], by_id):
            reachable.add(ancestor["snapshot-id"])
            if counting and (kept < ref_min or ancestor.get("timestamp-ms", 0) >= ref_older_than):
                keep.add(ancestor["snapshot-id"])
                kept += 1
            else:
                counting = False   # (the walk goes on only to learn which snapshots a branch reaches)
    for s in snapshots:
        if s["snapshot-id"] not in reachable and s.get("timestamp-ms", 0) >= older_than:
            keep.add(s["snapshot-id"])
    expired = tuple(s["snapshot-id"] for s in snapshots if s["snapshot-id"] not in keep)
    removed_refs = tuple(name for name in metadata.get("refs") or {} if name not in retained)
    return Expiry(expired, removed_refs)


def _ancestors(snapshot_id: int, by_id: dict[int, dict[str, Any]]):
    seen: set[int] = set()
    snap = by_id.get(snapshot_id)
    while snap is not None and snap["snapshot-id"] not in seen:   # (a cycle in a client's metadata ends it)
        seen.add(snap["snapshot-id"])
        yield snap
        snap = by_id.get(snap.get("parent-snapshot-id"))


def over_limits(metadata: dict[str, Any], now_ms: int) -> bool:
    """Cheap first test, run after every commit to an opted-in table: could `plan` expire anything? Without
    refs beyond main, a table of at most min-snapshots-to-keep snapshots, or whose oldest is young enough, has
    nothing to expire."""
    snapshots = metadata.get("snapshots") or []
    props = metadata.get("properties") or {}
    if len(snapshots) <= 1 and len(metadata.get("refs") or {}) <= 1:
        return False
    if len(metadata.get("refs") or {}) <= 1:
        if len(snapshots) <= _number(props, MIN_SNAPSHOTS_TO_KEEP, DEFAULT_MIN_SNAPSHOTS_TO_KEEP):
            return False
        oldest = min(s.get("timestamp-ms", 0) for s in snapshots[:8])   # appended in order: the first are oldest
        if oldest >= now_ms - _number(props, MAX_SNAPSHOT_AGE_MS, DEFAULT_MAX_SNAPSHOT_AGE_MS):
            return False
    return bool(plan(metadata, now_ms))


def manifest_lists(metadata: dict[str, Any], snapshot_ids) -> list[str]:
    wanted = set(snapshot_ids)
    return [s["manifest-list"] for s in metadata.get("snapshots") or []
            if s.get("snapshot-id") in wanted and isinstance(s.get("manifest-list"), str)]


@dataclass(frozen=True)
class Expired:
    """The answer to `ExpireSnapshots`: what it removed, and the table as it left it."""

    table: IcebergTable
    snapshot_ids: tuple[int, ...]
    refs: tuple[str, ...]
    cpu_s: float = 0.0   # the actor's CPU deciding it: the policy, the new metadata, its serialization


@dataclass
class ExpireSnapshots:
    """The coordinator's own commit: remove the snapshots (and refs) `planned` names that the policy still expires
    at `now_ms` against the table as it is when decided. A writer's commit decided before it in the same batch
    may have added snapshots or tagged one: only what is still expired goes, so it never undoes a writer's
    change, and it has no requirements: it never fails as a conflict."""

    ident: TableIdent
    planned: Expiry
    now_ms: int

    def decide(self, state: IcebergTable) -> Decision:
        start = time.thread_time()
        check_ident(state, self.ident)
        now = plan(state.metadata, self.now_ms)
        ids = [i for i in self.planned.snapshot_ids if i in set(now.snapshot_ids)]
        refs = [r for r in self.planned.refs if r in set(now.refs)]
        if not ids and not refs:
            return Decision(state, reply=Expired(state, (), ()))
        updates: list[Any] = [m.RemoveSnapshotRefUpdate(**{"ref-name": r}) for r in refs]
        if ids:
            updates.append(m.RemoveSnapshotsUpdate(**{"snapshot-ids": ids}))
        new = apply_commit(state.metadata, [], updates, base_location=state.metadata_location, now_ms=self.now_ms)
        data, list_json = serialize_metadata(new, state)
        decision = next_version(state, new, data, list_json, None)
        decision.reply = Expired(decision.state, tuple(ids), tuple(refs), time.thread_time() - start)
        decision.changes = [Change(c.type, {**c.data, "maintenance": {
            "operation": "expire-snapshots", "expired-snapshots": len(ids), "removed-refs": refs}})
            for c in decision.changes]
        for entry in decision.log:
            entry.payload.update({"operation": "expire-snapshots", "expired-snapshots": len(ids)})
        return decision


@dataclass
class Current:
    """The table's state as its actor holds it now (for the maintenance that runs beside the writers)."""

    def decide(self, state: Any) -> Decision:
        return Decision(state, reply=state)


# What maintenance hands a table's owner in a cluster, and its answers (coordinator/crossable).
crossing(sys.modules[__name__])
