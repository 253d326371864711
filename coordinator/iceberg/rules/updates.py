"""What each spec `TableUpdate` does to table metadata: one function per action, dispatched on the model class.
Here the updates of snapshots, refs, properties, location, statistics and encryption keys; those of the table's
structure (UUID, format version, schemas, specs, sort orders) are in `schema_updates.py`.

The semantics are those of Java's `TableMetadata.Builder` (the method each `MetadataUpdate.applyTo` calls),
because that is what Spark, Trino and every Java-based REST server do; pyiceberg's `update_table_metadata`
differs in places (e.g. -1 handling, snapshot-log times, id reuse) and is deliberately not the reference.

Purity: the functions work on a `MetadataBuilder`, which holds a top-level copy of the base metadata and copies
a list or dict only the first time it is changed (`mutable_list`/`mutable_dict`). Objects inside those lists
(snapshots, schemas, refs...) are never edited in place, only replaced, so nothing reachable from `base`
is ever mutated and a commit costs at most a few list copies, however many snapshots the table has.

Errors: `Invalid` is Java's ValidationException/IllegalArgumentException (the request is wrong: 400);
`Stale` is Java's RetryableValidationException (sequence number or first-row-id behind the table), which
Java's REST handler reports as CommitFailedException (409) so that the client refreshes and retries.
"""

from __future__ import annotations

from pydantic import TypeAdapter

from .. import changes as m
from . import schema_updates  # noqa: F401 - registers the structure updates with apply_update
from .builder import (MAIN_BRANCH, ROW_LINEAGE_FORMAT_VERSION, Invalid, MetadataBuilder, Stale, apply_update,
                      strip_trailing_slash)

_UPDATES = TypeAdapter(m.Update)
NO_SNAPSHOT = -1  # the spec's `current-snapshot-id` of a table without one


def parse_updates(raw: list) -> list[m.Update]:
    """Parse a request's `updates` array; BadRequest naming the element and field on anything malformed."""
    return m.parse_list(_UPDATES, raw, "updates", "action")


@apply_update.register(m.AddSnapshotUpdate)
def _add_snapshot(u: m.AddSnapshotUpdate, b: MetadataBuilder) -> None:
    """Java `addSnapshot`.

    * The snapshot id must be new, and never -1: the spec's "no current snapshot", which a ref set to it would
      turn into an empty table for every reader.
    * v2+: sequence-number must be greater than last-sequence-number unless the snapshot has no parent;
      a stale one is retryable (409), not malformed. last-sequence-number becomes the snapshot's number,
      and (Java's constructor) no snapshot may have a larger one.
    * v3 row lineage: first-row-id is required and must be >= next-row-id (stale -> 409); next-row-id then
      advances by added-rows.
    """
    snap = u.snapshot
    md = b.md
    if not md["schemas"]:
        raise Invalid("snapshot", "attempting to add a snapshot before a schema is added")
    if not md["partition-specs"]:
        raise Invalid("snapshot", "attempting to add a snapshot before a partition spec is added")
    if not md["sort-orders"]:
        raise Invalid("snapshot", "attempting to add a snapshot before a sort order is added")
    if snap.snapshot_id == NO_SNAPSHOT:
        raise Invalid("snapshot.snapshot-id", "snapshot id -1 is reserved: it means the table has no current snapshot")
    if b.snapshot(snap.snapshot_id) is not None:
        raise Invalid("snapshot.snapshot-id", f"snapshot already exists for id: {snap.snapshot_id}")

    sequence_number = snap.sequence_number or 0
    last = md["last-sequence-number"]
    if b.format_version == 1 and sequence_number != 0:
        raise Invalid("snapshot.sequence-number", f"sequence number must be 0 in v1: {sequence_number}")
    if b.format_version > 1 and sequence_number <= last and snap.parent_snapshot_id is not None:
        raise Stale(
            f"cannot add snapshot with sequence number {sequence_number} "
            f"older than last sequence number {last}"
        )
    if sequence_number < last:
        newer = max((s.get("sequence-number", 0) for s in md["snapshots"]), default=0)
        if newer > sequence_number:
            raise Invalid(
                "snapshot.sequence-number",
                f"invalid snapshot with sequence number {newer} greater than last sequence number {sequence_number}",
            )

    if b.format_version >= ROW_LINEAGE_FORMAT_VERSION:
        next_row_id = md.get("next-row-id") or 0
        if snap.first_row_id is None:
            raise Invalid("snapshot.first-row-id", "cannot add a snapshot: first-row-id is null")
        if snap.first_row_id < next_row_id:
            raise Stale(
                f"cannot add a snapshot, first-row-id is behind table next-row-id: "
                f"{snap.first_row_id} < {next_row_id}"
            )
        if snap.added_rows is None or snap.added_rows < 0:
            raise Invalid("snapshot.added-rows", "cannot add a snapshot: added-rows is required in v3 and >= 0")
        md["next-row-id"] = next_row_id + snap.added_rows

    b.set("last-sequence-number", sequence_number)
    b.add_snapshot(snap.stored())
    b.added_snapshot_ids.add(snap.snapshot_id)


def _same_ref(a: dict, b: dict) -> bool:
    """Java `SnapshotRef.equals`: id, type and the three retention settings (absent == null)."""
    keys = ("snapshot-id", "type", "min-snapshots-to-keep", "max-snapshot-age-ms", "max-ref-age-ms")
    return all(a.get(k) == b.get(k) for k in keys)


@apply_update.register(m.SetSnapshotRefUpdate)
def _set_snapshot_ref(u: m.SetSnapshotRefUpdate, b: MetadataBuilder) -> None:
    """Java `setRef`: an identical ref is a no-op; the snapshot must exist; main must be a branch.

    Setting main also sets current-snapshot-id and appends to snapshot-log. The entry's time is the
    snapshot's own timestamp if it was added in this change set, otherwise (a rollback to an older
    snapshot) the commit time, so that history shows when the table actually changed.
    """
    ref = u.ref()
    existing = b.md["refs"].get(u.ref_name)
    if existing is not None and _same_ref(existing, ref):
        return
    snapshot = b.snapshot(u.snapshot_id)
    if snapshot is None:
        raise Invalid("snapshot-id", f"cannot set {u.ref_name} to unknown snapshot: {u.snapshot_id}")
    if u.ref_name == MAIN_BRANCH and u.type != "branch":
        raise Invalid("type", "cannot set main to a tag, it must be a branch")
    if u.ref_name == MAIN_BRANCH:
        b.set("current-snapshot-id", u.snapshot_id)
        is_added = u.snapshot_id in b.added_snapshot_ids
        when = snapshot["timestamp-ms"] if is_added else b.last_updated_ms
        b.mutable_list("snapshot-log").append({"timestamp-ms": when, "snapshot-id": u.snapshot_id})
        b.snapshot_log_appended += 1
        if is_added:
            b.main_set_to_added.append(u.snapshot_id)
    b.mutable_dict("refs")[u.ref_name] = ref
    b.changed = True


def _remove_ref(b: MetadataBuilder, name: str) -> None:
    """Java `removeRef`: removing main also clears the current snapshot (-1)."""
    if name == MAIN_BRANCH:
        b.md["current-snapshot-id"] = -1
    if name in b.md["refs"]:
        del b.mutable_dict("refs")[name]
        b.changed = True


@apply_update.register(m.RemoveSnapshotRefUpdate)
def _remove_snapshot_ref(u: m.RemoveSnapshotRefUpdate, b: MetadataBuilder) -> None:
    _remove_ref(b, u.ref_name)


@apply_update.register(m.RemoveSnapshotsUpdate)
def _remove_snapshots(u: m.RemoveSnapshotsUpdate, b: MetadataBuilder) -> None:
    """Java `removeSnapshots`: unknown ids are ignored; the removed snapshots' statistics and partition
    statistics go with them, and so does every ref left pointing at a removed snapshot (main included,
    which clears the current snapshot). The snapshot-log is corrected when the change set is built."""
    to_remove = set(u.snapshot_ids)
    removed = {s["snapshot-id"] for s in b.md["snapshots"] if s["snapshot-id"] in to_remove}
    if not removed:
        return
    b.set("snapshots", [s for s in b.md["snapshots"] if s["snapshot-id"] not in removed])
    _remove_per_snapshot(b, "statistics", removed)
    _remove_per_snapshot(b, "partition-statistics", removed)
    for name in [n for n, ref in b.md["refs"].items() if ref["snapshot-id"] in removed]:
        _remove_ref(b, name)
    b.removed_snapshots = True
    b.changed = True


@apply_update.register(m.SetLocationUpdate)
def _set_location(u: m.SetLocationUpdate, b: MetadataBuilder) -> None:
    location = strip_trailing_slash(u.location)
    if not location:
        raise Invalid("location", "location must not be empty")
    if location != b.md.get("location"):
        b.set("location", location)


@apply_update.register(m.SetPropertiesUpdate)
def _set_properties(u: m.SetPropertiesUpdate, b: MetadataBuilder) -> None:
    """Java `setProperties`: stored as given (reserved keys are only filtered when creating a table)."""
    if u.updates:
        b.mutable_dict("properties").update(u.updates)
        b.changed = True


@apply_update.register(m.RemovePropertiesUpdate)
def _remove_properties(u: m.RemovePropertiesUpdate, b: MetadataBuilder) -> None:
    if u.removals:
        properties = b.mutable_dict("properties")
        for key in u.removals:
            properties.pop(key, None)
        b.changed = True


def _replace_per_snapshot(b: MetadataBuilder, key: str, item: dict) -> None:
    """Java keeps one statistics file per snapshot: a new one replaces the old one in place."""
    files = b.mutable_list(key)
    for i, existing in enumerate(files):
        if existing["snapshot-id"] == item["snapshot-id"]:
            files[i] = item
            break
    else:
        files.append(item)
    b.changed = True


def _remove_per_snapshot(b: MetadataBuilder, key: str, snapshot_ids: set[int]) -> None:
    if any(f["snapshot-id"] in snapshot_ids for f in b.md[key]):
        b.set(key, [f for f in b.md[key] if f["snapshot-id"] not in snapshot_ids])


@apply_update.register(m.SetStatisticsUpdate)
def _set_statistics(u: m.SetStatisticsUpdate, b: MetadataBuilder) -> None:
    _replace_per_snapshot(b, "statistics", u.statistics.stored())


@apply_update.register(m.RemoveStatisticsUpdate)
def _remove_statistics(u: m.RemoveStatisticsUpdate, b: MetadataBuilder) -> None:
    _remove_per_snapshot(b, "statistics", {u.snapshot_id})


@apply_update.register(m.SetPartitionStatisticsUpdate)
def _set_partition_statistics(u: m.SetPartitionStatisticsUpdate, b: MetadataBuilder) -> None:
    _replace_per_snapshot(b, "partition-statistics", u.partition_statistics.stored())


@apply_update.register(m.RemovePartitionStatisticsUpdate)
def _remove_partition_statistics(u: m.RemovePartitionStatisticsUpdate, b: MetadataBuilder) -> None:
    _remove_per_snapshot(b, "partition-statistics", {u.snapshot_id})


@apply_update.register(m.AddEncryptionKeyUpdate)
def _add_encryption_key(u: m.AddEncryptionKeyUpdate, b: MetadataBuilder) -> None:
    """Java `addEncryptionKey`: a key id that already exists is a no-op."""
    key = u.encryption_key.stored()
    if any(k["key-id"] == key["key-id"] for k in b.md.get("encryption-keys") or ()):
        return
    b.mutable_list("encryption-keys").append(key)
    b.changed = True


@apply_update.register(m.RemoveEncryptionKeyUpdate)
def _remove_encryption_key(u: m.RemoveEncryptionKeyUpdate, b: MetadataBuilder) -> None:
    keys = b.md.get("encryption-keys") or ()
    if any(k["key-id"] == u.key_id for k in keys):
        remaining = [k for k in keys if k["key-id"] != u.key_id]
        b.set("encryption-keys", remaining)
        if not remaining:
            del b.md["encryption-keys"]  # Java writes the field only when there are keys


