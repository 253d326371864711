"""Unity Catalog's Delta API v1.0 (`/delta/v1`) end to end through unitycatalog-client 0.7.0's own v1 client
(`unitycatalog.delta`, its gaps filled by tests/delta/uc_delta_client.py), over real HTTP, against real Delta log
files: configuration, staging, creation, load, commits, conflicts, a stale etag, a replay, backfill, the
unbackfilled-commit limit and recovery from it, metadata updates, credentials, metrics, rename, delete. The same
table is read and committed through the preview API (`/delta/preview/commits`) too: one table, one history."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid

import httpx
import pytest
from unitycatalog.delta.models.delta_add_commit_update import DeltaAddCommitUpdate
from unitycatalog.delta.models.delta_assert_etag import DeltaAssertEtag
from unitycatalog.delta.models.delta_assert_table_uuid import DeltaAssertTableUUID
from unitycatalog.delta.models.delta_commit import DeltaCommit
from unitycatalog.delta.models.delta_create_staging_table_request import DeltaCreateStagingTableRequest
from unitycatalog.delta.models.delta_create_table_request import DeltaCreateTableRequest
from unitycatalog.delta.models.delta_primitive_type import DeltaPrimitiveType
from unitycatalog.delta.models.delta_protocol import DeltaProtocol
from unitycatalog.delta.models.delta_rename_table_request import DeltaRenameTableRequest
from unitycatalog.delta.models.delta_report_metrics_request import DeltaReportMetricsRequest
from unitycatalog.delta.models.delta_set_latest_backfilled_version_update import (
    DeltaSetLatestBackfilledVersionUpdate)
from unitycatalog.delta.models.delta_set_properties_update import DeltaSetPropertiesUpdate
from unitycatalog.delta.models.delta_set_table_comment_update import DeltaSetTableCommentUpdate
from unitycatalog.delta.models.delta_struct_field import DeltaStructField
from unitycatalog.delta.models.delta_struct_field_metadata import DeltaStructFieldMetadata
from unitycatalog.delta.models.delta_struct_type import DeltaStructType
from unitycatalog.delta.models.delta_update_table_request import DeltaUpdateTableRequest

from .conftest import FIRST, PREFIX, UC, commit_log, first_commit, write_log_file
from .uc_delta_client import (ApiException, DeltaConfigurationApi, DeltaTablesApi, DeltaTemporaryCredentialsApi,
                              delta_client, error_of)

C, S = "main", "default"
LIMIT = 3   # delta_max_unpublished_commits in these tests


@pytest.fixture
def config(config):
    return dataclasses.replace(config, delta_max_unpublished_commits=LIMIT)


def _now() -> int:
    return int(time.time() * 1000)


def staged(version: int) -> DeltaCommit:
    now = _now()
    return DeltaCommit(version=version, timestamp=now, file_name=f"{version:020d}.{uuid.uuid4()}.json",
                       file_size=512, file_modification_timestamp=now)


def update(table_id: str, *updates, etag: str | None = None) -> DeltaUpdateTableRequest:
    requirements = [DeltaAssertTableUUID(type="assert-table-uuid", uuid=table_id)]
    if etag is not None:
        requirements.append(DeltaAssertEtag(type="assert-etag", etag=etag))
    return DeltaUpdateTableRequest(requirements=requirements, updates=list(updates))


def add(commit: DeltaCommit) -> DeltaAddCommitUpdate:
    return DeltaAddCommitUpdate(action="add-commit", commit=commit)


def backfill(version: int) -> DeltaSetLatestBackfilledVersionUpdate:
    return DeltaSetLatestBackfilledVersionUpdate(action="set-latest-backfilled-version",
                                                 latest_published_version=version)


COLUMNS = DeltaStructType(type="struct", fields=[
    DeltaStructField(name="id", type=DeltaPrimitiveType(type="long"), nullable=True,
                     metadata=DeltaStructFieldMetadata()),
    DeltaStructField(name="name", type=DeltaPrimitiveType(type="string"), nullable=True,
                     metadata=DeltaStructFieldMetadata())])


async def create(tables: DeltaTablesApi, name: str, schema: str = S, check=None) -> tuple[dict, dict]:
    """createStagingTable, a real 0.json at its location as the answer asks for, createTable. (staging, table)
    `check(staging)` runs before the table is created."""
    st = await tables.create_staging_table(C, schema, DeltaCreateStagingTableRequest(name=name))
    if check is not None:
        await check(st)
    required = st["required-protocol"]
    ict = _now()
    write_log_file(st["location"], FIRST, first_commit(st["table-id"], ict=ict,
                                                      reader_features=required["reader-features"],
                                                      writer_features=required["writer-features"]))
    loaded = await tables.create_table(C, schema, DeltaCreateTableRequest(
        name=name, location=st["location"], table_type="MANAGED", columns=COLUMNS,
        protocol=DeltaProtocol(**{k.replace("-", "_"): v for k, v in required.items()}),
        properties={k: v for k, v in st["required-properties"].items()}, last_commit_timestamp_ms=ict))
    return st, loaded


def run(main) -> None:
    asyncio.run(main())


def test_the_managed_table_lifecycle_through_the_v1_client(service, database_url):
    uc = UC(service)
    uc.setup_schema(C, S)

    async def main() -> None:
        async with delta_client(service) as api:
            config = await DeltaConfigurationApi(api).get_config(C, "1.3,2.0")
            assert config["protocol-version"] == "1.0"
            assert "POST /v1/catalogs/{catalog}/schemas/{schema}/tables/{table}" in config["endpoints"]
            tables = DeltaTablesApi(api)
            creds = DeltaTemporaryCredentialsApi(api)

            async def refresh(st: dict) -> None:
                assert st["table-type"] == "MANAGED" and st["storage-credentials"][0]["operation"] == "READ_WRITE"
                refreshed = await creds.get_staging_table_credentials(st["table-id"])
                assert refreshed["storage-credentials"][0]["prefix"] == st["location"]

            st, loaded = await create(tables, "events", check=refresh)
            table_id = st["table-id"]
            with pytest.raises(ApiException) as finalized:   # a staging table no more
                await creds.get_staging_table_credentials(table_id)
            assert error_of(finalized.value)["type"] == "NoSuchTableException"
            meta = loaded["metadata"]
            assert meta["table-uuid"] == table_id and loaded["latest-table-version"] == 0
            assert loaded["commits"] == []
            assert [f["name"] for f in meta["columns"]["fields"]] == ["id", "name"]
            assert meta["columns"]["fields"][0]["type"] == "long"
            assert meta["properties"]["delta.feature.catalogManaged"] == "supported"
            assert meta["last-commit-version"] == 0
            etag = meta["etag"]
            assert await tables.table_exists(C, S, "events") is None

            # three commits: each answered with the table after it, newest first; data-only keeps the etag
            sent = [staged(v) for v in (1, 2, 3)]
            for commit in sent:
                answer = await tables.update_table(C, S, "events", update(table_id, add(commit), etag=etag))
                assert answer["latest-table-version"] == commit.version
                assert answer["metadata"]["etag"] == etag
            loaded = await tables.load_table(C, S, "events")
            assert [c["file-name"] for c in loaded["commits"]] == [c.file_name for c in reversed(sent)]

            # the limit: a fourth unbackfilled commit is refused (429) and changes nothing
            with pytest.raises(ApiException) as refused:
                await tables.update_table(C, S, "events", update(table_id, add(staged(4))))
            assert refused.value.status == 429 and error_of(refused.value)["type"] == "ResourceExhaustedException"
            # recovery: backfill and commit in one request, applied together
            answer = await tables.update_table(C, S, "events", update(table_id, backfill(3), add(staged(4))))
            assert answer["latest-table-version"] == 4 and [c["version"] for c in answer["commits"]] == [4]

            # a replay of the accepted file is answered as applied (200), never as a second version
            replay = sent[2]
            answer = await tables.update_table(C, S, "events", update(table_id, add(replay)))
            assert answer["latest-table-version"] == 4
            # another file for a taken version: a version conflict
            with pytest.raises(ApiException) as conflict:
                await tables.update_table(C, S, "events", update(table_id, add(staged(4))))
            assert conflict.value.status == 409
            assert error_of(conflict.value)["type"] == "CommitVersionConflictException"
            # a version gap: the client's error, nothing applied
            with pytest.raises(ApiException) as gap:
                await tables.update_table(C, S, "events", update(table_id, add(staged(9))))
            assert gap.value.status == 400

            # a metadata change moves the etag; the old one then fails as a requirement (409, told apart)
            answer = await tables.update_table(C, S, "events", update(
                table_id, DeltaSetTableCommentUpdate(action="set-table-comment", comment="events of the day"),
                etag=etag))
            assert answer["metadata"]["etag"] != etag and answer["metadata"]["comment"] == "events of the day"
            with pytest.raises(ApiException) as stale:
                await tables.update_table(C, S, "events", update(
                    table_id, DeltaSetPropertiesUpdate(action="set-properties", updates={"team": "a"}),
                    add(staged(5)), etag=etag))
            assert stale.value.status == 409
            assert error_of(stale.value)["type"] == "UpdateRequirementConflictException"
            with pytest.raises(ApiException) as wrong_uuid:
                await tables.update_table(C, S, "events", update(str(uuid.uuid4()), add(staged(5))))
            assert error_of(wrong_uuid.value)["type"] == "UpdateRequirementConflictException"
            assert (await tables.load_table(C, S, "events"))["latest-table-version"] == 4   # nothing applied

            answer = await tables.update_table(C, S, "events", update(
                table_id, DeltaSetPropertiesUpdate(action="set-properties", updates={"team": "a"}),
                add(staged(5)), etag=answer["metadata"]["etag"]))
            assert answer["metadata"]["properties"]["team"] == "a"
            assert answer["metadata"]["last-commit-version"] == 5

            read = await creds.get_table_credentials("READ", C, S, "events")
            assert read["storage-credentials"][0]["prefix"] == st["location"]
            await tables.report_metrics(C, S, "events", DeltaReportMetricsRequest.from_dict(
                {"table-id": table_id, "report": {"commit-report": {"num-files-added": 2}}}))

            await tables.rename_table(C, S, "events", DeltaRenameTableRequest(new_name="events2"))
            with pytest.raises(ApiException) as gone:
                await tables.load_table(C, S, "events")
            assert gone.value.status == 404 and error_of(gone.value)["type"] == "NoSuchTableException"
            assert (await tables.load_table(C, S, "events2"))["metadata"]["table-uuid"] == table_id
            await tables.delete_table(C, S, "events2")
            with pytest.raises(ApiException) as gone:
                await tables.table_exists(C, S, "events2")
            assert gone.value.status == 404

    run(main)


def test_one_table_one_history_across_the_two_apis(service, database_url):
    """A table created through v1 is read and committed through the preview API, and one created through the
    preview API through v1: each sees every commit the other ratified, in one sequence of versions."""
    uc = UC(service)
    uc.setup_schema(C, S)
    preview = uc.create_managed("old_style")

    async def main() -> None:
        async with delta_client(service) as api:
            tables = DeltaTablesApi(api)
            st, _ = await create(tables, "new_style")
            table_id = st["table-id"]
            await tables.update_table(C, S, "new_style", update(table_id, add(staged(1))))
            # the preview API commits version 2 of the v1 table, and reads both
            body = {"table_id": table_id, "table_uri": st["location"],
                    "commit_info": {"version": 2, "timestamp": _now(), "file_name": f"{2:020d}.{uuid.uuid4()}.json",
                                    "file_size": 10, "file_modification_timestamp": _now()}}
            r = httpx.post(service + PREFIX + "/delta/preview/commits", json=body)
            assert r.status_code == 200, r.text
            got = uc.commits({"table_id": table_id, "storage_location": st["location"]})
            assert got["latest_table_version"] == 2 and [c["version"] for c in got["commits"]] == [1, 2]
            loaded = await tables.load_table(C, S, "new_style")
            assert loaded["latest-table-version"] == 2
            assert loaded["commits"][0]["file-name"] == body["commit_info"]["file_name"]

            # the preview table through v1: loaded, committed, then read back through the preview API
            loaded = await tables.load_table(C, S, "old_style")
            assert loaded["metadata"]["table-uuid"] == preview["table_id"] and loaded["latest-table-version"] == 0
            commit = staged(1)
            await tables.update_table(C, S, "old_style", update(preview["table_id"], add(commit)))
            got = uc.commits(preview)
            assert [c["file_name"] for c in got["commits"]] == [commit.file_name]
            assert uc.commit(preview, 2).status_code == 200
            assert (await tables.load_table(C, S, "old_style"))["latest-table-version"] == 2

    run(main)
    assert sorted(commit_log(database_url, preview["table_id"])) == [0, 1, 2]
