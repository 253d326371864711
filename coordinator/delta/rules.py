"""Commit rules for catalog-managed Delta tables: pure functions of a table's state and a request.

Sources: the seed (UC Managed Tables spec 0.1.0, "Write a Commit" / "Get Commits" / "Create a Table") and the
Delta RFC `catalog-managed.md` ("Commit Protocol": a catalog must not ratify `v` before `v - 1` and ratifies
each version at most once; "Publishing Commits": commits are published in order). Nothing here does I/O or
reads a clock, so the table actor can decide a whole batch against in-memory state and re-decide after a reload.
"""

from __future__ import annotations

import copyreg
import os
import re
from dataclasses import dataclass, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any, Mapping
from urllib.parse import unquote, urlparse
from uuid import UUID

import orjson

from ..errors import BadRequest, CommitConflict, NotFound, TooManyRequests
from .columns import column_infos
from .models import CommitInfo, CommitRequest, Metadata, MetricsRequest, Uniform

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


# -- state -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StagingTable:
    """`POST /staging-tables` allocated an id and a location; `POST /tables` turns it into a table."""

    table_id: UUID
    catalog_name: str
    schema_name: str
    name: str
    location: str
    created_at: int
    schema_id: str | None = None   # the schema it was allocated in; None in rows written before it was kept

    def row_state(self) -> dict[str, Any]:
        return {"staging": {"catalog_name": self.catalog_name, "schema_name": self.schema_name,
                            "name": self.name, "location": self.location, "created_at": self.created_at,
                            "schema_id": self.schema_id}}


@dataclass(frozen=True)
class DeltaTable:
    """A UC table as its actor holds it. `info` is the catalog entry (TableInfo fields); the rest is the commit
    coordinator's state: everything GET commits needs is here, so it is answered from memory."""

    table_id: UUID
    info: Mapping[str, Any]
    last: int                        # latest ratified version; -1 when UC does not coordinate commits
    published: int                   # every version <= published is a `_delta_log/<v>.json`
    unpublished: tuple[dict, ...]    # ratified commits published+1 .. last, ascending
    newest: dict | None              # the commit ratified as `last`, kept after publishing to recognise replays

    @property
    def managed(self) -> bool:
        return self.info["table_type"] == "MANAGED" and self.info["data_source_format"] == "DELTA"

    @property
    def location(self) -> str:
        return self.info["storage_location"]

    @property
    def full_name(self) -> tuple[str, str, str]:
        return self.info["catalog_name"], self.info["schema_name"], self.info["name"]

    def row_state(self) -> dict[str, Any]:
        # The catalog entry rides along on every write: a table row is one compare-and-set, and the entry
        # (columns, properties) is a few KB, so keeping it in the row avoids a second store to keep in step.
        return {"info": dict(self.info), "last": self.last, "published": self.published}


def freeze(info: dict[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(info)


# A table's state crosses between cluster members pickled (coordinator/cluster/channel.py), and pickle knows no
# mappingproxy: a create or load through a member that does not own the table failed to encode its answer.
copyreg.pickle(MappingProxyType, lambda proxy: (freeze, (dict(proxy),)))


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
    if normalize_uri(table_uri) != normalize_uri(table.location):
        raise BadRequest(f"table_uri {table_uri!r} does not match the table's location {table.location!r}")


def require_table(state: Any, table_id: str) -> DeltaTable:
    """Staging tables, other formats' tables and dropped ids are all "no such table" to the commit API."""
    if not isinstance(state, DeltaTable):
        raise NotFound(f"Table does not exist: no table with id {table_id}", kind="table")
    return state


def require_managed(table: DeltaTable, table_uri: str) -> None:
    """Seed, commit rule 1: the table exists, is MANAGED DELTA, and `table_uri` is its location."""
    if not table.managed:
        raise BadRequest(f"table {table.table_id} is a {table.info['table_type']} "
                         f"{table.info['data_source_format']} table: Unity Catalog coordinates commits only for "
                         f"MANAGED DELTA tables")
    check_table_uri(table, table_uri)


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


def _ratified(table: DeltaTable, version: int) -> dict | None:
    if table.newest is not None and table.newest["version"] == version:
        return table.newest
    index = version - table.published - 1
    if 0 <= index < len(table.unpublished):
        return table.unpublished[index]
    return None


def decide_commit(table: DeltaTable, req: CommitRequest, *, max_unpublished: int, now_ms: int) -> DeltaTable:
    """The seed's commit rules, in order. Returns the new state, or `table` itself when nothing changes
    (an idempotent replay, or a backfill report that tells nothing new). Raises when the request is refused;
    a refused request changes nothing, including its backfill part."""
    require_managed(table, req.table_uri)
    published = req.published_version
    ci = req.commit_info
    if ci is None and published is None:
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

    new = table
    if ci is not None:
        check_commit_info(ci)
        v = ci.version
        if v <= table.last:
            ratified = _ratified(table, v)
            if ratified is not None and ratified["file_name"] == ci.file_name:
                return table  # a replay of an accepted commit whose answer was lost: 200, nothing changes
            if ratified is None:
                # Published and no longer in memory; the catalog compares with the stored log (kind says so).
                raise CommitConflict(f"Commit version {v} already exists: the table is at version {table.last}",
                                     kind="published")
            raise CommitConflict(f"Commit version {v} already exists (ratified as {ratified['file_name']}): the "
                                 f"table is at version {table.last}; rebuild the snapshot and retry at version "
                                 f"{table.last + 1}")
        if v != table.last + 1:
            raise BadRequest(f"commit version {v} is not the table's last version + 1 = {table.last + 1}")
        commit = ci.to_json()
        new = replace(new, last=v, unpublished=new.unpublished + (commit,), newest=commit)

    if published is not None:
        if published < 0:
            raise BadRequest(f"latest_published_version must be >= 0, got {published}")
        # Seed error (4) and UC OSS: against the version before this commit. The version this request ratifies
        # cannot have been published yet, and taking it as published would drop it from GET commits unpublished.
        if published > table.last:
            raise BadRequest(f"latest_published_version {published} is greater than the table's current version "
                             f"{table.last}")
        if published > new.published:
            new = replace(new, published=published,
                          unpublished=tuple(c for c in new.unpublished if c["version"] > published))

    if ci is not None and len(new.unpublished) > max_unpublished:
        raise TooManyRequests(f"table {table.table_id} would have {len(new.unpublished)} unpublished commits "
                              f"(limit {max_unpublished}); publish (backfill) commits up to version "
                              f"{table.last} and report latest_published_version before committing again")

    if req.metadata is None and req.uniform is None:
        return new   # most commits: the catalog entry stays as it is, so it is neither copied nor compared
    info = dict(new.info)
    if req.metadata is not None:
        _apply_metadata(info, table, req.metadata, ci, now_ms)
    if req.uniform is not None:
        info["uniform"] = {"iceberg": _check_uniform(table, req.uniform, ci).to_json()}
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


def _apply_metadata(info: dict[str, Any], table: DeltaTable, metadata: Metadata, ci: CommitInfo,
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


def _check_uniform(table: DeltaTable, uniform: Uniform, ci: CommitInfo):
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


def temporary_credentials(location: str, operation: str, s3_keys: Mapping[str, str] | None) -> dict[str, Any]:
    """UC OSS `CloudCredentialVendor`, for what this service holds. A local path needs no credential: the answer
    names the path only. An s3:// location gets the service's static keys (`s3_keys`: `Config.s3_options`, given
    only while authentication is off and for the warehouse, as Iceberg's /credentials does). Anything else is a
    clear refusal, not an answer without credentials that the engine would only fail on later."""
    if operation.startswith("UNKNOWN_"):
        raise BadRequest(f"operation {operation} asks for no access: name the access wanted (READ or READ_WRITE "
                         f"for a table, PATH_READ, PATH_READ_WRITE or PATH_CREATE_TABLE for a path)")
    if not location or "\x00" in location:
        raise BadRequest(f"invalid storage location {location!r}")
    scheme = urlparse(location).scheme
    if scheme in ("", "file"):
        if not location.startswith(("/", "file:/")):
            raise BadRequest(f"storage location {location!r} must be an absolute path or a file:// URL")
        return {"url": location}
    if scheme in ("s3", "s3a") and s3_keys and "access_key_id" in s3_keys:
        aws = {"access_key_id": s3_keys["access_key_id"], "secret_access_key": s3_keys.get("secret_access_key")}
        if "session_token" in s3_keys:
            aws["session_token"] = s3_keys["session_token"]
        return {"url": location, "aws_temp_credentials": aws}
    raise BadRequest(f"no temporary credentials for {location}: this service vends none for {scheme}:// storage "
                     f"here (static S3 keys only for its own warehouse, and only while authentication is off); give "
                     f"the engine its own credentials for it", kind="precondition")


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
