"""End to end with `unitycatalog-client` 0.7 (async, aiohttp) over real HTTP, against real Delta log files.

Delta's Spark/Java jars are in no package reachable from these machines, so `DeltaWriter` below does what
Delta's `UCCommitCoordinatorClient` (delta-io/delta, storage/.../uccommitcoordinator) does, step by step:
list `_delta_log` for the last backfilled version, write `_delta_log/_staged_commits/<v>.<uuid>.json`, send
the commit with that version as `latest_backfilled_version`, on 429 backfill everything and report it before
retrying, then copy ratified commits to `_delta_log/<v>.json` (put-if-absent) and report the backfill.

unitycatalog-client's own `get_commits` cannot work against any server: aiohttp sends no body on a GET and
the generated method has no query parameters, so the table id never leaves the client (asserted below). The
writer builds the same GET through the client's ApiClient with query parameters instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path

import asyncpg
import pytest
from unitycatalog.client import (ApiClient, ApiException, CatalogsApi, Configuration, DeltaCommitsApi, SchemasApi,
                                 TablesApi, TemporaryCredentialsApi)
from unitycatalog.client.models import (ColumnInfo, ColumnInfos, CreateCatalog, CreateSchema, CreateStagingTable,
                                        CreateTable, DataSourceFormat, DeltaCommit, DeltaCommitInfo,
                                        DeltaCommitMetadataProperties, DeltaGetCommits, DeltaGetCommitsResponse,
                                        DeltaMetadata, GenerateTemporaryPathCredential,
                                        GenerateTemporaryTableCredential, PathOperation, TableOperation, TableType,
                                        UpdateCatalog, UpdateSchema)

from .conftest import FIRST, PREFIX, first_commit, local_path, table_properties, write_log_file


def client_for(base_url: str) -> ApiClient:
    return ApiClient(Configuration(host=base_url + PREFIX))


async def get_commits(api: ApiClient, table_id: str, table_uri: str, start: int | None = None,
                      end: int | None = None) -> DeltaGetCommitsResponse:
    """GET /delta/preview/commits through the client's own request machinery, parameters in the query."""
    query = [("table_id", table_id), ("table_uri", table_uri)]
    if start is not None:
        query.append(("start_version", start))
    if end is not None:
        query.append(("end_version", end))
    request = api.param_serialize(method="GET", resource_path="/delta/preview/commits", query_params=query,
                                  header_params={"Accept": "application/json"})
    response = await api.call_api(*request)
    await response.read()
    return api.response_deserialize(response, {"200": "DeltaGetCommitsResponse"}).data


def _now_ms() -> int:
    return int(time.time() * 1000)


class DeltaWriter:
    """A Delta writer on a catalog-managed table, following UCCommitCoordinatorClient's commit protocol."""

    def __init__(self, api: ApiClient, table_id: str, location: str):
        self.api = api
        self.commits = DeltaCommitsApi(api)
        self.table_id = table_id
        self.root = local_path(location)
        self.log = self.root / "_delta_log"
        self.table_uri = "file:" + str(self.root)   # Hadoop's Path.toUri() spelling
        self.last_ict = 0
        self.limit_hits = 0   # 429s answered with a full backfill

    def last_known_backfilled_version(self, commit_version: int) -> int:
        """`getLastKnownBackfilledVersion`: list published delta files from `commit_version - 100`."""
        start = max(0, commit_version - 100)
        versions = [int(p.name[:20]) for p in self.log.glob("*.json") if p.name[:20].isdigit()
                    and len(p.name) == 25 and int(p.name[:20]) >= start]
        return max(versions)

    def stage(self, version: int, actions: list[dict]) -> Path:
        path = self.log / "_staged_commits" / f"{version:020d}.{uuid.uuid4()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(json.dumps(a).encode() + b"\n" for a in actions))
        return path

    def actions(self, version: int) -> list[dict]:
        self.last_ict = max(_now_ms(), self.last_ict + 1)   # in-commit timestamps increase strictly
        return [{"commitInfo": {"inCommitTimestamp": self.last_ict, "timestamp": self.last_ict,
                                "operation": "WRITE", "txnId": str(uuid.uuid4())}},
                {"add": {"path": f"part-{version:05d}-{uuid.uuid4()}.parquet", "partitionValues": {},
                         "size": 1000 + version, "modificationTime": self.last_ict, "dataChange": True}}]

    async def commit(self, version: int, *, metadata: DeltaMetadata | None = None) -> str:
        lkbv = self.last_known_backfilled_version(version)
        staged = self.stage(version, self.actions(version))
        stat = staged.stat()
        info = DeltaCommitInfo(version=version, timestamp=self.last_ict, file_name=staged.name,
                               file_size=stat.st_size, file_modification_timestamp=int(stat.st_mtime * 1000))
        while True:
            try:
                await self.commits.commit(DeltaCommit(table_id=self.table_id, table_uri=self.table_uri,
                                                      commit_info=info, latest_backfilled_version=lkbv,
                                                      metadata=metadata))
                return staged.name
            except ApiException as exc:
                if exc.status != 429:
                    raise
                self.limit_hits += 1
                # CommitLimitReachedException: attemptFullBackfill, report it, retry the same commit.
                await self.backfill_to_version(version - 1, lkbv)
                lkbv = self.last_known_backfilled_version(version)
                await self.report_backfill(lkbv)

    async def backfill_to_version(self, version: int, last_known_backfilled: int) -> None:
        """`backfillToVersion`: ask UC for the ratified commits and publish each in order, put-if-absent."""
        resp = await get_commits(self.api, self.table_id, self.table_uri, last_known_backfilled, version)
        for c in sorted(resp.commits, key=lambda c: c.version):
            target = self.log / f"{c.version:020d}.json"
            data = (self.log / "_staged_commits" / c.file_name).read_bytes()
            try:
                with open(target, "xb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            except FileExistsError:
                pass

    async def report_backfill(self, version: int) -> None:
        await self.commits.commit(DeltaCommit(table_id=self.table_id, table_uri=self.table_uri,
                                              latest_backfilled_version=version))


async def create_catalog_managed_table(api: ApiClient, name: str) -> tuple[dict, str]:
    await CatalogsApi(api).create_catalog(CreateCatalog(name="main", comment="end to end"))
    await SchemasApi(api).create_schema(CreateSchema(name="default", catalog_name="main"))
    tables = TablesApi(api)
    staging = await tables.create_staging_table(CreateStagingTable(name=name, catalog_name="main",
                                                                   schema_name="default"))
    write_log_file(staging.staging_location, FIRST, first_commit(staging.id))
    columns = [ColumnInfo(name="id", type_name="LONG", type_text="bigint", position=0),
               ColumnInfo(name="name", type_name="STRING", type_text="string", position=1)]
    info = await tables.create_table(CreateTable(
        name=name, catalog_name="main", schema_name="default", table_type=TableType.MANAGED,
        data_source_format=DataSourceFormat.DELTA, columns=columns, storage_location=staging.staging_location,
        properties=table_properties(staging.id)))
    assert info.table_id == staging.id and info.storage_location == staging.staging_location
    return info.to_dict(), staging.staging_location


def test_two_hundred_commits_like_delta(service):
    async def main() -> None:
        async with client_for(service) as api:
            info, location = await create_catalog_managed_table(api, "events")
            table_id = info["table_id"]
            got = await TablesApi(api).get_table("main.default.events")
            assert got.table_type == TableType.MANAGED and got.properties["io.unitycatalog.tableId"] == table_id
            listed = await TablesApi(api).list_tables(catalog_name="main", schema_name="default")
            assert [t.name for t in listed.tables] == ["events"]

            # The client's own get_commits sends no table id at all (no GET body in aiohttp): a clear 400.
            with pytest.raises(ApiException) as refused:
                await DeltaCommitsApi(api).get_commits(DeltaGetCommits(table_id=table_id, table_uri=location,
                                                                       start_version=0))
            assert refused.value.status == 400
            assert json.loads(refused.value.body)["error_code"] == "INVALID_PARAMETER_VALUE"

            writer = DeltaWriter(api, table_id, location)
            fresh = await get_commits(api, table_id, writer.table_uri)
            assert fresh.commits == [] and fresh.latest_table_version == 0

            ratified: dict[int, str] = {}
            for v in range(1, 201):
                metadata = None
                if v == 100:   # a schema/comment change, in unitycatalog-client's DeltaMetadata shape
                    metadata = DeltaMetadata(
                        description="events, now with a note",
                        var_schema=ColumnInfos(columns=[ColumnInfo(name="id", type_name="LONG"),
                                                        ColumnInfo(name="note", type_name="STRING")]),
                        properties=DeltaCommitMetadataProperties(properties=table_properties(table_id)))
                lkbv = writer.last_known_backfilled_version(v)
                ratified[v] = await writer.commit(v, metadata=metadata)

                # Right after the commit: v is the latest, and it is among the unpublished commits UC serves.
                resp = await get_commits(api, table_id, writer.table_uri)
                assert resp.latest_table_version == v
                versions = [c.version for c in resp.commits]
                assert versions == list(range(versions[0], v + 1)) and versions[0] > 0
                assert {c.version: c.file_name for c in resp.commits}.items() <= ratified.items()

                if 150 <= v < 170:
                    continue   # a writer that stops publishing: the limit (10) makes it backfill, via 429
                await writer.backfill_to_version(v, lkbv)
                if v % 5:
                    await writer.report_backfill(v)
                    resp = await get_commits(api, table_id, writer.table_uri)
                    assert resp.commits == [] and resp.latest_table_version == v
                # else: the next commit's latest_backfilled_version (from listing) reports it.

            assert writer.limit_hits == 2   # at versions 160 and 170, after ten unpublished each time
            final = await get_commits(api, table_id, writer.table_uri)
            assert final.latest_table_version == 200 and [c.version for c in final.commits] == [200]
            await writer.report_backfill(200)
            assert (await get_commits(api, table_id, writer.table_uri)).commits == []

            # The published log is the ratified history, version by version.
            log = local_path(location) / "_delta_log"
            for v, name in ratified.items():
                assert (log / f"{v:020d}.json").read_bytes() == (log / "_staged_commits" / name).read_bytes()
            table = await TablesApi(api).get_table("main.default.events")
            assert table.comment == "events, now with a note" and [c.name for c in table.columns] == ["id", "note"]

    asyncio.run(main())


def test_catalog_updates_then_credentials_for_the_staging_table_and_the_table(service):
    """Catalog and schema updates through the client; then, as engines do before they touch a table's files,
    temporary credentials for the staging table (written before the table exists) and the table. Local files need
    none: the answer names the location and holds no credential. An object-store path outside the warehouse gets a
    clear refusal."""
    async def main() -> None:
        async with client_for(service) as api:
            creds = TemporaryCredentialsApi(api)
            await CatalogsApi(api).create_catalog(CreateCatalog(name="main"))
            await SchemasApi(api).create_schema(CreateSchema(name="default", catalog_name="main"))
            updated = await CatalogsApi(api).update_catalog("main", UpdateCatalog(comment="lake",
                                                                                  properties={"team": "data"}))
            assert updated.comment == "lake" and updated.properties == {"team": "data"}
            updated = await SchemasApi(api).update_schema("main.default", UpdateSchema(comment="tables"))
            assert updated.comment == "tables" and updated.full_name == "main.default"
            staging = await TablesApi(api).create_staging_table(CreateStagingTable(
                name="t", catalog_name="main", schema_name="default"))
            got = await creds.generate_temporary_table_credentials(GenerateTemporaryTableCredential(
                table_id=staging.id, operation=TableOperation.READ_WRITE))
            assert got.url == staging.staging_location and got.aws_temp_credentials is None

            write_log_file(staging.staging_location, FIRST, first_commit(staging.id))
            info = await TablesApi(api).create_table(CreateTable(
                name="t", catalog_name="main", schema_name="default", table_type=TableType.MANAGED,
                data_source_format=DataSourceFormat.DELTA, storage_location=staging.staging_location,
                columns=[ColumnInfo(name="id", type_name="LONG", type_text="bigint", position=0)],
                properties=table_properties(staging.id)))
            got = await creds.generate_temporary_table_credentials(GenerateTemporaryTableCredential(
                table_id=info.table_id, operation=TableOperation.READ))
            assert got.url == info.storage_location

            got = await creds.generate_temporary_path_credentials(GenerateTemporaryPathCredential(
                url=info.storage_location, operation=PathOperation.PATH_READ))
            assert got.url == info.storage_location
            with pytest.raises(ApiException) as refused:
                await creds.generate_temporary_path_credentials(GenerateTemporaryPathCredential(
                    url="s3://bucket/tables/t", operation=PathOperation.PATH_READ_WRITE))
            assert refused.value.status == 400
            assert json.loads(refused.value.body)["error_code"] == "FAILED_PRECONDITION"

    asyncio.run(main())


def test_eight_writers_race_for_each_version(service, database_url):
    """Exactly one writer wins each version; losers get 409 and retry at latest + 1; no 5xx, no gaps."""
    target = 120

    async def main() -> None:
        async with client_for(service) as api:
            info, location = await create_catalog_managed_table(api, "race")
        table_id = info["table_id"]
        uri = "file:" + str(local_path(location))
        wins: list[tuple[int, str]] = []
        statuses: dict[int, int] = {}

        async def writer(n: int) -> None:
            async with client_for(service) as api:
                commits = DeltaCommitsApi(api)
                while True:
                    latest = (await get_commits(api, table_id, uri)).latest_table_version
                    if latest >= target:
                        return
                    v = latest + 1
                    name = f"{v:020d}.{uuid.uuid4()}.json"
                    now = _now_ms()
                    try:
                        await commits.commit(DeltaCommit(table_id=table_id, table_uri=uri, commit_info=DeltaCommitInfo(
                            version=v, timestamp=now, file_name=name, file_size=100 + n,
                            file_modification_timestamp=now)))
                    except ApiException as exc:
                        statuses[exc.status] = statuses.get(exc.status, 0) + 1
                        if exc.status == 429:   # everyone ratified is "published" in this test's world
                            await commits.commit(DeltaCommit(table_id=table_id, table_uri=uri,
                                                             latest_backfilled_version=latest))
                        elif exc.status != 409:
                            raise
                        continue
                    wins.append((v, name))
                    await commits.commit(DeltaCommit(table_id=table_id, table_uri=uri, latest_backfilled_version=v))

        await asyncio.gather(*(writer(n) for n in range(8)))
        assert sorted(v for v, _ in wins) == list(range(1, target + 1))
        assert set(statuses) <= {409, 429} and statuses.get(409, 0) > 0, statuses

        # The store agrees: each version ratified once, by the writer that was told it won.
        con = await asyncpg.connect(database_url)
        try:
            rows = await con.fetch("SELECT version, payload FROM commits WHERE table_id = $1 ORDER BY version",
                                   uuid.UUID(table_id))
        finally:
            await con.close()
        stored = {r["version"]: json.loads(r["payload"])["file_name"] for r in rows}
        assert stored == {0: FIRST, **dict(wins)}

    asyncio.run(main())
