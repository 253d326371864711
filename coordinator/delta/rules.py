"""Rules for catalog-managed Delta tables: pure functions of a table's state and a request, one per rule of the
spec, each returning a new state (or what to answer) or raising the spec's typed error.

Sources: the seed (UC Managed Tables spec 0.1.0, "Write a Commit" / "Get Commits" / "Create a Table") and the
Delta RFC `catalog-managed.md` ("Commit Protocol": a catalog must not ratify `v` before `v - 1` and ratifies
each version at most once; "Publishing Commits": commits are published in order). Nothing here does I/O or
reads a clock, so the table actor can decide a whole batch against in-memory state and re-decide after a reload.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from datetime import datetime
from typing import Any, Mapping
from urllib.parse import unquote, urlparse
from uuid import UUID

import orjson

from ..errors import (BadRequest, CommitConflict, FailedPrecondition, NoSuchTable, TableExists, TooManyRequests,
                      VersionPublished)
from .columns import column_infos
from .models import CommitInfo, CommitRequest, Metadata, MetricsRequest, Uniform, UniformIceberg
from .state import DeltaTable, StagingTable, freeze

FullName = tuple[str, str, str]

TABLE_ID_PROPERTY = "io.unitycatalog.tableId"
# Seed, "Required Table Features and Properties": catalogManaged and vacuumProtocolCheck are reader-writer
# features, inCommitTimestamp a writer feature; the catalogManaged RFC requires reader 3 / writer 7.
REQUIRED_READER_FEATURES = ("catalogManaged", "vacuumProtocolCheck")
REQUIRED_WRITER_FEATURES = ("catalogManaged", "inCommitTimestamp", "vacuumProtocolCheck")
FIRST_COMMIT_FILE = "00000000000000000000.json"
# Seed, Create a Table, "Required Table Features and Properties" and "Other Required Table Properties": what a
# catalog-managed table's entry must always say, at creation and after every metadata change ("When updating,
# always includes all the required properties"), since readers discover the table's contract from it.
ICT_PROPERTY = "delta.enableInCommitTimestamps"
REQUIRED_FEATURE_PROPERTIES = tuple(f"delta.feature.{f}" for f in ("catalogManaged", "inCommitTimestamp",
                                                                   "vacuumProtocolCheck"))
MIN_VERSION_PROPERTIES = (("delta.minReaderVersion", 3), ("delta.minWriterVersion", 7))
# The catalog's bookkeeping of the last metadata change (UC managed tables spec: "the version of the last commit
# that changed table metadata", and its timestamp; "they have no Delta log representation"): stamped by the
# catalog on each metadata change, so a client need not send them, and only their type is checked if it does.
STAMP_PROPERTIES = ("delta.lastUpdateVersion", "delta.lastCommitTimestamp")
_UNSIGNED = re.compile(r"^[0-9]{1,19}$")  # not int(): it takes " 3", "+3" and "3_0"

# UC names: no dots (they join full names), slashes, whitespace or control characters.
_NAME = re.compile(r"^[^.\s/\x00-\x1f\x7f]{1,255}$")


# -- names and locations -----------------------------------------------------------------------------------------


def check_name(kind: str, name: str) -> str:
    if not _NAME.match(name):
        raise BadRequest(f"invalid {kind} name {name!r}: 1-255 characters, no '.', '/', spaces or control "
                         f"characters")
    return name


def split_full_name(full_name: str, parts: int, kind: str) -> tuple[str, ...]:
    names = tuple(full_name.split("."))
    if len(names) != parts or not all(names):
        shape = "catalog_name.schema_name" if parts == 2 else "catalog_name.schema_name.table_name"
        raise BadRequest(f"invalid {kind} full name {full_name!r}: expected {shape}")
    return names


def normalize_uri(uri: str) -> str:
    """One spelling per location: `file:/p`, `file:///p/`, `/p` are one place, as are `s3a://b/p` and
    `s3://b/p/`. Delta's Hadoop client sends `file:/p`; we hand out `file:///p`."""
    p = urlparse(uri)
    if p.scheme in ("", "file"):
        # Not storage.files.to_local_path: it takes Hadoop's `file:/p` (no "://") for a relative path.
        return "file://" + os.path.normpath(unquote(p.path) if p.scheme else uri)
    scheme = "s3" if p.scheme in ("s3a", "s3n") else p.scheme
    path = os.path.normpath(p.path) if p.path not in ("", "/") else ""
    return f"{scheme}://{p.netloc}{path}".rstrip("/")


def is_within(root: str, uri: str) -> bool:
    """`uri` is `root` or below it, whichever way either is spelled."""
    r, u = normalize_uri(root), normalize_uri(uri)
    return u == r or u.startswith(r + "/")


def check_table_uri(table: DeltaTable, table_uri: str) -> None:
    """Seed: `table_uri` is the table's location, however spelled."""
    if normalize_uri(table_uri) != normalize_uri(table.location):
        raise BadRequest(f"table_uri {table_uri!r} does not match the table's location {table.location!r}")


# -- which table a request reaches -------------------------------------------------------------------------------


def require_table(state: Any, table_id: str) -> DeltaTable:
    """Staging tables, other formats' tables and dropped ids are all "no such table" to the commit API."""
    if not isinstance(state, DeltaTable):
        raise NoSuchTable(f"Table does not exist: no table with id {table_id}")
    return state


def table_named(state: Any, full: FullName) -> DeltaTable:
    """Names were resolved to an id before the request reached the actor; a drop and re-create in between means
    the id no longer carries this name."""
    if not isinstance(state, DeltaTable) or state.full_name != full:
        raise NoSuchTable(f"Table does not exist: {'.'.join(full)}")
    return state


def require_managed(table: DeltaTable, table_uri: str) -> None:
    """Seed, commit rule 1: the table exists, is MANAGED DELTA, and `table_uri` is its location."""
    if not table.managed:
        raise BadRequest(f"table {table.table_id} is a {table.info['table_type']} "
                         f"{table.info['data_source_format']} table: Unity Catalog coordinates commits only for "
                         f"MANAGED DELTA tables")
    check_table_uri(table, table_uri)


def unused_staging(state: Any, full: FullName, location: str, schema_id: str) -> StagingTable:
    """Seed, Create a Table: a MANAGED table is created at a staging location allocated for this very name, in
    this very schema, and not used by a table yet."""
    if isinstance(state, DeltaTable):
        if state.full_name == full:
            # A second create of the same table (a retry, or a race lost to an identical request).
            raise TableExists(f"Table already exists: {'.'.join(full)}")
        raise BadRequest(f"storage_location {location!r} is not an unused staging location: table "
                         f"{'.'.join(state.full_name)} uses it")
    if not isinstance(state, StagingTable):
        raise NoSuchTable(f"Staging table does not exist at {location!r}")
    if (state.catalog_name, state.schema_name, state.name) != full:
        raise BadRequest(f"staging location {location!r} was allocated for "
                         f"{state.catalog_name}.{state.schema_name}.{state.name}, not {'.'.join(full)}")
    if state.schema_id is not None and state.schema_id != schema_id:
        # Its schema was deleted (and one of the same name made since): the staging table went with it.
        raise NoSuchTable(f"Staging table does not exist at {location!r}: schema {full[0]}.{full[1]} was deleted "
                          f"after it was allocated; create a new staging table")
    return state


# -- required properties -----------------------------------------------------------------------------------------


def check_required_properties(table_id: UUID, props: Mapping[str, str], field: str) -> None:
    """Seed: a catalog-managed table's properties name it (`io.unitycatalog.tableId`), enable in-commit
    timestamps, mark catalogManaged, inCommitTimestamp and vacuumProtocolCheck 'supported', and say reader >= 3,
    writer >= 7. A property missing is as wrong as one contradicting this: either would tell readers the table is
    not catalog-managed. Raises naming every problem."""
    problems: list[str] = []
    found = props.get(TABLE_ID_PROPERTY)
    if found != str(table_id):
        problems.append(f"{TABLE_ID_PROPERTY} = {table_id} (found {found!r})")
    ict = props.get(ICT_PROPERTY)
    if ict is None or ict.lower() != "true":  # Delta reads booleans case-insensitively
        problems.append(f"{ICT_PROPERTY} = true (found {ict!r})")
    for key in REQUIRED_FEATURE_PROPERTIES:
        if props.get(key) != "supported":
            problems.append(f"{key} = supported (found {props.get(key)!r})")
    for key, least in MIN_VERSION_PROPERTIES:
        value = props.get(key)
        if value is None or not _UNSIGNED.match(value) or int(value) < least:
            problems.append(f"{key} >= {least} (found {value!r})")
    for key in STAMP_PROPERTIES:
        value = props.get(key)
        if value is not None and not _UNSIGNED.match(value):
            problems.append(f"{key}, if given, a non-negative integer (found {value!r})")
    if problems:
        raise BadRequest(f"{field} lacks the required properties of a catalog-managed table: "
                         + "; ".join(problems))


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


# -- reading commits, metrics, credentials ----------------------------------------------------------------------


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


def check_metrics(table: DeltaTable, req: MetricsRequest) -> None:
    """Seed, Write Metrics: `commit_version` required (a version of the table: 0, its creation, or one UC
    ratified), counts non-negative, histogram arrays of one length, boundaries sorted from 0."""
    require_managed(table, req.table_uri)
    report = req.report.commit_report if req.report is not None else None
    if report is None:
        return
    if report.commit_version is None:
        raise BadRequest("report.commit_report.commit_version is required")
    # Version 0 counts: the table was created at it (seed: "registers the table as created at commit version
    # 0"), and a CTAS's 0.json adds files like any commit.
    if not 0 <= report.commit_version <= table.last:
        raise BadRequest(f"report.commit_report.commit_version {report.commit_version} is not a version of the "
                         f"table (0..{table.last})")
    for field, value in report:
        if isinstance(value, int) and value < 0:
            raise BadRequest(f"report.commit_report.{field} must be >= 0, got {value}")
    hist = report.file_size_histogram
    if hist is not None:
        arrays = {"sorted_bin_boundaries": hist.sorted_bin_boundaries, "file_counts": hist.file_counts,
                  "total_bytes": hist.total_bytes}
        lengths = {name: len(a) for name, a in arrays.items() if a is not None}
        if len(lengths) != 3:
            missing = sorted(set(arrays) - set(lengths))
            raise BadRequest(f"report.commit_report.file_size_histogram is missing {', '.join(missing)}")
        if len(set(lengths.values())) != 1:
            raise BadRequest(f"report.commit_report.file_size_histogram arrays must have one length, got "
                             f"{lengths}")
        bounds = hist.sorted_bin_boundaries
        if bounds and bounds[0] != 0:
            raise BadRequest("report.commit_report.file_size_histogram.sorted_bin_boundaries must start at 0")
        if any(b <= a for a, b in zip(bounds, bounds[1:])):
            raise BadRequest("report.commit_report.file_size_histogram.sorted_bin_boundaries must be increasing")
        for name in ("file_counts", "total_bytes"):
            if any(x < 0 for x in arrays[name]):
                raise BadRequest(f"report.commit_report.file_size_histogram.{name} must be >= 0")


def temporary_credentials(location: str, operation: str, s3_keys: Mapping[str, str] | None,
                          expiration_ms: int) -> dict[str, Any]:
    """UC OSS `CloudCredentialVendor`, for what this service holds. A local path needs no credential: the answer
    names the path only. An s3:// location gets the service's static keys (`s3_keys`: coordinator.credentials,
    given only while authentication is off and for the warehouse, as Iceberg's /credentials does). Anything else
    is a clear refusal, not an answer without credentials that the engine would only fail on later. Every answer
    carries `expiration_time` (epoch ms): delta-rs refuses one without it, even for a local path."""
    if operation.startswith("UNKNOWN_"):
        raise BadRequest(f"operation {operation} asks for no access: name the access wanted (READ or READ_WRITE "
                         f"for a table, PATH_READ, PATH_READ_WRITE or PATH_CREATE_TABLE for a path)")
    if not location or "\x00" in location:
        raise BadRequest(f"invalid storage location {location!r}")
    scheme = urlparse(location).scheme
    if scheme in ("", "file"):
        if not location.startswith(("/", "file:/")):
            raise BadRequest(f"storage location {location!r} must be an absolute path or a file:// URL")
        return {"url": location, "expiration_time": expiration_ms}
    if scheme in ("s3", "s3a") and s3_keys and "access_key_id" in s3_keys:
        aws = {"access_key_id": s3_keys["access_key_id"], "secret_access_key": s3_keys.get("secret_access_key")}
        if "session_token" in s3_keys:
            aws["session_token"] = s3_keys["session_token"]
        return {"url": location, "aws_temp_credentials": aws, "expiration_time": expiration_ms}
    raise FailedPrecondition(f"no temporary credentials for {location}: this service vends none for {scheme}:// "
                             f"storage here (static S3 keys only for its own warehouse, and only while "
                             f"authentication is off); give the engine its own credentials for it")



# -- creating a managed table ------------------------------------------------------------------------------------


def check_first_commit(table_id: UUID, data: bytes) -> dict[str, Any]:
    """Seed, Create a Table: `_delta_log/0.json` must enable catalogManaged (reader 3 / writer 7, the feature
    in both lists), inCommitTimestamp and vacuumProtocolCheck, and name this UC table in
    `io.unitycatalog.tableId`. Returns version 0 as a commit record; raises naming everything missing."""
    actions: dict[str, Any] = {}
    try:
        for line in data.splitlines():
            if line.strip():
                action = orjson.loads(line)
                if not isinstance(action, dict):
                    raise ValueError("an action is not a JSON object")
                for key, value in action.items():
                    actions.setdefault(key, value)
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise BadRequest(f"{FIRST_COMMIT_FILE} is not a Delta log file: {exc}") from None
    protocol = actions.get("protocol")
    metadata = actions.get("metaData")
    commit_info = actions.get("commitInfo")
    missing: list[str] = []
    if not isinstance(protocol, dict):
        missing.append("a protocol action")
        protocol = {}
    if not isinstance(metadata, dict):
        missing.append("a metaData action")
        metadata = {}
    reader, writer = protocol.get("minReaderVersion"), protocol.get("minWriterVersion")
    if protocol and not (isinstance(reader, int) and reader >= 3):
        missing.append(f"minReaderVersion >= 3 (found {reader})")
    if protocol and not (isinstance(writer, int) and writer >= 7):
        missing.append(f"minWriterVersion >= 7 (found {writer})")
    reader_features = protocol.get("readerFeatures") or []
    writer_features = protocol.get("writerFeatures") or []
    missing += [f"reader feature {f}" for f in REQUIRED_READER_FEATURES if f not in reader_features]
    missing += [f"writer feature {f}" for f in REQUIRED_WRITER_FEATURES if f not in writer_features]
    conf = metadata.get("configuration") or {}
    if conf.get(TABLE_ID_PROPERTY) != str(table_id):
        missing.append(f"property {TABLE_ID_PROPERTY} = {table_id} (found {conf.get(TABLE_ID_PROPERTY)!r})")
    if str(conf.get("delta.enableInCommitTimestamps", "")).lower() != "true":
        missing.append("property delta.enableInCommitTimestamps = true")
    ict = commit_info.get("inCommitTimestamp") if isinstance(commit_info, dict) else None
    if not (isinstance(ict, int) and ict > 0):
        missing.append("a commitInfo action with inCommitTimestamp")
    if missing:
        raise BadRequest(f"not a catalog-managed Delta table: {FIRST_COMMIT_FILE} lacks " + "; ".join(missing))
    return {"version": 0, "timestamp": ict, "file_name": FIRST_COMMIT_FILE, "file_size": len(data),
            "file_modification_timestamp": ict}
