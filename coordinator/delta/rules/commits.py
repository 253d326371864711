"""Delta's rules for commits: a commit's checks and ratification, backpressure, the metadata it changes, its
UniForm metadata, publishing, and the commits a reader is given. Pure: no I/O, no clock."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any, Mapping

from ...errors import BadRequest, CommitConflict, TooManyRequests, VersionPublished
from ..columns import column_infos
from ..models import CommitInfo, CommitRequest, Metadata, Uniform, UniformIceberg
from ..state import DeltaTable, freeze
from .tables import (MIN_VERSION_PROPERTIES, REQUIRED_FEATURE_PROPERTIES, STAMP_PROPERTIES, check_required_properties,
                     check_table_uri, is_within, require_managed)



# -- commits -----------------------------------------------------------------------------------------------------


def check_commit_request(req: CommitRequest) -> None:
    """Seed, Write a Commit: a request commits a version, reports the published one, or both; metadata and UniForm
    changes ride only on a commit; the published version's two spellings (UC OSS `latest_backfilled_version`) must
    agree."""
    ci = req.commit_info
    if ci is None and req.published_version is None:
        raise BadRequest("at least one of commit_info or latest_published_version (latest_backfilled_version) "
                         "is required")
    if ci is None and req.metadata is not None:
        raise BadRequest("metadata requires commit_info: metadata changes are committed with a new version")
    if ci is None and req.uniform is not None:
        raise BadRequest("uniform requires commit_info: it records the conversion of the committed version")
    if (req.latest_published_version is not None and req.latest_backfilled_version is not None
            and req.latest_published_version != req.latest_backfilled_version):
        raise BadRequest(f"latest_published_version {req.latest_published_version} and "
                         f"latest_backfilled_version {req.latest_backfilled_version} disagree")


def check_commit_info(ci: CommitInfo) -> None:
    """Seed, Write a Commit, INVALID_PARAMETER_VALUE: version, timestamp, file size and modification time
    positive; the file name present. It names a file in `_delta_log/_staged_commits/`, so one path segment."""
    for field in ("version", "timestamp", "file_size", "file_modification_timestamp"):
        value = getattr(ci, field)
        if value <= 0:
            raise BadRequest(f"commit_info.{field} must be positive, got {value}")
    name = ci.file_name
    if not name or "/" in name or "\\" in name or name in (".", "..") or "\x00" in name:
        raise BadRequest(f"commit_info.file_name must be a single file name, got {name!r}")
    if len(name.encode()) > 255 or not name.endswith(".json"):
        raise BadRequest(f"commit_info.file_name must be a JSON commit file's name of at most 255 bytes, got "
                         f"{name[:80]!r}")
    # Delta names a staged commit `<version, 20 digits>.<uuid>.json`, and readers take the version from the name:
    # one that names another version would be read as that version. (The seed's samples use bare UUID names.)
    prefix = name.split(".", 1)[0]
    if len(prefix) == 20 and prefix.isdigit() and int(prefix) != ci.version:
        raise BadRequest(f"commit_info.file_name {name!r} names version {int(prefix)}, not {ci.version}")



def ratified(table: DeltaTable, version: int) -> dict | None:
    """The commit ratified as `version`, if the table still holds it in memory (unpublished, or the newest)."""
    if table.newest is not None and table.newest["version"] == version:
        return table.newest
    index = version - table.published - 1
    if 0 <= index < len(table.unpublished):
        return table.unpublished[index]
    return None


def is_replay(table: DeltaTable, ci: CommitInfo) -> bool:
    """The RFC: a catalog ratifies each version at most once. A version already ratified as this very file is a
    replay of an accepted commit whose answer was lost (200, nothing changes); as another file, a conflict. A
    version published long enough ago to have left memory raises VersionPublished, for the caller to compare with
    the stored log."""
    if ci.version > table.last:
        return False
    found = ratified(table, ci.version)
    if found is None:
        raise VersionPublished(f"Commit version {ci.version} already exists: the table is at version {table.last}")
    if found["file_name"] == ci.file_name:
        return True
    raise CommitConflict(f"Commit version {ci.version} already exists (ratified as {found['file_name']}): the table "
                         f"is at version {table.last}; rebuild the snapshot and retry at version {table.last + 1}")


def ratify(table: DeltaTable, ci: CommitInfo) -> DeltaTable:
    """The RFC: `v` is ratified only after `v - 1`, so a new version is the table's last + 1. It joins the
    unpublished commits and becomes the newest."""
    if ci.version != table.last + 1:
        raise BadRequest(f"commit version {ci.version} is not the table's last version + 1 = {table.last + 1}")
    commit = ci.to_json()
    return replace(table, last=ci.version, unpublished=table.unpublished + (commit,), newest=commit)


def record_published(before: DeltaTable, table: DeltaTable, published: int) -> DeltaTable:
    """Seed, `latest_published_version`: every version up to it is a `_delta_log/<v>.json` now, so those commits
    leave the unpublished list (and GET commits). Checked against `before`, the table before this request's
    commit (seed error (4) and UC OSS): the version this request ratifies cannot have been published yet, and
    taking it as published would drop it from GET commits unpublished. An older report changes nothing."""
    if published < 0:
        raise BadRequest(f"latest_published_version must be >= 0, got {published}")
    if published > before.last:
        raise BadRequest(f"latest_published_version {published} is greater than the table's current version "
                         f"{before.last}")
    if published <= table.published:
        return table
    return replace(table, published=published,
                   unpublished=tuple(c for c in table.unpublished if c["version"] > published))


def check_backpressure(before: DeltaTable, table: DeltaTable, max_unpublished: int) -> None:
    """Seed: the catalog may refuse a commit while too many ratified commits are unpublished (429): the client
    publishes (backfills) them first."""
    if len(table.unpublished) > max_unpublished:
        raise TooManyRequests(f"table {before.table_id} would have {len(table.unpublished)} unpublished commits "
                              f"(limit {max_unpublished}); publish (backfill) commits up to version "
                              f"{before.last} and report latest_published_version before committing again")


def decide_commit(table: DeltaTable, req: CommitRequest, *, max_unpublished: int, now_ms: int) -> DeltaTable:
    """Seed, Write a Commit: the table after `req`, or `table` itself when nothing changes (an idempotent replay,
    or a published-version report that tells nothing new). Raises when the request is refused; a refused request
    changes nothing, including its published-version part."""
    require_managed(table, req.table_uri)
    check_commit_request(req)
    ci = req.commit_info
    new = table
    if ci is not None:
        check_commit_info(ci)
        if is_replay(table, ci):
            return table
        new = ratify(table, ci)
    if req.published_version is not None:
        new = record_published(table, new, req.published_version)
    if ci is not None:
        check_backpressure(table, new, max_unpublished)
    if req.metadata is None and req.uniform is None:
        return new   # most commits: the catalog entry stays as it is, so it is neither copied nor compared
    info = dict(new.info)
    if req.metadata is not None:
        apply_metadata(info, table, req.metadata, ci, now_ms)
    if req.uniform is not None:
        info["uniform"] = {"iceberg": check_uniform(table, req.uniform, ci).to_json()}
        info["updated_at"] = now_ms
    if info != new.info:
        new = replace(new, info=freeze(info))
    return new


def _keep_protocol_properties(sent: Mapping[str, str], current: Mapping[str, str]) -> dict[str, str]:
    """`sent`, plus the current feature and min-version properties it leaves out. Delta's own UC client sends only
    the log's `metaData.configuration`, which holds the table id and the in-commit-timestamp setting but not what
    Delta derives from the protocol (features, reader/writer versions): those are carried over, while a value that
    is sent must still hold."""
    props = dict(sent)
    for key in (*REQUIRED_FEATURE_PROPERTIES, *(k for k, _ in MIN_VERSION_PROPERTIES)):
        if key not in props and key in current:
            props[key] = current[key]
    return props


def apply_metadata(info: dict[str, Any], table: DeltaTable, metadata: Metadata, ci: CommitInfo,
                    now_ms: int) -> None:
    """Seed: `metadata` is the desired final state of description, schema and properties; the properties
    must still hold every required property of a catalog-managed table. Metadata without `properties` leaves
    them as they are, but for the stamp of this change (`STAMP_PROPERTIES`: its version and timestamp)."""
    props = info.get("properties") or {}
    if metadata.properties is not None:
        props = _keep_protocol_properties(metadata.properties, props)
        check_required_properties(table.table_id, props, "metadata.properties")
    info["properties"] = {**props, STAMP_PROPERTIES[0]: str(ci.version), STAMP_PROPERTIES[1]: str(ci.timestamp)}
    if metadata.schema_ is not None:
        info["columns"] = column_infos(metadata.schema_, "metadata.schema")
    if metadata.description is not None:
        info["comment"] = metadata.description
    info["updated_at"] = now_ms


def check_uniform(table: DeltaTable, uniform: Uniform, ci: CommitInfo) -> UniformIceberg:
    """Seed, UniForm: the Iceberg conversion's metadata lies under the table, converts the committed version
    (from a base no later), at an ISO-8601 instant."""
    ice = uniform.iceberg
    if not is_within(table.location, ice.metadata_location):
        raise BadRequest(f"uniform.iceberg.metadata_location {ice.metadata_location!r} is not under the table "
                         f"location {table.location!r}")
    if ice.converted_delta_version != ci.version:
        raise BadRequest(f"uniform.iceberg.converted_delta_version {ice.converted_delta_version} must equal the "
                         f"committed version {ci.version}")
    base = ice.base_converted_delta_version
    if base is not None and not 0 <= base <= ice.converted_delta_version:
        raise BadRequest(f"uniform.iceberg.base_converted_delta_version {base} must be between 0 and "
                         f"converted_delta_version {ice.converted_delta_version}")
    try:
        ts = datetime.fromisoformat(ice.converted_delta_timestamp)
    except ValueError:
        ts = None
    if ts is None or ts.tzinfo is None:
        raise BadRequest(f"uniform.iceberg.converted_delta_timestamp {ice.converted_delta_timestamp!r} is not an "
                         f"ISO-8601 instant (e.g. 2026-02-09T17:00:00.000000Z)")
    return ice



def record_conversion(table: DeltaTable, base: str | None, record: Mapping[str, Any]) -> DeltaTable:
    """The service's conversion of the table to Iceberg (coordinator/uniform) reached a version, or refused one:
    kept with the table, unless another conversion was recorded since this one read `base` (its starting metadata
    file), and never for a version the table does not have."""
    current = (table.converted or {}).get("metadata_location")
    if current != base:
        raise CommitConflict(f"table {table.table_id}: another conversion to Iceberg was recorded meanwhile (at "
                             f"{current}, not {base})")
    version = record.get("delta_version", -1)
    refused = record.get("refused")
    if version > table.last or (refused is not None and refused["version"] > table.last):
        raise BadRequest(f"table {table.table_id} is at version {table.last}: a conversion of a later version "
                         f"cannot be recorded")
    return replace(table, converted=freeze(dict(record)))


# -- reading commits ------------------------------------------------------------------------------------------


def commits_page(table: DeltaTable, table_uri: str, start: int, end: int | None,
                 page_size: int) -> tuple[list[dict], int]:
    """Seed, Get Commits: the ratified commits UC still tracks (unpublished) in [start, end], contiguous and
    ascending, at most `page_size` of them (a short page means "ask again from the next version"), and the
    latest ratified version whatever `end` says. -1 for a table whose commits UC does not coordinate."""
    if start < 0:
        raise BadRequest(f"start_version must be >= 0, got {start}")
    if end is not None and end < start:
        raise BadRequest(f"end_version {end} is less than start_version {start}")
    check_table_uri(table, table_uri)
    if not table.managed:
        return [], -1
    last = table.last if end is None else min(end, table.last)
    commits = [c for c in table.unpublished if start <= c["version"] <= last]
    return commits[:page_size], table.last
