"""End to end with pylance 14 and `lance_namespace.connect("rest", ...)` over real HTTP.

pylance treats the namespace as its manifest store (`managed_versioning`): it writes data and a staged manifest
itself and commits through `version/create`; every open goes through `version/list` / `version/describe`.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import uuid
import warnings
from datetime import timedelta
from pathlib import Path

import lance
import lance_namespace
import pyarrow as pa
import pytest
from lance.namespace import RestAdapter
from lance_namespace import (CreateNamespaceRequest, DeclareTableRequest, DeregisterTableRequest,
                             DescribeNamespaceRequest, DescribeTableRequest, DropNamespaceRequest, DropTableRequest,
                             ListNamespacesRequest, ListTablesRequest, ListTableVersionsRequest,
                             NamespaceExistsRequest, TableExistsRequest)
from lance_namespace_urllib3_client import (BatchCommitTablesRequest, CommitTableOperation,
                                            CreateTableVersionRequest, DeclareTableRequest as RestDeclare,
                                            TableApi)
from lance_namespace_urllib3_client.exceptions import ApiException

from api.server import EmbeddedService
from coordinator.lance.layout import manifest_name, object_path

from . import workers


@pytest.fixture
def ns(service):
    client = lance_namespace.connect("rest", {"uri": service})
    client.create_namespace(CreateNamespaceRequest(id=["db"]))
    return client


def rows(ds) -> list[int]:
    return sorted(ds.to_table()["a"].to_pylist())


def versions(ns, ident) -> list[int]:
    return [v.version for v in ns.list_table_versions(ListTableVersionsRequest(id=ident)).versions]


def test_write_append_overwrite_and_read_back(ns):
    t = ["db", "events"]
    ds = lance.write_dataset(pa.table({"a": [1, 2, 3]}), namespace_client=ns, table_id=t, mode="create")
    assert (ds.version, ds.count_rows()) == (1, 3)
    for i in range(3):
        ds = lance.write_dataset(pa.table({"a": [10 + i]}), namespace_client=ns, table_id=t, mode="append")
    assert ds.version == 4
    ds = lance.dataset(namespace_client=ns, table_id=t)
    assert ds.version == 4 and rows(ds) == [1, 2, 3, 10, 11, 12]
    assert rows(lance.dataset(namespace_client=ns, table_id=t, version=2)) == [1, 2, 3, 10]
    ds.insert(pa.table({"a": [20, 21]}))
    assert ds.version == 5 and ds.count_rows() == 8
    ds.tags.create("before-overwrite", 5)
    ds = lance.write_dataset(pa.table({"a": [99]}), namespace_client=ns, table_id=t, mode="overwrite")
    assert (ds.version, rows(ds)) == (6, [99])
    tagged = lance.dataset(namespace_client=ns, table_id=t, version="before-overwrite")
    assert tagged.version == 5 and rows(tagged) == [1, 2, 3, 10, 11, 12, 20, 21]
    assert versions(ns, t) == [1, 2, 3, 4, 5, 6]
    assert [v["version"] for v in lance.dataset(namespace_client=ns, table_id=t).versions()] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(Exception, match="already exists"):
        lance.write_dataset(pa.table({"a": [1]}), namespace_client=ns, table_id=t, mode="create")
    # The server finalized every manifest: no staged manifest is left behind.
    location = ns.describe_table(DescribeTableRequest(id=t)).location
    names = os.listdir(Path("/" + object_path(location)) / "_versions")
    assert not [n for n in names if ".manifest-" in n], names


def test_names_that_are_not_directory_names_work_end_to_end(ns):
    """A namespace or table name with characters a directory name does not take gets its own marked directory
    (storage.files.path_segment: `sp ace` -> `sp_ace~<hash>`): pylance writes and reads there as anywhere."""
    ns.create_namespace(CreateNamespaceRequest(id=["sp ace"]))
    t = ["sp ace", "ev?ents"]
    ds = lance.write_dataset(pa.table({"a": [1, 2]}), namespace_client=ns, table_id=t, mode="create")
    ds = lance.write_dataset(pa.table({"a": [3]}), namespace_client=ns, table_id=t, mode="append")
    location = ns.describe_table(DescribeTableRequest(id=t)).location
    assert "sp_ace~" in location and "ev_ents~" in location, location
    assert rows(lance.dataset(namespace_client=ns, table_id=t)) == [1, 2, 3] and versions(ns, t) == [1, 2]


def test_four_processes_append_to_one_table(ns, service):
    t = ["db", "hot"]
    lance.write_dataset(pa.table({"a": [-1]}), namespace_client=ns, table_id=t, mode="create")
    # Separate processes, each with its own Lance client. A forkserver that has imported Lance (importing only:
    # no Lance runtime has started, so each child starts its own) saves each child the 4-second import.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["lance", "lance_namespace", "pyarrow", "tests.lance.workers"])
    results = ctx.Queue()
    procs = [ctx.Process(target=workers.append_rows, args=(service, w, 25, results)) for w in range(4)]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "lance is not fork-safe")
        for p in procs:
            p.start()
    reports = [results.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert [error for _, _, error in reports] == [None] * 4
    acked = [v for _, versions_, _ in reports for v in versions_]
    assert len(acked) == 100 and len(set(acked)) == 100, "every append acknowledged once, each its own version"
    assert versions(ns, t) == list(range(1, 102)), "versions contiguous"
    ds = lance.dataset(namespace_client=ns, table_id=t)
    assert ds.version == 101
    assert rows(ds) == sorted([-1] + [w * 1000 + i for w in range(4) for i in range(25)])


def test_batch_commit_of_lance_staged_manifests_is_atomic(ns, service):
    """Two tables advanced together. Lance writes each table's next version directly to storage; its manifest
    is then moved to a staging name, exactly what a managed-versioning writer leaves for `version/create`."""
    api = TableApi(lance_namespace_urllib3_client_for(service))
    staged = {}
    for name in ("a", "b"):
        lance.write_dataset(pa.table({"a": [1]}), namespace_client=ns, table_id=["db", name], mode="create")
        location = ns.describe_table(DescribeTableRequest(id=["db", name])).location
        lance.write_dataset(pa.table({"a": [2]}), location, mode="append")   # plain Lance: final manifest v2
        versions_dir = Path("/" + object_path(location)) / "_versions"
        final = versions_dir / manifest_name(2, "V2")
        staging = versions_dir / f"{final.name}-{uuid.uuid4()}"
        final.rename(staging)
        staged[name] = object_path(staging.as_uri())

    def create(name, path):
        return CommitTableOperation(create_table_version=CreateTableVersionRequest(
            id=["db", name], version=2, manifest_path=path))

    # The last operation conflicts (another manifest for version 2 of a): nothing applies, Lance still sees 1.
    a_versions = Path("/" + staged["a"]).parent
    rival = a_versions / f"{manifest_name(2, 'V2')}-{uuid.uuid4()}"
    rival.write_bytes((Path("/" + staged["b"])).read_bytes())
    with pytest.raises(ApiException) as info:
        api.batch_commit_tables(BatchCommitTablesRequest(operations=[
            create("a", staged["a"]), create("b", staged["b"]),
            CommitTableOperation(declare_table=RestDeclare(id=["db", "c"])),
            create("a", object_path(rival.as_uri()))]))
    assert info.value.status == 409 and '"code":14' in info.value.body.replace(" ", "")
    for name in ("a", "b"):
        ds = lance.dataset(namespace_client=ns, table_id=["db", name])
        assert (ds.version, rows(ds)) == (1, [1])
    assert ns.list_tables(ListTablesRequest(id=["db"])).tables == ["a", "b"]

    result = api.batch_commit_tables(BatchCommitTablesRequest(operations=[
        create("a", staged["a"]), create("b", staged["b"]),
        CommitTableOperation(declare_table=RestDeclare(id=["db", "c"]))]))
    assert [r.create_table_version.version.version for r in result.results[:2]] == [2, 2]
    for name in ("a", "b"):
        ds = lance.dataset(namespace_client=ns, table_id=["db", name])
        assert (ds.version, rows(ds)) == (2, [1, 2])
        ds = lance.write_dataset(pa.table({"a": [3]}), namespace_client=ns, table_id=["db", name], mode="append")
        assert (ds.version, rows(ds)) == (3, [1, 2, 3])
    # The declared table takes its first write like any other.
    ds = lance.write_dataset(pa.table({"a": [7]}), namespace_client=ns, table_id=["db", "c"], mode="append")
    assert (ds.version, rows(ds)) == (1, [7])


def lance_namespace_urllib3_client_for(uri: str):
    from lance_namespace_urllib3_client import ApiClient, Configuration
    return ApiClient(Configuration(host=uri))


# -- side by side with Lance's own reference server ---------------------------------------------------------


def _attempt(fn):
    try:
        return ("ok", fn())
    except Exception as exc:   # the exception class is what a client sees and branches on
        return ("error", type(exc).__name__)


def scenario(ns) -> list[tuple]:
    """One script, run against both servers; returns what a client observes at each step."""
    out: list[tuple] = []
    rec = out.append
    t = ["db", "t"]
    rec(("create ns", _attempt(lambda: ns.create_namespace(CreateNamespaceRequest(id=["db"])).properties or {})))
    rec(("create ns again", _attempt(lambda: ns.create_namespace(CreateNamespaceRequest(id=["db"])))))
    rec(("create nested", _attempt(lambda: ns.create_namespace(CreateNamespaceRequest(id=["db", "eu"])) and 1)))
    rec(("create orphan", _attempt(lambda: ns.create_namespace(CreateNamespaceRequest(id=["x", "y"])))))
    rec(("list root", ns.list_namespaces(ListNamespacesRequest(id=[])).namespaces))
    rec(("list db", ns.list_namespaces(ListNamespacesRequest(id=["db"])).namespaces))
    rec(("describe ns", ns.describe_namespace(DescribeNamespaceRequest(id=["db"])).properties or {}))
    rec(("describe missing ns", _attempt(lambda: ns.describe_namespace(DescribeNamespaceRequest(id=["nope"])))))
    rec(("ns exists", _attempt(lambda: ns.namespace_exists(NamespaceExistsRequest(id=["db"])) and 1)))
    rec(("ns exists missing", _attempt(lambda: ns.namespace_exists(NamespaceExistsRequest(id=["nope"])))))
    ds = lance.write_dataset(pa.table({"a": [1, 2, 3]}), namespace_client=ns, table_id=t, mode="create")
    rec(("create table", ds.version, ds.count_rows()))
    rec(("create table again", _attempt(lambda: lance.write_dataset(
        pa.table({"a": [1]}), namespace_client=ns, table_id=t, mode="create"))))
    rec(("declare again", _attempt(lambda: ns.declare_table(DeclareTableRequest(id=t)))))
    for i in range(2):
        ds = lance.write_dataset(pa.table({"a": [10 + i]}), namespace_client=ns, table_id=t, mode="append")
        rec(("append", ds.version, ds.count_rows()))
    ds = lance.dataset(namespace_client=ns, table_id=t)
    rec(("open", ds.version, rows(ds)))
    rec(("open v1", rows(lance.dataset(namespace_client=ns, table_id=t, version=1))))
    rec(("open v9", _attempt(lambda: lance.dataset(namespace_client=ns, table_id=t, version=9))))
    ds.insert(pa.table({"a": [20]}))
    rec(("insert", ds.version, ds.count_rows()))
    ds.tags.create("first", 1)
    rec(("tags", {k: v["version"] for k, v in ds.tags.list().items()}))
    rec(("open tag", lance.dataset(namespace_client=ns, table_id=t, version="first").count_rows()))
    ds = lance.write_dataset(pa.table({"a": [99]}), namespace_client=ns, table_id=t, mode="overwrite")
    rec(("overwrite", ds.version, rows(ds)))
    rec(("lance versions", [v["version"] for v in ds.versions()]))
    rec(("list tables", ns.list_tables(ListTablesRequest(id=["db"])).tables))
    d = ns.describe_table(DescribeTableRequest(id=t))
    rec(("describe", d.managed_versioning, bool(d.location), d.table, d.namespace))
    rec(("describe missing", _attempt(lambda: ns.describe_table(DescribeTableRequest(id=["db", "nope"])))))
    rec(("exists", _attempt(lambda: ns.table_exists(TableExistsRequest(id=t)) and 1)))
    rec(("exists missing", _attempt(lambda: ns.table_exists(TableExistsRequest(id=["db", "nope"])))))
    rec(("versions", versions(ns, t)))
    rec(("latest", [v.version for v in ns.list_table_versions(
        ListTableVersionsRequest(id=t, limit=1, descending=True)).versions]))
    rec(("describe v2", _attempt(lambda: ns.describe_table_version({"id": t, "version": 2})["version"]["version"])))
    rec(("describe v42", _attempt(lambda: ns.describe_table_version({"id": t, "version": 42}))))
    rec(("drop non-empty ns", _attempt(lambda: ns.drop_namespace(DropNamespaceRequest(id=["db"])))))
    rec(("declare u", _attempt(lambda: ns.declare_table(DeclareTableRequest(id=["db", "u"])).managed_versioning)))
    rec(("list tables 2", sorted(ns.list_tables(ListTablesRequest(id=["db"])).tables)))
    rec(("deregister u", _attempt(lambda: ns.deregister_table(DeregisterTableRequest(id=["db", "u"])).id)))
    rec(("u exists", _attempt(lambda: ns.table_exists(TableExistsRequest(id=["db", "u"])))))
    rec(("drop t", _attempt(lambda: ns.drop_table(DropTableRequest(id=t)).id)))
    rec(("t exists", _attempt(lambda: ns.table_exists(TableExistsRequest(id=t)))))
    rec(("drop eu", _attempt(lambda: ns.drop_namespace(DropNamespaceRequest(id=["db", "eu"])) and 1)))
    rec(("drop db", _attempt(lambda: ns.drop_namespace(DropNamespaceRequest(id=["db"])) and 1)))
    rec(("drop db again", _attempt(lambda: ns.drop_namespace(DropNamespaceRequest(id=["db"])))))
    return out


def test_same_client_visible_results_as_lance_reference_server(service):
    with tempfile.TemporaryDirectory() as root:
        with RestAdapter("dir", {"root": root, "table_version_tracking_enabled": "true"}, port=0) as adapter:
            reference = scenario(lance_namespace.connect("rest", {"uri": f"http://127.0.0.1:{adapter.port}"}))
    ours = scenario(lance_namespace.connect("rest", {"uri": service}))
    assert [step[0] for step in ours] == [step[0] for step in reference]
    assert ours == reference



def _after_cleanup(client) -> dict:
    """Three versions, lance's own `cleanup_old_versions` (it deletes old manifests and tells the namespace
    nothing), then what the namespace and pylance see."""
    client.create_namespace(CreateNamespaceRequest(id=["c"]))
    t = ["c", "t"]
    lance.write_dataset(pa.table({"a": [1]}), namespace_client=client, table_id=t, mode="create")
    for i in (2, 3):
        lance.write_dataset(pa.table({"a": [i]}), namespace_client=client, table_id=t, mode="append")
    lance.dataset(namespace_client=client, table_id=t).cleanup_old_versions(older_than=timedelta(0),
                                                                           delete_unverified=True)
    seen: dict = {"listed": versions(client, t)}
    try:
        client.describe_table_version({"id": t, "version": 1})
        seen["describe 1"] = "found"
    except Exception as exc:   # lance_namespace raises its TableVersionNotFound for a 404 with code 11
        seen["describe 1"] = type(exc).__name__
    seen["latest"] = rows(lance.dataset(namespace_client=client, table_id=t))
    seen["appended"] = lance.write_dataset(pa.table({"a": [4]}), namespace_client=client, table_id=t,
                                           mode="append").version
    seen["listed after"] = versions(client, t)
    return seen


def test_versions_lance_cleaned_up_are_no_longer_listed(service):
    """After `cleanup_old_versions`, `version/list` shows only versions that can still be opened and
    `version/describe` of a cleaned one is 404 (code 11), exactly as lance's own directory namespace shows."""
    with tempfile.TemporaryDirectory() as root:
        with RestAdapter("dir", {"root": root, "table_version_tracking_enabled": "true"}, port=0) as adapter:
            reference = _after_cleanup(lance_namespace.connect("rest", {"uri": f"http://127.0.0.1:{adapter.port}"}))
    ours = _after_cleanup(lance_namespace.connect("rest", {"uri": service}))
    assert ours["listed"] == [3] and ours["describe 1"] != "found"
    assert ours == reference

@pytest.fixture
def ns_without_grace(config):
    """The namespace of a service that removes unrecorded manifests however young (lance_unrecorded_grace_s 0)."""
    config.lance_unrecorded_grace_s = 0.0
    with EmbeddedService(config) as base_url:
        client = lance_namespace.connect("rest", {"uri": base_url})
        client.create_namespace(CreateNamespaceRequest(id=["db"]))
        yield client


def test_a_write_that_bypassed_the_namespace_does_not_wedge_the_table(ns_without_grace):
    """A plain `write_dataset(uri)` writes a final manifest the namespace never recorded. Lance then proposes the
    version after it, which the namespace refuses (its next version is the unrecorded one's). That refusal makes
    the table reload, and the reload removes the unrecorded manifest: the writer after it goes through, instead of
    every writer failing until the service restarts."""
    t = ["db", "bypassed"]
    ds = lance.write_dataset(pa.table({"a": [1]}), namespace_client=ns_without_grace, table_id=t, mode="create")
    lance.write_dataset(pa.table({"a": [2]}), ds.uri, mode="append")   # not through the namespace
    assert versions(ns_without_grace, t) == [1]
    with pytest.raises(OSError):   # it proposes version 3; the namespace's next version is 2
        lance.write_dataset(pa.table({"a": [3]}), namespace_client=ns_without_grace, table_id=t, mode="append")
    ds = lance.write_dataset(pa.table({"a": [4]}), namespace_client=ns_without_grace, table_id=t, mode="append")
    assert ds.version == 2 and versions(ns_without_grace, t) == [1, 2]
    # the bypassing write was never recorded
    assert rows(lance.dataset(namespace_client=ns_without_grace, table_id=t)) == [1, 4]
