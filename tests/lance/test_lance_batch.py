"""`table/batch-commit` and `table/version/batch-create` with the spec's own generated client over real HTTP:
order, mixed operations across tables, and all-or-nothing."""

from __future__ import annotations

import json
import re

import pytest
from lance_namespace_urllib3_client import (BatchCommitTablesRequest, BatchCreateTableVersionsRequest,
                                            BatchDeleteTableVersionsRequest, CommitTableOperation,
                                            CreateNamespaceRequest, CreateTableVersionEntry,
                                            CreateTableVersionRequest, DeclareTableRequest, DeregisterTableRequest,
                                            MetadataApi, NamespaceApi, TableApi, VersionRange)
from lance_namespace_urllib3_client.exceptions import ApiException

from coordinator.lance.layout import manifest_name

from .conftest import local, stage


@pytest.fixture
def api(rest):
    NamespaceApi(rest).create_namespace("db", CreateNamespaceRequest())
    return TableApi(rest), MetadataApi(rest)


def declare(api, name: str, **kw) -> str:
    return api[0].declare_table(f"db${name}", DeclareTableRequest(**kw)).location


def versions(api, name: str) -> list[int] | None:
    try:
        return [v.version for v in api[1].list_table_versions(f"db${name}").versions]
    except ApiException as exc:
        assert exc.status == 404
        return None


def op_create(name: str, version: int, path: str) -> CommitTableOperation:
    return CommitTableOperation(create_table_version=CreateTableVersionRequest(
        id=["db", name], version=version, manifest_path=path))


def error_of(exc: ApiException) -> dict:
    body = json.loads(exc.body)
    assert set(body) >= {"error", "code", "detail", "instance"}
    return body


def test_mixed_operations_apply_in_request_order(api, config):
    table, meta = api
    a, b, d = declare(api, "a"), declare(api, "b"), declare(api, "d")
    meta.create_table_version("db$a", CreateTableVersionRequest(version=1, manifest_path=stage(a, 1)))
    c_loc = config.warehouse_uri + "/db/c-chosen"
    ops = [
        op_create("a", 2, stage(a, 2)),
        CommitTableOperation(declare_table=DeclareTableRequest(id=["db", "c"], location=c_loc)),
        op_create("c", 1, stage(c_loc, 1)),                       # a table declared by this batch
        CommitTableOperation(delete_table_versions=BatchDeleteTableVersionsRequest(
            id=["db", "a"], ranges=[VersionRange(start_version=1, end_version=2)])),
        op_create("b", 1, stage(b, 1)),
        CommitTableOperation(deregister_table=DeregisterTableRequest(id=["db", "d"])),
        CommitTableOperation(declare_table=DeclareTableRequest(id=["db", "d"])),   # the name is free again
    ]
    results = table.batch_commit_tables(BatchCommitTablesRequest(operations=ops)).results
    assert results[0].create_table_version.version.version == 2
    assert results[1].declare_table.location == c_loc and results[1].declare_table.managed_versioning
    assert results[2].create_table_version.version.manifest_path.endswith(manifest_name(1, "V2"))
    assert results[3].delete_table_versions.deleted_count == 1
    assert results[4].create_table_version.version.version == 1
    assert results[5].deregister_table.location == d
    assert results[6].declare_table.location != d
    assert {n: versions(api, n) for n in "abcd"} == {"a": [2], "b": [1], "c": [1], "d": []}
    assert local(results[2].create_table_version.version.manifest_path).exists()


def test_a_conflict_in_the_last_operation_leaves_every_table_unchanged(api):
    table, meta = api
    locs = {n: declare(api, n) for n in "abd"}
    for n in "ab":
        meta.create_table_version(f"db${n}", CreateTableVersionRequest(version=1, manifest_path=stage(locs[n], 1)))
    before = {n: versions(api, n) for n in "abcd"}
    staged = {n: stage(locs[n], 2) for n in "ab"}
    ops = [op_create("a", 2, staged["a"]), op_create("b", 2, staged["b"]),
           CommitTableOperation(declare_table=DeclareTableRequest(id=["db", "c"])),
           CommitTableOperation(deregister_table=DeregisterTableRequest(id=["db", "d"])),
           op_create("a", 2, stage(locs["a"], 2))]              # another writer's version 2 of a
    with pytest.raises(ApiException) as info:
        table.batch_commit_tables(BatchCommitTablesRequest(operations=ops))
    body = error_of(info.value)
    assert info.value.status == 409 and body["code"] == 14 and body["error"].startswith("operation 4 ")
    assert {n: versions(api, n) for n in "abcd"} == before
    for n in "ab":
        final = locs[n].removeprefix("file:///") + "/_versions/" + manifest_name(2, "V2")
        assert not local(final).exists(), "a refused batch writes no final manifest"
        assert local(staged[n]).exists(), "the writer's staged manifest is left to the writer"


REFUSED = [
    (lambda l: [CommitTableOperation(declare_table=DeclareTableRequest(id=["db", "a"]))], 409, 5, "operation 0 "),
    (lambda l: [CommitTableOperation(declare_table=DeclareTableRequest(id=["db", "n"])),
                CommitTableOperation(declare_table=DeclareTableRequest(id=["db", "n"]))], 409, 5, "operation 1 "),
    (lambda l: [CommitTableOperation(declare_table=DeclareTableRequest(id=["db", "n"])),
                CommitTableOperation(deregister_table=DeregisterTableRequest(id=["db", "n"]))], 400, 13,
     "operation 1 "),
    (lambda l: [op_create("a", 2, stage(l, 2)), op_create("zz", 1, "x")], 404, 4, "operation 1 "),
    (lambda l: [op_create("a", 2, stage(l, 2)),
                CommitTableOperation(declare_table=DeclareTableRequest(id=["nope", "t"]))], 404, 1, ""),
    (lambda l: [CommitTableOperation(deregister_table=DeregisterTableRequest(id=["db", "a"])),
                op_create("a", 2, stage(l, 2))], 404, 4, "operation 1 "),
    (lambda l: [op_create("a", 3, stage(l, 3))], 409, 14, "operation 0 .*the next version is 2"),
    (lambda l: [op_create("a", 2, stage(l, 2)), CommitTableOperation(delete_table_versions=
                BatchDeleteTableVersionsRequest(id=["db", "a"], ranges=[VersionRange(start_version=0,
                                                                                     end_version=-1)])),
                op_create("a", 2, stage(l, 2))], 409, 14, "operation 2 "),
]


def test_refused_batches_change_nothing(api):
    table, meta = api
    loc = declare(api, "a")
    meta.create_table_version("db$a", CreateTableVersionRequest(version=1, manifest_path=stage(loc, 1)))
    for ops, status, code, match in REFUSED:
        with pytest.raises(ApiException) as info:
            table.batch_commit_tables(BatchCommitTablesRequest(operations=ops(loc)))
        body = error_of(info.value)
        assert (info.value.status, body["code"]) == (status, code), body
        assert re.match(match, body["error"]), body
        assert versions(api, "a") == [1] and versions(api, "n") is None


def test_malformed_batches_are_refused(http):
    http.post("/v1/namespace/db/create", json={})
    for body in ({"operations": [{}]},
                 {"operations": [{"declare_table": {"id": ["db", "x"]}, "deregister_table": {"id": ["db", "x"]}}]},
                 {"operations": [{"declare_table": {}}]},
                 {"operations": "all"}, {}):
        r = http.post("/v1/table/batch-commit", json=body)
        assert r.status_code == 400 and r.json()["code"] == 13, r.text
    assert http.post("/v1/table/batch-commit", json={"operations": []}).json() == {"results": []}


def test_batch_create_table_versions(api):
    table, meta = api
    locs = {n: declare(api, n) for n in "ab"}
    made = meta.batch_create_table_versions(BatchCreateTableVersionsRequest(entries=[
        CreateTableVersionEntry(id=["db", "a"], version=1, manifest_path=stage(locs["a"], 1)),
        CreateTableVersionEntry(id=["db", "b"], version=1, manifest_path=stage(locs["b"], 1)),
        CreateTableVersionEntry(id=["db", "a"], version=2, manifest_path=stage(locs["a"], 2)),
    ])).versions
    assert [v.version for v in made] == [1, 1, 2]
    with pytest.raises(ApiException) as info:
        meta.batch_create_table_versions(BatchCreateTableVersionsRequest(entries=[
            CreateTableVersionEntry(id=["db", "b"], version=2, manifest_path=stage(locs["b"], 2)),
            CreateTableVersionEntry(id=["db", "a"], version=2, manifest_path=stage(locs["a"], 2)),
        ]))
    assert info.value.status == 409 and error_of(info.value)["code"] == 14
    assert versions(api, "a") == [1, 2] and versions(api, "b") == [1]
