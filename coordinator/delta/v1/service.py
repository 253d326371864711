"""Unity Catalog's Delta API v1.0 (`/delta/v1`) over the Delta service: the same catalogs, schemas, tables, table
actors and commit log as the preview API (coordinator/delta/service.py), so every table is served by both.

What a request is answered with is built here from the table's state (rules.load_response); the rules that decide
are in rules.py, the proposals the actors run in proposals.py.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from ...auth import CALLER
from ...errors import AppliedReplyLost, BadRequest, CommitConflict, VersionPublished
from .. import rules as preview_rules
from ..files import read_first_commit
from ..models import (CommitReport, CreateStagingTable, FileSizeHistogram, GenerateTemporaryPathCredential,
                      MetricsRequest, Report)
from ..proposals import CheckStaging, LoadTable
from ..rules import FullName
from ..service import _expiration_ms, now_ms
from . import rules
from .models import CreateTable, ReportMetrics, UpdateTable as UpdateRequest
from .proposals import CreateFromStagingV1, RenameTable, StagingLocation, UpdateTable

if TYPE_CHECKING:
    from ..service import DeltaService

_TABLE = "/v1/catalogs/{catalog}/schemas/{schema}/tables/{table}"
# What `GET /delta/v1/config` advertises for protocol version 1.0: every endpoint api/delta/v1/routes.py serves.
ENDPOINTS = ("POST /v1/catalogs/{catalog}/schemas/{schema}/staging-tables",
             "POST /v1/catalogs/{catalog}/schemas/{schema}/tables",
             f"GET {_TABLE}", f"POST {_TABLE}", f"DELETE {_TABLE}", f"HEAD {_TABLE}", f"POST {_TABLE}/rename",
             f"GET {_TABLE}/credentials", f"POST {_TABLE}/metrics",
             "GET /v1/staging-tables/{table_id}/credentials", "GET /v1/temporary-path-credentials")

_PATH_OPERATIONS = {"READ": "PATH_READ", "READ_WRITE": "PATH_READ_WRITE"}


def storage_credentials(vended: dict[str, Any], operation: str) -> dict[str, Any]:
    """What the preview API vends for a location (preview rules.temporary_credentials) in v1's shape: one
    `DeltaStorageCredential` for the location, its provider's keys (none for a local path) under `config`."""
    config: dict[str, str] = {}
    aws = vended.get("aws_temp_credentials")
    if aws:
        config = {"s3.access-key-id": aws["access_key_id"], "s3.secret-access-key": aws["secret_access_key"]}
        if aws.get("session_token"):
            config["s3.session-token"] = aws["session_token"]
    return {"storage-credentials": [{"prefix": vended["url"], "operation": operation,
                                     "expiration-time-ms": vended["expiration_time"], "config": config}]}


class DeltaV1:
    def __init__(self, delta: DeltaService):
        self.delta = delta
        self.registry = delta.registry
        self.store = delta.store

    # -- configuration and credentials ---------------------------------------------------------------------------

    async def config(self, catalog: str, versions: str) -> dict[str, Any]:
        await self.delta.get_catalog(catalog)
        return {"endpoints": list(ENDPOINTS), "protocol-version": rules.negotiate(versions)}

    def _credentials(self, location: str, operation: str) -> dict[str, Any]:
        vended = preview_rules.temporary_credentials(location, operation, self.delta._s3_keys(location),
                                                     _expiration_ms())
        return storage_credentials(vended, operation)

    async def staging_credentials(self, raw_table_id: str) -> dict[str, Any]:
        try:
            table_id = uuid.UUID(raw_table_id)
        except ValueError:
            raise BadRequest(f"table_id must be a UUID, got {raw_table_id!r}") from None
        location = await self.registry.submit(table_id, StagingLocation(raw_table_id, CALLER.get()))
        return self._credentials(location, "READ_WRITE")

    async def table_credentials(self, full: FullName, operation: str) -> dict[str, Any]:
        table = await self._load(full)
        return self._credentials(table.location, operation)

    async def path_credentials(self, location: str, operation: str) -> dict[str, Any]:
        vended = await self.delta.temporary_path_credentials(GenerateTemporaryPathCredential(
            url=location, operation=_PATH_OPERATIONS[operation]))
        return storage_credentials(vended, operation)

    # -- staging tables and tables -------------------------------------------------------------------------------

    async def create_staging_table(self, catalog: str, schema: str, name: str) -> dict[str, Any]:
        staging = await self.delta.create_staging_table(CreateStagingTable(name=name, catalog_name=catalog,
                                                                          schema_name=schema))
        table_id, location = uuid.UUID(staging["id"]), staging["staging_location"]
        return {"table-id": str(table_id), "table-type": "MANAGED", "location": location,
                **{"storage-credentials": self._credentials(location, "READ_WRITE")["storage-credentials"]},
                "required-protocol": rules.REQUIRED_PROTOCOL, "suggested-protocol": rules.SUGGESTED_PROTOCOL,
                "required-properties": rules.required_properties(table_id),
                "suggested-properties": rules.SUGGESTED_PROPERTIES}

    async def create_table(self, catalog: str, schema: str, body: CreateTable) -> dict[str, Any]:
        """The spec, Create a Table: the staging table allocated at `body.location` (by this caller) becomes the
        table at version 0, once the declarations hold the managed-table contract and agree with the `0.json`
        written there (read as the preview API reads it)."""
        if body.table_type != "MANAGED":
            raise BadRequest("table-type EXTERNAL is not served through this API: create external tables through "
                             "Unity Catalog's table API (POST /api/2.1/unity-catalog/tables)")
        delta = self.delta
        schema_id = await delta._check_new_name(catalog, schema, body.name)
        full = (catalog, schema, body.name)
        table_id = delta._staging_id(body.location, await delta._managed_root(catalog))
        staging = await self.registry.submit(table_id, CheckStaging(full, body.location, schema_id))
        columns, props, extra = rules.create_entry(table_id, body, staging.location)
        first = preview_rules.check_first_commit(table_id, await read_first_commit(delta.files, staging.location))
        table = await self.registry.submit(table_id, CreateFromStagingV1(
            full, body.location, schema_id, first, columns, body.comment, props, now_ms(), CALLER.get(), extra))
        delta.names.remember(full, table_id)
        return rules.load_response(table)

    async def _load(self, full: FullName):
        return await self.delta.names.submit(full, lambda: LoadTable(full))

    async def load_table(self, full: FullName) -> dict[str, Any]:
        return rules.load_response(await self._load(full))

    async def table_exists(self, full: FullName) -> None:
        await self._load(full)   # any table of the name (the spec: format-agnostic)

    async def delete_table(self, full: FullName) -> None:
        await self.delta.delete_table(full)

    async def rename_table(self, full: FullName, new_name: str) -> None:
        catalog, schema, name = full
        await self.delta._check_new_name(catalog, schema, new_name)
        table = await self.delta.names.submit(full, lambda: RenameTable(full, new_name, now_ms(), CALLER.get()))
        self.delta.names.forget(full)
        self.delta.names.remember((catalog, schema, new_name), table.table_id)
        self.delta.securables.forget(table.table_id)   # its grants are now the new name's

    # -- commits and metrics -------------------------------------------------------------------------------------

    async def update_table(self, full: FullName, req: UpdateRequest) -> dict[str, Any]:
        """The spec, Write a Commit: all of `req` applied together by the table's actor, through the commit path
        the preview API's commits take; answered with the table after it (loadTable's answer)."""
        rules.check_shape(req)
        max_unpublished = self.delta.config.delta_max_unpublished_commits
        try:
            table = await self.delta.names.submit(full, lambda: UpdateTable(full, req, max_unpublished, now_ms()))
        except AppliedReplyLost:
            table = await self._load(full)   # applied (its receipt is stored): the table after it is the answer
        except VersionPublished as exc:
            table = await self._replay_of_published(full, req, exc)
        return rules.load_response(table)

    async def _replay_of_published(self, full: FullName, req: UpdateRequest, exc: VersionPublished):
        """The add-commit's version was ratified and backfilled long enough ago to have left memory: the stored
        log tells a replay of that very file (answered as applied, the table as it is now) from a conflict."""
        commit = req.updates["add-commit"].commit
        table = await self._load(full)
        entries = await self.store.read_log(table.table_id, start=commit.version, end=commit.version)
        found = entries[0].payload.get("file_name") if entries else None
        if found == commit.file_name:
            return table
        raise CommitConflict(f"{exc.message}; version {commit.version} was ratified as {found or 'an earlier commit'}: "
                             f"rebuild the snapshot and retry at version {table.last + 1}") from None

    async def report_metrics(self, full: FullName, body: ReportMetrics) -> None:
        """The spec, Report Metrics: the body names the path's table; the report is kept as the preview API keeps
        its reports, for the commit its histogram names (else the table's latest)."""
        table = await self._load(full)
        preview_rules.require_managed(table, table.location)
        if body.table_id.lower() != str(table.table_id):
            raise BadRequest(f"table-id {body.table_id!r} is not the table at {'.'.join(full)} ({table.table_id})")
        sent = body.report.commit_report if body.report is not None else None
        report = None
        if sent is not None:
            hist = sent.file_size_histogram
            fields = sent.model_dump(exclude={"file_size_histogram"}, exclude_none=True)
            report = Report(commit_report=CommitReport(
                commit_version=hist.commit_version if hist is not None and hist.commit_version is not None
                else table.last, **fields,
                file_size_histogram=None if hist is None else FileSizeHistogram(
                    sorted_bin_boundaries=hist.sorted_bin_boundaries, file_counts=hist.file_counts,
                    total_bytes=hist.total_bytes)))
        await self.delta.write_metrics(MetricsRequest(table_id=str(table.table_id), table_uri=table.location,
                                                      report=report))
