"""Rules of Unity Catalog's Delta API v1.0 (Managed Tables Specification v1.0): pure functions of a table's state
and a request, as the preview API's are (coordinator/delta/rules/). The commit itself is decided by those very
rules (check_commit_info, is_replay, ratify, record_published, check_backpressure), so a version is ratified the
same way whichever API proposed it; what is v1's own is here: the protocol and properties a managed table must
declare, the etag, the metadata updates, UniForm's v1 shape and the table as `loadTable` answers it.

What v1 adds to the catalog entry (`DeltaTable.info`), beside the preview API's fields: `delta_protocol` (the
protocol last declared through v1), `domain_metadata` (by domain name) and `partition_columns`. The protocol is
also projected into the properties (`delta.feature.<f>`, `delta.min*Version`), as both APIs read it there.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Mapping
from uuid import UUID

import orjson

from ...errors import BadRequest
from ..models import CommitInfo
from ..rules import (ICT_PROPERTY, STAMP_PROPERTIES, TABLE_ID_PROPERTY, check_backpressure, check_commit_info,
                     check_required_properties, is_replay, is_within, ratify, record_published)
from ..state import DeltaTable, freeze
from .columns import column_infos_of, struct_of
from .errors import MalformedRequest, RequirementFailed, UnsupportedFormat
from .models import AddCommit, CreateTable, Protocol, UpdateTable

PROTOCOL_VERSION = "1.0"

# What this server requires of a managed table (the spec: "the authoritative set is whatever the server returns
# at runtime"): the preview API's contract (coordinator/delta/rules/tables.py), so that a table created through
# either API can be committed through both. What the spec's reference list adds is suggested.
REQUIRED_PROTOCOL = {"min-reader-version": 3, "min-writer-version": 7,
                     "reader-features": ["catalogManaged", "vacuumProtocolCheck"],
                     "writer-features": ["catalogManaged", "inCommitTimestamp", "vacuumProtocolCheck"]}
SUGGESTED_PROTOCOL = {"reader-features": ["columnMapping", "deletionVectors", "v2Checkpoint"],
                      "writer-features": ["columnMapping", "deletionVectors", "domainMetadata", "rowTracking",
                                          "v2Checkpoint"]}
SUGGESTED_PROPERTIES: dict[str, str | None] = {
    "delta.checkpointPolicy": "v2", "delta.enableDeletionVectors": "true",
    "delta.checkpoint.writeStatsAsStruct": "true", "delta.checkpoint.writeStatsAsJson": "true",
    "delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": None, "delta.enableRowTracking": "true",
    "delta.rowTracking.materializedRowIdColumnName": None,
    "delta.rowTracking.materializedRowCommitVersionColumnName": None}

FEATURE_PREFIX = "delta.feature."
VERSION_KEYS = ("delta.minReaderVersion", "delta.minWriterVersion")
CLUSTERING, ROW_TRACKING = "delta.clustering", "delta.rowTracking"
# Keys the server derives (the spec's "synthetic property keys"): never a client's to set or remove.
DERIVED_KEYS = frozenset({*VERSION_KEYS, *STAMP_PROPERTIES, "delta.clusteringColumns",
                          "delta.rowTracking.rowIdHighWaterMark"})
# Domains the spec defines, the writer features each needs, and the key its value is projected to.
DOMAINS = {CLUSTERING: (("clustering", "domainMetadata"), "clusteringColumns", "delta.clusteringColumns"),
           ROW_TRACKING: (("rowTracking", "domainMetadata"), "rowIdHighWaterMark",
                          "delta.rowTracking.rowIdHighWaterMark")}
UNIFORM_PROPERTY = "delta.universalFormat.enabledFormats"
# Updates with a Delta log representation: only in the request whose add-commit carries them (the spec, "Catalog
# and log consistency"). Properties may also be the catalog's own, and a comment is the catalog's alone.
NEEDS_COMMIT = ("set-columns", "set-protocol", "set-partition-columns", "set-domain-metadata",
                "remove-domain-metadata")
METADATA_UPDATES = (*NEEDS_COMMIT, "set-properties", "remove-properties", "set-table-comment")


def required_properties(table_id: UUID) -> dict[str, str]:
    return {ICT_PROPERTY: "true", TABLE_ID_PROPERTY: str(table_id)}


def is_derived(key: str) -> bool:
    return key in DERIVED_KEYS or key.startswith(FEATURE_PREFIX)


# -- config ------------------------------------------------------------------------------------------------------


def negotiate(versions: str) -> str:
    """The spec, Get Configuration: `versions` lists the highest version the client supports per major version
    (`1.1,2.3`); the answer is the highest both support. This server speaks 1.0 only."""
    majors = []
    for raw in versions.split(","):
        major, dot, minor = raw.strip().partition(".")
        if not (major.isdigit() and dot and minor.isdigit()):
            raise BadRequest(f"protocol-versions must be comma-separated versions such as 1.0, got {raw!r}")
        majors.append(int(major))
    if 1 not in majors:
        raise BadRequest(f"no protocol version in common: the client supports {versions!r}, this server "
                         f"{PROTOCOL_VERSION}")
    return PROTOCOL_VERSION


# -- protocol, properties, domain metadata ---------------------------------------------------------------------


def check_protocol(protocol: Protocol, where: str) -> None:
    """The managed-table contract's protocol: at least the required versions and features."""
    problems = []
    if protocol.min_reader_version < REQUIRED_PROTOCOL["min-reader-version"]:
        problems.append(f"min-reader-version >= 3 (found {protocol.min_reader_version})")
    if protocol.min_writer_version < REQUIRED_PROTOCOL["min-writer-version"]:
        problems.append(f"min-writer-version >= 7 (found {protocol.min_writer_version})")
    problems += [f"reader feature {f}" for f in REQUIRED_PROTOCOL["reader-features"]
                 if f not in protocol.reader_features]
    problems += [f"writer feature {f}" for f in REQUIRED_PROTOCOL["writer-features"]
                 if f not in protocol.writer_features]
    if problems:
        raise BadRequest(f"{where} lacks what a Unity Catalog managed table requires: " + "; ".join(problems))


def _with_protocol(props: dict[str, str], protocol: Protocol) -> None:
    """The protocol's projection into the properties, in place of any earlier one (set-protocol replaces it)."""
    for key in [k for k in props if k.startswith(FEATURE_PREFIX)]:
        del props[key]
    props["delta.minReaderVersion"] = str(protocol.min_reader_version)
    props["delta.minWriterVersion"] = str(protocol.min_writer_version)
    for feature in {*protocol.reader_features, *protocol.writer_features}:
        props[FEATURE_PREFIX + feature] = "supported"


def features(props: Mapping[str, str]) -> set[str]:
    return {k[len(FEATURE_PREFIX):] for k, v in props.items() if k.startswith(FEATURE_PREFIX) and v == "supported"}


def _check_domain(name: str, value: Any, where: str) -> None:
    if not name:
        raise BadRequest(f"{where}: a domain needs a name")
    if name not in DOMAINS:
        return   # any other domain is the client's (Delta PROTOCOL.md): kept as sent
    _, key, _ = DOMAINS[name]
    field = value.get(key)
    if name == CLUSTERING:
        ok = isinstance(field, list) and all(
            isinstance(path, list) and path and all(isinstance(p, str) and p for p in path) for path in field)
        if not ok:
            raise BadRequest(f"{where}.{name}.clusteringColumns must be a list of column paths (lists of names)")
    elif isinstance(field, bool) or not isinstance(field, int) or field < -1:
        raise BadRequest(f"{where}.{name}.rowIdHighWaterMark must be an integer >= -1")


def _with_domains(props: dict[str, str], domains: Mapping[str, Any], where: str) -> None:
    """Each spec domain's projection into the properties (the spec's synthetic keys), and the writer features it
    needs checked against the protocol after the request."""
    have = features(props)
    for name, (needs, key, prop) in DOMAINS.items():
        props.pop(prop, None)
        if name not in domains:
            continue
        missing = [f for f in needs if f not in have]
        if missing:
            raise BadRequest(f"{where}: domain {name} needs the writer features {', '.join(missing)} in the "
                             f"protocol")
        value = domains[name][key]
        props[prop] = orjson.dumps(value).decode() if name == CLUSTERING else str(value)


def _check_partition_columns(partition_columns: list[str], columns: list[dict[str, Any]], where: str) -> None:
    names = {c["name"].lower() for c in columns}
    unknown = [p for p in partition_columns if p.lower() not in names]
    if unknown:
        raise BadRequest(f"{where}: partition columns {', '.join(map(repr, unknown))} are not columns of the table")
    if len({p.lower() for p in partition_columns}) != len(partition_columns):
        raise BadRequest(f"{where}: a partition column is named twice")


def uniform_enabled(props: Mapping[str, str]) -> bool:
    return "iceberg" in [f.strip().lower() for f in props.get(UNIFORM_PROPERTY, "").split(",")]


def uniform_record(location: str, uniform, version: int, current: Mapping[str, Any] | None) -> dict[str, Any]:
    """v1's `uniform` (the spec, DeltaUniformMetadata) checked, as the catalog keeps it (the preview API's shape,
    its timestamp an ISO-8601 instant), so both APIs read one conversion record."""
    ice = uniform.iceberg
    if not is_within(location, ice.metadata_location):
        raise BadRequest(f"uniform.iceberg.metadata-location {ice.metadata_location!r} is not under the table "
                         f"location {location!r}")
    if ice.converted_delta_version != version:
        raise BadRequest(f"uniform.iceberg.converted-delta-version {ice.converted_delta_version} must be the "
                         f"committed version {version}")
    if ice.converted_delta_timestamp <= 0:
        raise BadRequest("uniform.iceberg.converted-delta-timestamp must be positive (epoch milliseconds)")
    base = ice.base_converted_delta_version
    if base is not None:
        stored = (current or {}).get("iceberg", {}).get("converted_delta_version")
        if base != stored:
            raise RequirementFailed(f"uniform.iceberg.base-converted-delta-version {base} does not match the "
                                    f"stored converted-delta-version {stored}: reload the table and convert from it")
    instant = datetime.fromtimestamp(ice.converted_delta_timestamp / 1000, tz=timezone.utc)
    record = {"metadata_location": ice.metadata_location, "converted_delta_version": version,
              "converted_delta_timestamp": instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")}
    if base is not None:
        record["base_converted_delta_version"] = base
    return {"iceberg": record}


# -- createTable -------------------------------------------------------------------------------------------------


def create_entry(table_id: UUID, body: CreateTable, location: str) -> tuple[list[dict], dict[str, str], dict]:
    """The spec, Create a Table: the declared protocol, properties, domain metadata and UniForm hold the managed
    table contract. Returns the columns, the properties as the catalog keeps them (what the client sent, less the
    keys the server derives, plus their projections and the stamps of version 0) and v1's own entry fields."""
    check_protocol(body.protocol, "protocol")
    columns = column_infos_of(body.columns.fields, "columns")
    _check_partition_columns(body.partition_columns, columns, "partition-columns")
    props = {k: v for k, v in body.properties.items() if not is_derived(k)}
    wanted = required_properties(table_id)
    wrong = [f"{k} = {v} (found {props.get(k)!r})" for k, v in wanted.items()
             if (props.get(k) or "").lower() != v.lower()]
    if wrong:
        raise BadRequest("properties lack the required properties of a Unity Catalog managed table: "
                         + "; ".join(wrong))
    _with_protocol(props, body.protocol)
    for name, value in body.domain_metadata.items():
        _check_domain(name, value, "domain-metadata")
    _with_domains(props, body.domain_metadata, "domain-metadata")
    if body.last_commit_timestamp_ms <= 0:
        raise BadRequest("last-commit-timestamp-ms must be positive (epoch milliseconds of version 0)")
    props[STAMP_PROPERTIES[0]] = "0"
    props[STAMP_PROPERTIES[1]] = str(body.last_commit_timestamp_ms)
    check_required_properties(table_id, props, "properties")
    extra: dict[str, Any] = {"delta_protocol": body.protocol.to_json(), "domain_metadata": body.domain_metadata,
                             "partition_columns": body.partition_columns}
    if body.uniform is not None and not uniform_enabled(props):   # (none: the service converts, as on commits)
        raise BadRequest(f"uniform is for tables whose properties enable UniForm ({UNIFORM_PROPERTY} including "
                         f"iceberg)")
    if body.uniform is not None:
        extra["uniform"] = uniform_record(location, body.uniform, 0, None)
    return columns, props, extra


# -- the table as loadTable answers it ---------------------------------------------------------------------------


def etag(info: Mapping[str, Any]) -> str:
    """The spec: an opaque token that changes on every metadata change and on nothing else (not on a data-only
    commit, a backfill or a UniForm conversion). A digest of the metadata, so that it needs no counter kept in
    step by both APIs, and reads the same after a restart (keys sorted: PostgreSQL's jsonb reorders them)."""
    metadata = [info.get(k) for k in ("columns", "properties", "comment", "partition_columns", "delta_protocol",
                                      "domain_metadata")]
    digest = hashlib.blake2b(orjson.dumps(metadata, option=orjson.OPT_SORT_KEYS), digest_size=12).digest()
    return base64.urlsafe_b64encode(digest).decode()


# The etag and columns of recent catalog entries: an entry is immutable and stays the same object across data-only
# commits and backfills, so each table's are computed once per metadata change rather than on every commit's
# answer. Bounded (at most _MAX_VIEWS entries are kept alive by it; then it starts afresh).
_VIEWS: dict[int, tuple[Mapping[str, Any], str, dict[str, Any]]] = {}
_MAX_VIEWS = 1024


def _metadata_view(info: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    hit = _VIEWS.get(id(info))
    if hit is not None and hit[0] is info:
        return hit[1], hit[2]
    if len(_VIEWS) >= _MAX_VIEWS:
        _VIEWS.clear()
    view = _VIEWS[id(info)] = (info, etag(info), struct_of(info.get("columns") or []))
    return view[1], view[2]


def commit_json(commit: Mapping[str, Any]) -> dict[str, Any]:
    return {"version": commit["version"], "timestamp": commit["timestamp"], "file-name": commit["file_name"],
            "file-size": commit["file_size"], "file-modification-timestamp": commit["file_modification_timestamp"]}


def _uniform_json(uniform: Mapping[str, Any]) -> dict[str, Any]:
    ice = uniform["iceberg"]
    ts = datetime.fromisoformat(ice["converted_delta_timestamp"].replace("Z", "+00:00"))
    out = {"metadata-location": ice["metadata_location"], "converted-delta-version": ice["converted_delta_version"],
           "converted-delta-timestamp": int(ts.timestamp() * 1000)}
    if ice.get("base_converted_delta_version") is not None:
        out["base-converted-delta-version"] = ice["base_converted_delta_version"]
    return {"iceberg": out}


def check_served(table: DeltaTable) -> None:
    if table.info["data_source_format"] != "DELTA":
        raise UnsupportedFormat(f"table {'.'.join(table.full_name)} is a {table.info['data_source_format']} table: "
                                f"this API serves Delta tables; read it through Unity Catalog's table API")


def load_response(table: DeltaTable) -> dict[str, Any]:
    """The spec, Load a Table: the metadata, its etag, every ratified commit not yet backfilled (newest first) and
    the latest version, all from one state of the table. A table whose commits the catalog does not coordinate
    (EXTERNAL) has no commits or latest version."""
    check_served(table)
    info = table.info
    props = info.get("properties") or {}
    tag, columns = _metadata_view(info)
    metadata: dict[str, Any] = {
        "etag": tag, "table-type": info["table_type"], "table-uuid": str(table.table_id),
        "location": info["storage_location"], "created-time": info["created_at"], "updated-time": info["updated_at"],
        "columns": columns, "partition-columns": info.get("partition_columns", []), "properties": props}
    if "comment" in info:
        metadata["comment"] = info["comment"]
    stamp_version, stamp_time = (props.get(k) for k in STAMP_PROPERTIES)
    if stamp_version is not None and stamp_version.isdigit():
        metadata["last-commit-version"] = int(stamp_version)
    if stamp_time is not None and stamp_time.isdigit():
        metadata["last-commit-timestamp-ms"] = int(stamp_time)
    answer: dict[str, Any] = {"metadata": metadata}
    if table.last >= 0:
        answer["commits"] = [commit_json(c) for c in reversed(table.unpublished)]
        answer["latest-table-version"] = table.last
    if info.get("uniform"):
        answer["uniform"] = _uniform_json(info["uniform"])
    return answer


# -- updateTable -------------------------------------------------------------------------------------------------


def check_shape(req: UpdateTable) -> None:
    """The spec's request shape rules that span actions (each holds before anything is compared with the table)."""
    if "assert-table-uuid" not in req.requirements:
        raise MalformedRequest("requirements must hold an assert-table-uuid requirement (every request)")
    u = req.updates
    if "set-properties" in u and "remove-properties" in u:
        both = set(u["set-properties"].updates) & set(u["remove-properties"].removals)
        if both:
            raise BadRequest(f"set-properties and remove-properties both touch {', '.join(sorted(both))}")
    if "set-domain-metadata" in u and "remove-domain-metadata" in u:
        both = set(u["set-domain-metadata"].updates) & set(u["remove-domain-metadata"].domains)
        if both:
            raise BadRequest(f"set-domain-metadata and remove-domain-metadata both touch {', '.join(sorted(both))}")
    for name in ("set-properties", "remove-properties"):
        if name in u:
            keys = u[name].updates if name == "set-properties" else u[name].removals
            derived = sorted(k for k in keys if is_derived(k))
            if derived:
                raise BadRequest(f"{name} touches keys the server derives ({', '.join(derived)}): the protocol is "
                                 f"set by set-protocol, domains by set-domain-metadata, and the stamps by the "
                                 f"catalog")
    if "add-commit" not in u:
        alone = [name for name in NEEDS_COMMIT if name in u]
        if alone:
            raise BadRequest(f"{', '.join(alone)} changes what the Delta log records: send it with the add-commit "
                             f"whose staged commit carries the change")
    if "update-metadata-snapshot-version" in u:
        raise BadRequest("update-metadata-snapshot-version is for external tables, which this server does not "
                         "serve through this API")


def commit_info(add: AddCommit) -> CommitInfo:
    """The add-commit's DeltaCommit as the preview API's rules read a commit."""
    c = add.commit
    ci = CommitInfo(version=c.version, timestamp=c.timestamp, file_name=c.file_name, file_size=c.file_size,
                    file_modification_timestamp=c.file_modification_timestamp)
    check_commit_info(ci)
    return ci


def check_requirement_uuid(table: DeltaTable, req: UpdateTable) -> None:
    expected = req.requirements["assert-table-uuid"].uuid
    try:
        same = UUID(expected) == table.table_id
    except ValueError:
        same = False
    if not same:
        raise RequirementFailed(f"assert-table-uuid failed: table {'.'.join(table.full_name)} is "
                                f"{table.table_id}, not {expected!r}; reload the table")


def decide_update(table: DeltaTable, req: UpdateTable, *, max_unpublished: int, now_ms: int) -> DeltaTable:
    """The spec, Write a Commit: the table after every update of `req`, applied together (or `table` itself for a
    replay of an accepted add-commit: the whole request is then a no-op answered 200, as UC's server and delta.yaml
    answer it). Raises when anything is refused, and then nothing of the request applies."""
    check_served(table)
    check_requirement_uuid(table, req)
    u = req.updates
    add: AddCommit | None = u.get("add-commit")
    backfill = u.get("set-latest-backfilled-version")
    if (add is not None or backfill is not None) and not table.managed:
        raise BadRequest(f"table {'.'.join(table.full_name)} is {table.info['table_type']}: the catalog "
                         f"coordinates commits only for MANAGED tables")
    ci = commit_info(add) if add is not None else None
    if ci is not None and is_replay(table, ci):
        return table
    wanted = req.requirements.get("assert-etag")
    if wanted is not None and wanted.etag != _metadata_view(table.info)[0]:
        raise RequirementFailed(f"assert-etag failed: the metadata of {'.'.join(table.full_name)} changed since "
                                f"etag {wanted.etag!r}; reload the table and retry with its etag")
    new = ratify(table, ci) if ci is not None else table
    if backfill is not None:
        new = record_published(table, new, backfill.latest_published_version)
    if ci is not None:
        check_backpressure(table, new, max_unpublished)
    changes_metadata = any(name in u for name in METADATA_UPDATES)
    if not changes_metadata and (add is None or add.uniform is None):
        return new   # most requests: a data-only commit or a backfill leaves the catalog entry as it is
    info = _apply_metadata(dict(new.info), table, u, ci, now_ms) if changes_metadata else dict(new.info)
    enabled = uniform_enabled(info.get("properties") or {})
    if add is None and enabled != uniform_enabled(table.info["properties"]):
        raise BadRequest("UniForm is enabled or disabled only in the commit that flips "
                         f"{UNIFORM_PROPERTY}: send set-properties or remove-properties with that add-commit")
    # A writer's own conversion (`uniform`) rides on its commit; a writer that sends none leaves the conversion to
    # the service (coordinator/uniform), as the preview API does, where the spec would refuse the commit.
    if add is not None and add.uniform is not None:
        if not enabled:
            raise BadRequest("add-commit.uniform is for tables whose properties after this request enable UniForm "
                             f"({UNIFORM_PROPERTY} including iceberg)")
        info["uniform"] = uniform_record(table.location, add.uniform, ci.version, table.info.get("uniform"))
    if not enabled:
        info.pop("uniform", None)
    return replace(new, info=freeze(info)) if info != new.info else new


def _apply_metadata(info: dict[str, Any], table: DeltaTable, u: Mapping[str, Any], ci: CommitInfo | None,
                    now_ms: int) -> dict[str, Any]:
    """The metadata updates, in the spec's fixed order whatever order they were sent in, then the managed-table
    contract checked against the state after all of them ("validated against the post-apply state")."""
    props = dict(info.get("properties") or {})
    if "set-protocol" in u:
        protocol = u["set-protocol"].protocol
        if table.managed:
            check_protocol(protocol, "set-protocol.protocol")
        _with_protocol(props, protocol)
        info["delta_protocol"] = protocol.to_json()
    if "set-properties" in u:
        props.update(u["set-properties"].updates)
    if "remove-properties" in u:
        for key in u["remove-properties"].removals:
            props.pop(key, None)
    if "set-columns" in u:
        info["columns"] = column_infos_of(u["set-columns"].columns.fields, "set-columns.columns")
    if "set-partition-columns" in u:
        info["partition_columns"] = list(u["set-partition-columns"].partition_columns)
    if "set-columns" in u or "set-partition-columns" in u:
        _check_partition_columns(list(info.get("partition_columns", [])), info.get("columns") or [],
                                 "partition-columns")
    if "set-table-comment" in u:
        info["comment"] = u["set-table-comment"].comment
    domains = dict(info.get("domain_metadata") or {})
    if "set-domain-metadata" in u:
        for name, value in u["set-domain-metadata"].updates.items():
            _check_domain(name, value, "set-domain-metadata.updates")
            domains[name] = value
    if "remove-domain-metadata" in u:
        for name in u["remove-domain-metadata"].domains:
            domains.pop(name, None)
    if "set-domain-metadata" in u or "remove-domain-metadata" in u or "set-protocol" in u:
        _with_domains(props, domains, "domain metadata")
        info["domain_metadata"] = domains
    if ci is not None:
        props[STAMP_PROPERTIES[0]] = str(ci.version)
        props[STAMP_PROPERTIES[1]] = str(ci.timestamp)
    if table.managed:
        check_required_properties(table.table_id, props, "the table's properties after this request")
    info["properties"] = props
    info["updated_at"] = now_ms
    return info
