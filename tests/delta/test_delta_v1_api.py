"""Unity Catalog's Delta API v1.0 (`/delta/v1`) over raw HTTP, for what unitycatalog-client's v1 client cannot
send (struct-field metadata, malformed bodies, shapes the spec refuses): every refusal in the spec's error model
and status, with nothing changed; the metadata updates (columns, protocol, domain metadata, properties, UniForm)
and what loadTable shows of them; every endpoint of the spec's delta.yaml served."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from api.app import create_app
from coordinator.config import Config
from coordinator.service import Coordinator

from .conftest import FIRST, PREFIX, UC, first_commit, write_log_file

V1 = PREFIX + "/delta/v1"
C, S = "main", "default"
SPEC = Path(__file__).with_name("unity-catalog-delta-open-api.yaml")   # the spec's delta.yaml, unchanged
COLUMNS = {"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": False, "metadata": {"comment": "the key"}},
    {"name": "tags", "type": {"type": "array", "element-type": "string", "contains-null": True},
     "nullable": True, "metadata": {}},
    {"name": "attrs", "type": {"type": "map", "key-type": "string", "value-type": {
        "type": "struct", "fields": [{"name": "v", "type": "decimal(10,2)", "nullable": True, "metadata": {}}]},
        "value-contains-null": False}, "nullable": True, "metadata": {}}]}
PROTOCOL = {"min-reader-version": 3, "min-writer-version": 7,
            "reader-features": ["catalogManaged", "vacuumProtocolCheck"],
            "writer-features": ["catalogManaged", "inCommitTimestamp", "vacuumProtocolCheck"]}
CLUSTERED = {**PROTOCOL, "writer-features": [*PROTOCOL["writer-features"], "clustering", "domainMetadata"]}


def _now() -> int:
    return int(time.time() * 1000)


def commit(version: int, name: str | None = None) -> dict:
    return {"action": "add-commit", "commit": {
        "version": version, "timestamp": _now(), "file-name": name or f"{version:020d}.{uuid.uuid4()}.json",
        "file-size": 100, "file-modification-timestamp": _now()}}


class V1Client:
    def __init__(self, base: str):
        self.http = httpx.Client(base_url=base + V1, timeout=30)

    def table(self, name: str) -> str:
        return f"/catalogs/{C}/schemas/{S}/tables/{name}"

    def create(self, name: str, **overrides) -> tuple[dict, httpx.Response]:
        st = self.http.post(f"/catalogs/{C}/schemas/{S}/staging-tables", json={"name": name})
        assert st.status_code == 200, st.text
        st = st.json()
        write_log_file(st["location"], FIRST, first_commit(st["table-id"]))
        body = {"name": name, "location": st["location"], "table-type": "MANAGED", "columns": COLUMNS,
                "protocol": PROTOCOL, "properties": st["required-properties"], "last-commit-timestamp-ms": _now(),
                **overrides}
        return st, self.http.post(f"/catalogs/{C}/schemas/{S}/tables", json=body)

    def update(self, name: str, table_id: str, *updates, etag: str | None = None) -> httpx.Response:
        requirements = [{"type": "assert-table-uuid", "uuid": table_id}]
        if etag:
            requirements.append({"type": "assert-etag", "etag": etag})
        return self.http.post(self.table(name), json={"requirements": requirements, "updates": list(updates)})

    def load(self, name: str) -> dict:
        r = self.http.get(self.table(name))
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture
def v1(service):
    UC(service).setup_schema(C, S)
    client = V1Client(service)
    yield client
    client.http.close()


def refused(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status and error["type"] == kind, error
    return error["message"]


def test_every_endpoint_of_the_spec_is_served():
    app = create_app(Coordinator(Config()))
    served = set()
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith(PREFIX + "/delta/v1/") and "<path:" not in rule.rule:
            path = rule.rule.removeprefix(PREFIX).replace("<", "{").replace(">", "}")
            served |= {(m, path) for m in rule.methods - {"OPTIONS"}}
    doc = yaml.safe_load(SPEC.read_text())
    documented = {(m.upper(), p) for p, item in doc["paths"].items() for m in item if m != "parameters"}
    assert documented <= served, documented - served


def test_columns_keep_their_nested_types_and_metadata_in_both_apis(v1, service):
    st, r = v1.create("typed", **{"partition-columns": ["id"]})
    assert r.status_code == 200, r.text
    meta = r.json()["metadata"]
    assert meta["columns"] == COLUMNS and meta["partition-columns"] == ["id"]
    # the preview API reads the same columns, as ColumnInfos spelled as the Delta log spells them
    info = UC(service).get(f"/tables/{C}.{S}.typed").json()
    assert [c["type_name"] for c in info["columns"]] == ["LONG", "ARRAY", "MAP"]
    assert '"elementType":"string"' in info["columns"][1]["type_json"]
    assert info["columns"][0]["comment"] == "the key"


def test_create_refuses_what_breaks_the_managed_table_contract(v1):
    weak = {**PROTOCOL, "reader-features": ["vacuumProtocolCheck"]}
    st, r = v1.create("weak", protocol=weak)
    assert "reader feature catalogManaged" in refused(r, 400, "InvalidParameterValueException")
    st, r = v1.create("wrongid", properties={"delta.enableInCommitTimestamps": "true",
                                             "io.unitycatalog.tableId": str(uuid.uuid4())})
    assert "io.unitycatalog.tableId" in refused(r, 400, "InvalidParameterValueException")
    st, r = v1.create("nocolumns", columns={"type": "struct"})
    refused(r, 400, "BadRequestException")
    st, r = v1.create("uniform", uniform={"iceberg": {"metadata-location": "/elsewhere/m.json",
                                                      "converted-delta-version": 0,
                                                      "converted-delta-timestamp": _now()}})
    assert "UniForm" in refused(r, 400, "InvalidParameterValueException")
    st, r = v1.create("clustered", **{"domain-metadata": {"delta.clustering": {"clusteringColumns": [["id"]]}}})
    assert "clustering" in refused(r, 400, "InvalidParameterValueException")
    # none of them became a table; the last staging table still can
    assert v1.http.head(v1.table("clustered")).status_code == 404
    body = {"name": "clustered", "location": st["location"], "table-type": "MANAGED", "columns": COLUMNS,
            "protocol": CLUSTERED, "properties": st["required-properties"], "last-commit-timestamp-ms": _now(),
            "domain-metadata": {"delta.clustering": {"clusteringColumns": [["id"]]}}}
    r = v1.http.post(f"/catalogs/{C}/schemas/{S}/tables", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["metadata"]["properties"]["delta.clusteringColumns"] == '[["id"]]'
    # a staging table is finalized at most once
    r = v1.http.post(f"/catalogs/{C}/schemas/{S}/tables", json=body)
    refused(r, 409, "AlreadyExistsException")


def test_refused_updates_change_nothing(v1):
    st, r = v1.create("t")
    assert r.status_code == 200, r.text
    tid = st["table-id"]
    before = v1.load("t")

    def post(body) -> httpx.Response:
        return v1.http.post(v1.table("t"), content=body if isinstance(body, bytes) else None,
                            json=None if isinstance(body, bytes) else body)

    uuid_req = [{"type": "assert-table-uuid", "uuid": tid}]
    refused(post(b"{not json"), 400, "BadRequestException")
    refused(post({"requirements": uuid_req}), 400, "BadRequestException")
    refused(post({"requirements": uuid_req, "updates": []}), 400, "BadRequestException")
    refused(post({"requirements": [], "updates": [commit(1)]}), 400, "BadRequestException")
    refused(post({"requirements": uuid_req, "updates": [commit(1), commit(2)]}), 400, "BadRequestException")
    refused(post({"requirements": uuid_req, "updates": [{"action": "drop-everything"}]}), 400, "BadRequestException")
    refused(post({"requirements": uuid_req, "updates": [{"action": "add-commit", "commit": {"version": "1"}}]}),
            400, "BadRequestException")
    # a file outside _delta_log/_staged_commits/, a non-positive size, a version named wrongly, a gap
    for name in ("../../elsewhere.json", "_staged_commits/x.json", f"{2:020d}.{uuid.uuid4()}.json"):
        refused(v1.update("t", tid, commit(1, name)), 400, "InvalidParameterValueException")
    bad = commit(1)
    bad["commit"]["file-size"] = 0
    refused(v1.update("t", tid, bad), 400, "InvalidParameterValueException")
    refused(v1.update("t", tid, commit(2)), 400, "InvalidParameterValueException")
    refused(v1.update("t", tid, {"action": "set-latest-backfilled-version", "latest-published-version": 5}), 400,
            "InvalidParameterValueException")
    # log-represented changes without their commit; contradictory updates; derived keys
    refused(v1.update("t", tid, {"action": "set-columns", "columns": COLUMNS}), 400, "InvalidParameterValueException")
    refused(v1.update("t", tid, {"action": "set-properties", "updates": {"a": "1"}},
                      {"action": "remove-properties", "removals": ["a"]}), 400, "InvalidParameterValueException")
    refused(v1.update("t", tid, {"action": "set-properties", "updates": {"delta.feature.x": "supported"}},
                      commit(1)), 400, "InvalidParameterValueException")
    refused(v1.update("t", tid, {"action": "remove-properties", "removals": ["io.unitycatalog.tableId"]},
                      commit(1)), 400, "InvalidParameterValueException")
    refused(v1.update("t", tid, {"action": "set-protocol", "protocol": {**PROTOCOL, "writer-features": []}},
                      commit(1)), 400, "InvalidParameterValueException")
    # an update refused after an add-commit that alone would apply: the add-commit does not apply either
    refused(v1.update("t", tid, commit(1), {"action": "set-partition-columns", "partition-columns": ["nope"]}),
            400, "InvalidParameterValueException")
    refused(v1.update("t", tid, commit(1, f"{1:020d}.{uuid.uuid4()}.json"),
                      {"action": "update-metadata-snapshot-version", "last-commit-version": 1,
                       "last-commit-timestamp-ms": 1}), 400, "InvalidParameterValueException")
    assert v1.load("t") == before


def test_protocol_domain_and_property_updates_move_the_etag_together(v1):
    st, r = v1.create("m")
    tid, etag = st["table-id"], r.json()["metadata"]["etag"]
    r = v1.update("m", tid, {"action": "set-protocol", "protocol": CLUSTERED},
                  {"action": "set-domain-metadata", "updates": {"delta.clustering": {"clusteringColumns": [["id"]]}}},
                  {"action": "set-properties", "updates": {"owner.team": "data"}},
                  {"action": "set-columns", "columns": {"type": "struct", "fields": COLUMNS["fields"][:1]}},
                  commit(1), etag=etag)
    assert r.status_code == 200, r.text
    meta = r.json()["metadata"]
    assert meta["etag"] != etag and meta["last-commit-version"] == 1
    props = meta["properties"]
    assert props["delta.feature.clustering"] == "supported" and props["delta.clusteringColumns"] == '[["id"]]'
    assert props["owner.team"] == "data" and [f["name"] for f in meta["columns"]["fields"]] == ["id"]
    r = v1.update("m", tid, {"action": "remove-domain-metadata", "domains": ["delta.clustering"]},
                  {"action": "remove-properties", "removals": ["owner.team"]}, commit(2), etag=meta["etag"])
    assert r.status_code == 200, r.text
    props = r.json()["metadata"]["properties"]
    assert "delta.clusteringColumns" not in props and "owner.team" not in props
    # a data-only commit and a backfill leave the etag as it is
    etag = r.json()["metadata"]["etag"]
    r = v1.update("m", tid, commit(3), {"action": "set-latest-backfilled-version", "latest-published-version": 2},
                  etag=etag)
    assert r.status_code == 200 and r.json()["metadata"]["etag"] == etag
    assert [c["version"] for c in r.json()["commits"]] == [3]


def test_uniform_rides_on_the_commits_of_a_writer_that_converts(v1):
    st, r = v1.create("u")
    tid, location = st["table-id"], st["location"]

    def uniform(version: int, **extra) -> dict:
        return {"iceberg": {"metadata-location": f"{location}/metadata/{version:05d}.metadata.json",
                            "converted-delta-version": version, "converted-delta-timestamp": _now(), **extra}}

    enable = {"action": "set-properties", "updates": {"delta.universalFormat.enabledFormats": "iceberg"}}
    refused(v1.update("u", tid, {**commit(1), "uniform": uniform(1)}), 400, "InvalidParameterValueException")
    refused(v1.update("u", tid, enable), 400, "InvalidParameterValueException")   # only with its commit
    r = v1.update("u", tid, enable, {**commit(1), "uniform": uniform(1)})
    assert r.status_code == 200, r.text
    assert r.json()["uniform"]["iceberg"]["converted-delta-version"] == 1
    refused(v1.update("u", tid, {**commit(2), "uniform": uniform(2, **{"base-converted-delta-version": 0})}),
            409, "UpdateRequirementConflictException")
    r = v1.update("u", tid, {**commit(2), "uniform": uniform(2, **{"base-converted-delta-version": 1})})
    assert r.status_code == 200 and v1.load("u")["uniform"]["iceberg"]["converted-delta-version"] == 2
    # a writer that converts nothing commits too: the service converts the table itself (docs/uniform.md)
    assert v1.update("u", tid, commit(3)).status_code == 200
    r = v1.update("u", tid, {"action": "remove-properties", "removals": ["delta.universalFormat.enabledFormats"]},
                  commit(4))
    assert r.status_code == 200 and "uniform" not in r.json()


def test_config_lookups_and_unknown_paths_answer_in_the_error_model(v1):
    r = v1.http.get("/config", params={"catalog": C, "protocol-versions": "1.0"})
    assert r.status_code == 200 and r.json()["protocol-version"] == "1.0"
    refused(v1.http.get("/config", params={"catalog": C}), 400, "InvalidParameterValueException")
    assert "1.0" in refused(v1.http.get("/config", params={"catalog": C, "protocol-versions": "2.1"}), 400,
                            "InvalidParameterValueException")
    refused(v1.http.get("/config", params={"catalog": "nope", "protocol-versions": "1.0"}), 404,
            "NoSuchCatalogException")
    refused(v1.http.get(f"/catalogs/{C}/schemas/nope/tables/t"), 404, "NoSuchSchemaException")
    refused(v1.http.get(v1.table("absent")), 404, "NoSuchTableException")
    r = v1.http.head(v1.table("absent"))
    assert r.status_code == 404 and r.content == b""
    refused(v1.http.get("/no/such/thing"), 404, "NotFoundException")
    assert v1.http.put(v1.table("absent")).status_code == 405
    refused(v1.http.get(v1.table("absent") + "/credentials", params={"operation": "ALL"}), 400,
            "BadRequestException")
    refused(v1.http.get(f"/staging-tables/{uuid.uuid4()}/credentials"), 404, "NoSuchTableException")
    st, r = v1.create("dup")
    refused(v1.http.post(f"/catalogs/{C}/schemas/{S}/staging-tables", json={"name": "dup"}), 409,
            "AlreadyExistsException")
    refused(v1.http.post(v1.table("dup") + "/metrics", json={"table-id": str(uuid.uuid4())}), 400,
            "InvalidParameterValueException")
    st2, _ = v1.create("other")
    refused(v1.http.post(v1.table("dup") + "/rename", json={"new-name": "other"}), 409, "AlreadyExistsException")
    r = v1.http.get("/temporary-path-credentials", params={"location": st["location"], "operation": "READ"})
    assert r.status_code == 200 and r.json()["storage-credentials"][0]["prefix"] == st["location"]


def test_a_replay_is_answered_as_applied_even_long_after_its_backfill(v1, service, database_url):
    """The spec's commit recovery, as UC's server answers it: the same staged file at its version is answered 200
    (the table as it is), never a second version, also once it was backfilled and left the catalog's memory (the
    stored log tells); another file at a taken version is a CommitVersionConflictException."""
    from .conftest import commit_log
    st, r = v1.create("replayed")
    tid = st["table-id"]
    first = commit(1)
    assert v1.update("replayed", tid, first).status_code == 200
    assert v1.update("replayed", tid, commit(2)).status_code == 200
    assert v1.update("replayed", tid, commit(3), {"action": "set-latest-backfilled-version",
                                                  "latest-published-version": 2}).status_code == 200
    r = v1.update("replayed", tid, first)
    assert r.status_code == 200 and r.json()["latest-table-version"] == 3, r.text
    refused(v1.update("replayed", tid, commit(1)), 409, "CommitVersionConflictException")
    # through the preview API too: the same file is the same commit
    preview = {"table_id": tid, "table_uri": st["location"], "commit_info": {
        "version": 1, "timestamp": first["commit"]["timestamp"], "file_name": first["commit"]["file-name"],
        "file_size": 100, "file_modification_timestamp": first["commit"]["file-modification-timestamp"]}}
    assert httpx.post(service + PREFIX + "/delta/preview/commits", json=preview).status_code == 200
    assert sorted(commit_log(database_url, tid)) == [0, 1, 2, 3]
    assert commit_log(database_url, tid)[1] == first["commit"]["file-name"]
