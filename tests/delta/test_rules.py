"""The Delta rules without a server: each rule of the seed (UC Managed Tables 0.1.0) and the catalog-managed RFC,
accepted and refused, asserting the typed error the rule raises."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from coordinator.delta import rules
from coordinator.delta.models import CommitInfo, CommitRequest, Metadata, MetricsRequest, Uniform
from coordinator.delta.state import DeltaTable, StagingTable, freeze, table_info
from coordinator.errors import (BadRequest, CommitConflict, FailedPrecondition, NoSuchTable, TableExists,
                                TooManyRequests, VersionPublished)

from .conftest import first_commit, table_properties

TID = uuid.UUID("9c12d441-03fe-4693-9a96-a0705ddf69c1")
LOC = "s3://bucket/wh/__unitystorage/tables/9c12d441-03fe-4693-9a96-a0705ddf69c1"
FULL = ("main", "default", "t")
T0 = 1_704_067_400_000


def table(last: int = 0, published: int = 0, *, table_type: str = "MANAGED", fmt: str = "DELTA",
          properties: dict[str, str] | None = None) -> DeltaTable:
    """A table ratified up to `last`, published up to `published`; version v's file is `v.json`."""
    info = table_info(TID, FULL, table_type, fmt, [], LOC, None, properties or table_properties(str(TID)), T0, "me")
    commits = tuple(ci(v).to_json() for v in range(published + 1, last + 1))
    newest = ci(last).to_json() if last >= 0 else None
    return DeltaTable(TID, freeze(info), last, published, commits, newest)


def ci(version: int, file_name: str | None = None, **kw) -> CommitInfo:
    fields = dict(version=version, timestamp=T0 + version, file_name=file_name or f"{version}.json",
                  file_size=100, file_modification_timestamp=T0 + version)
    return CommitInfo(**{**fields, **kw})


def request(commit: CommitInfo | None = None, **kw) -> CommitRequest:
    return CommitRequest(table_id=str(TID), table_uri=kw.pop("table_uri", LOC), commit_info=commit, **kw)


def decide(t: DeltaTable, req: CommitRequest, max_unpublished: int = 50) -> DeltaTable:
    return rules.decide_commit(t, req, max_unpublished=max_unpublished, now_ms=T0 + 10_000)


# -- names and locations ------------------------------------------------------------------------------------------


def test_check_name():
    assert rules.check_name("table", "orders_2024") == "orders_2024"
    for bad in ["", "a.b", "a/b", "a b", "a\x00", "x" * 256]:
        with pytest.raises(BadRequest):
            rules.check_name("table", bad)


def test_split_full_name():
    assert rules.split_full_name("main.default.t", 3, "table") == FULL
    for bad in ["main.default", "main..t", "a.b.c.d"]:
        with pytest.raises(BadRequest):
            rules.split_full_name(bad, 3, "table")


def test_normalize_uri_and_is_within():
    assert rules.normalize_uri("file:/p/q") == rules.normalize_uri("file:///p/q/") == rules.normalize_uri("/p/q")
    assert rules.normalize_uri("s3a://b/p/") == "s3://b/p"
    assert rules.is_within("s3://b/wh", "s3a://b/wh/t")
    assert not rules.is_within("s3://b/wh", "s3://b/wh2")


def test_table_uri_matches_however_spelled():
    rules.check_table_uri(table(), LOC.replace("s3://", "s3a://") + "/")
    with pytest.raises(BadRequest):
        rules.check_table_uri(table(), "s3://bucket/elsewhere")


# -- which table a request reaches --------------------------------------------------------------------------------


def test_require_table():
    t = table()
    assert rules.require_table(t, str(TID)) is t
    staging = StagingTable(TID, *FULL, LOC, T0, "s1")
    for state in (None, staging, {"iceberg": "metadata"}):
        with pytest.raises(NoSuchTable):
            rules.require_table(state, str(TID))


def test_table_named():
    t = table()
    assert rules.table_named(t, FULL) is t
    with pytest.raises(NoSuchTable):   # the id now carries another name (dropped and re-created)
        rules.table_named(t, ("main", "default", "other"))
    with pytest.raises(NoSuchTable):
        rules.table_named(None, FULL)


def test_require_managed():
    rules.require_managed(table(), LOC)
    with pytest.raises(BadRequest):
        rules.require_managed(table(-1, -1, table_type="EXTERNAL"), LOC)
    with pytest.raises(BadRequest):
        rules.require_managed(table(-1, -1, fmt="PARQUET"), LOC)
    with pytest.raises(BadRequest):
        rules.require_managed(table(), "s3://bucket/other")


def test_unused_staging():
    staging = StagingTable(TID, *FULL, LOC, T0, "s1")
    assert rules.unused_staging(staging, FULL, LOC, "s1") is staging
    assert rules.unused_staging(replace(staging, schema_id=None), FULL, LOC, "s1")   # rows from before schema ids
    with pytest.raises(TableExists):       # the same create again
        rules.unused_staging(table(), FULL, LOC, "s1")
    with pytest.raises(BadRequest) as used:
        rules.unused_staging(table(), ("main", "default", "u"), LOC, "s1")
    assert type(used.value) is BadRequest
    with pytest.raises(NoSuchTable):
        rules.unused_staging(None, FULL, LOC, "s1")
    with pytest.raises(BadRequest):        # allocated for another name
        rules.unused_staging(staging, ("main", "default", "u"), LOC, "s1")
    with pytest.raises(NoSuchTable):       # its schema was deleted and made again since
        rules.unused_staging(staging, FULL, LOC, "s2")


# -- required properties ------------------------------------------------------------------------------------------


def test_required_properties():
    props = table_properties(str(TID))
    rules.check_required_properties(TID, props, "properties")
    rules.check_required_properties(TID, {**props, rules.ICT_PROPERTY: "TRUE"}, "properties")
    refused = [
        {**props, rules.TABLE_ID_PROPERTY: str(uuid.uuid4())},
        {k: v for k, v in props.items() if k != rules.TABLE_ID_PROPERTY},
        {**props, rules.ICT_PROPERTY: "false"},
        {**props, "delta.feature.catalogManaged": "enabled"},
        {k: v for k, v in props.items() if k != "delta.feature.vacuumProtocolCheck"},
        {**props, "delta.minReaderVersion": "2"},
        {**props, "delta.minWriterVersion": "+7"},
        {**props, "delta.lastUpdateVersion": "-1"},
    ]
    for bad in refused:
        with pytest.raises(BadRequest):
            rules.check_required_properties(TID, bad, "properties")


# -- commits ------------------------------------------------------------------------------------------------------


def test_commit_request_shape():
    rules.check_commit_request(request(ci(1)))
    rules.check_commit_request(request(latest_published_version=0))
    rules.check_commit_request(request(latest_published_version=1, latest_backfilled_version=1))
    refused = [
        request(),                                                            # neither a commit nor a report
        request(None, latest_published_version=0, metadata=Metadata(description="d")),
        request(None, latest_published_version=0, uniform=Uniform.model_validate(
            {"iceberg": {"metadata_location": LOC + "/m.json", "converted_delta_version": 1,
                         "converted_delta_timestamp": "2026-01-01T00:00:00Z"}})),
        request(latest_published_version=1, latest_backfilled_version=0),    # the two spellings disagree
    ]
    for req in refused:
        with pytest.raises(BadRequest):
            rules.check_commit_request(req)


def test_commit_info_is_valid():
    rules.check_commit_info(ci(1))
    rules.check_commit_info(ci(3, "00000000000000000003.8d5a4e8c-1c1b-4d35-9a5c-0d7e6c1f1a2b.json"))
    refused = [ci(0), ci(1, timestamp=0), ci(1, file_size=0), ci(1, file_modification_timestamp=-1),
               ci(1, "a/1.json"), ci(1, ".."), ci(1, "1.txt"), ci(1, "x" * 252 + ".json"),
               ci(1, "00000000000000000002.8d5a.json")]   # names another version
    for bad in refused:
        with pytest.raises(BadRequest):
            rules.check_commit_info(bad)


def test_ratified_reads_memory():
    t = table(last=3, published=1)
    assert rules.ratified(t, 2)["file_name"] == "2.json"
    assert rules.ratified(t, 3)["file_name"] == "3.json"
    assert rules.ratified(t, 1) is None   # published: no longer in memory


def test_replay_and_version_taken():
    t = table(last=3, published=1)
    assert not rules.is_replay(t, ci(4))
    assert rules.is_replay(t, ci(3))                   # the same file again: its answer was lost
    assert rules.is_replay(t, ci(2))
    with pytest.raises(CommitConflict) as taken:       # ratified as another file
        rules.is_replay(t, ci(2, "other.json"))
    assert type(taken.value) is CommitConflict
    with pytest.raises(VersionPublished):              # published and gone from memory: the caller reads the log
        rules.is_replay(t, ci(1))


def test_ratify_next_version_only():
    t = table(last=2, published=0)
    new = rules.ratify(t, ci(3))
    assert (new.last, new.newest["version"], [c["version"] for c in new.unpublished]) == (3, 3, [1, 2, 3])
    for skipped in (4, 10):
        with pytest.raises(BadRequest):
            rules.ratify(t, ci(skipped))


def test_record_published():
    before = table(last=3, published=0)
    new = rules.record_published(before, before, 2)
    assert (new.published, [c["version"] for c in new.unpublished]) == (2, [3])
    assert rules.record_published(new, new, 1) is new   # an older report changes nothing
    with pytest.raises(BadRequest):
        rules.record_published(before, before, -1)
    with pytest.raises(BadRequest):
        rules.record_published(before, before, 4)
    # Against the table before this request's commit: the version being ratified cannot be published yet.
    with pytest.raises(BadRequest):
        rules.record_published(before, rules.ratify(before, ci(4)), 4)


def test_backpressure():
    before = table(last=2, published=0)
    rules.check_backpressure(before, rules.ratify(before, ci(3)), max_unpublished=3)
    with pytest.raises(TooManyRequests):
        rules.check_backpressure(before, rules.ratify(before, ci(3)), max_unpublished=2)


def test_decide_commit():
    t = table(last=1, published=0)
    new = decide(t, request(ci(2), latest_published_version=1))
    assert (new.last, new.published, [c["version"] for c in new.unpublished]) == (2, 1, [2])
    assert new.info is t.info                                     # no metadata: the entry is not copied
    assert decide(new, request(ci(2), latest_published_version=1)) is new   # a replay changes nothing
    assert decide(t, request(latest_published_version=0)) is t              # a report that tells nothing new
    with pytest.raises(BadRequest):                               # rule order: the table first
        decide(t, request(ci(2), table_uri="s3://bucket/other"))
    with pytest.raises(TooManyRequests):
        decide(t, request(ci(2)), max_unpublished=1)
    with pytest.raises(BadRequest):   # a version skipped: refused, its published part with it
        decide(t, request(ci(5), latest_published_version=1))


def test_metadata_change():
    t = table(last=1, published=0)
    props = {k: v for k, v in table_properties(str(TID)).items() if not k.startswith("delta.feature.")}
    md = Metadata.model_validate({"description": "orders", "properties": {**props, "owner.team": "x"},
                                  "schema": [{"name": "id", "type": "long", "nullable": False}]})
    new = decide(t, request(ci(2), metadata=md))
    assert new.info["comment"] == "orders"
    assert new.info["columns"][0]["name"] == "id"
    assert new.info["properties"]["owner.team"] == "x"
    assert new.info["properties"]["delta.feature.catalogManaged"] == "supported"   # carried over from the entry
    assert new.info["properties"]["delta.lastUpdateVersion"] == "2"                 # stamped by the catalog
    assert new.info["updated_at"] == T0 + 10_000
    without_props = decide(t, request(ci(2), metadata=Metadata(description="d")))
    assert without_props.info["properties"][rules.TABLE_ID_PROPERTY] == str(TID)
    assert without_props.info["properties"]["delta.lastUpdateVersion"] == "2"
    with pytest.raises(BadRequest):   # properties must still make it a catalog-managed table
        decide(t, request(ci(2), metadata=Metadata(properties={**props, rules.ICT_PROPERTY: "false"})))


def test_uniform():
    t = table(last=1, published=0)
    ice = {"metadata_location": LOC + "/metadata/v2.metadata.json", "converted_delta_version": 2,
           "converted_delta_timestamp": "2026-02-09T17:00:00.000000Z"}
    new = decide(t, request(ci(2), uniform=Uniform.model_validate({"iceberg": ice})))
    assert new.info["uniform"]["iceberg"]["converted_delta_version"] == 2
    refused = [{**ice, "metadata_location": "s3://bucket/elsewhere/v2.metadata.json"},
               {**ice, "converted_delta_version": 1},
               {**ice, "base_converted_delta_version": 3},
               {**ice, "converted_delta_timestamp": "2026-02-09T17:00:00"},   # no zone: not an instant
               {**ice, "converted_delta_timestamp": "yesterday"}]
    for bad in refused:
        with pytest.raises(BadRequest):
            rules.check_uniform(t, Uniform.model_validate({"iceberg": bad}), ci(2))


# -- reading commits, metrics, credentials ------------------------------------------------------------------------


def test_commits_page():
    t = table(last=4, published=1)
    commits, latest = rules.commits_page(t, LOC, 0, None, 100)
    assert ([c["version"] for c in commits], latest) == ([2, 3, 4], 4)
    commits, latest = rules.commits_page(t, LOC, 3, 3, 100)
    assert ([c["version"] for c in commits], latest) == ([3], 4)
    commits, _ = rules.commits_page(t, LOC, 0, None, 2)
    assert [c["version"] for c in commits] == [2, 3]   # a short page: ask again from the next version
    assert rules.commits_page(table(-1, -1, table_type="EXTERNAL"), LOC, 0, None, 100) == ([], -1)
    for start, end, uri in [(-1, None, LOC), (3, 2, LOC), (0, None, "s3://bucket/other")]:
        with pytest.raises(BadRequest):
            rules.commits_page(t, uri, start, end, 100)


def metrics(**report) -> MetricsRequest:
    return MetricsRequest.model_validate({"table_id": str(TID), "table_uri": LOC,
                                          "report": {"commit_report": report}})


def test_check_metrics():
    t = table(last=2, published=0)
    hist = {"sorted_bin_boundaries": [0, 1024], "file_counts": [1, 2], "total_bytes": [10, 4000]}
    rules.check_metrics(t, metrics(commit_version=0, num_files_added=3, file_size_histogram=hist))
    rules.check_metrics(t, MetricsRequest(table_id=str(TID), table_uri=LOC))
    refused = [metrics(num_files_added=1), metrics(commit_version=3), metrics(commit_version=1, num_rows_removed=-1),
               metrics(commit_version=1, file_size_histogram={**hist, "total_bytes": None}),
               metrics(commit_version=1, file_size_histogram={**hist, "file_counts": [1]}),
               metrics(commit_version=1, file_size_histogram={**hist, "sorted_bin_boundaries": [1, 1024]}),
               metrics(commit_version=1, file_size_histogram={**hist, "sorted_bin_boundaries": [0, 0]}),
               metrics(commit_version=1, file_size_histogram={**hist, "file_counts": [1, -2]})]
    for bad in refused:
        with pytest.raises(BadRequest):
            rules.check_metrics(t, bad)
    with pytest.raises(BadRequest):
        rules.check_metrics(table(-1, -1, table_type="EXTERNAL"), metrics(commit_version=0))


def test_temporary_credentials():
    keys = {"access_key_id": "AK", "secret_access_key": "SK", "session_token": "ST"}
    expires = 1_700_000_000_000
    assert rules.temporary_credentials("/data/t", "READ", None, expires) == {"url": "/data/t",
                                                                            "expiration_time": expires}
    assert rules.temporary_credentials("file:///data/t", "READ", None, expires) == {"url": "file:///data/t",
                                                                                   "expiration_time": expires}
    assert rules.temporary_credentials(LOC, "READ_WRITE", keys, expires) == {"url": LOC, "expiration_time": expires,
        "aws_temp_credentials": {"access_key_id": "AK", "secret_access_key": "SK", "session_token": "ST"}}
    for location, operation in [("/data/t", "UNKNOWN_TABLE_OPERATION"), ("", "READ"), ("/a\x00b", "READ"),
                                ("file:data/t", "READ")]:
        with pytest.raises(BadRequest) as refused:
            rules.temporary_credentials(location, operation, None, expires)
        assert type(refused.value) is BadRequest
    for location, keys_given in [(LOC, None), ("gs://bucket/t", keys)]:
        with pytest.raises(FailedPrecondition):   # valid, but nothing this service may vend for it
            rules.temporary_credentials(location, "READ", keys_given, expires)


# -- creating a managed table -------------------------------------------------------------------------------------


def test_first_commit():
    record = rules.check_first_commit(TID, first_commit(str(TID), ict=T0))
    assert (record["version"], record["timestamp"], record["file_name"]) == (0, T0, rules.FIRST_COMMIT_FILE)
    refused = [
        b"not json\n",
        b"[1, 2]\n",
        first_commit(str(uuid.uuid4()), ict=T0),                              # names another table
        first_commit(str(TID), reader=2),
        first_commit(str(TID), writer=6),
        first_commit(str(TID), reader_features=("catalogManaged",)),
        first_commit(str(TID), writer_features=("catalogManaged", "vacuumProtocolCheck")),
        first_commit(str(TID), configuration={"io.unitycatalog.tableId": str(TID)}),   # no in-commit timestamps
        first_commit(str(TID), commit_info=False),
    ]
    for data in refused:
        with pytest.raises(BadRequest):
            rules.check_first_commit(TID, data)
