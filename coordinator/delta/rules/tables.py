"""Delta's rules for tables: UC names and locations, which table a request reaches, the properties and the first
commit a catalog-managed table must have, what a metrics report or a credential request may ask. Pure: no I/O."""

from __future__ import annotations

import os
import re
from typing import Any, Mapping
from urllib.parse import unquote, urlparse
from uuid import UUID

import orjson

from ...errors import BadRequest, FailedPrecondition, NoSuchTable, TableExists
from ..models import MetricsRequest
from ..state import DeltaTable, StagingTable

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


# -- metrics and credentials ------------------------------------------------------------------------------------


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
