"""Lance Namespace REST conformance over real HTTP: routes, bodies, pagination, and the spec's error codes.

Every error must come as `{"error","code","detail","instance"}` with the code's mapped status, and change nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

from coordinator.lance.layout import manifest_name

from .conftest import fake_manifest, local, stage

NS = "/v1/namespace"
TABLE = "/v1/table"


def ok(r, status: int = 200):
    assert r.status_code == status, r.text
    return r.json() if r.content else None


def err(r, status: int, code: int) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["code"] == code, body
    assert body["error"] and body["detail"] and body["instance"] == r.request.url.path, body
    return body


def gone(path: Path) -> None:
    """Wait for a background clean-up (staging removal, drop purge) to have removed `path`."""
    for _ in range(200):
        if not path.exists():
            return
        time.sleep(0.025)
    raise AssertionError(f"{path} still exists")


def declare(http, ident: str, **body) -> dict:
    return ok(http.post(f"{TABLE}/{ident}/declare", json=body))


def versions(http, ident: str, **params) -> list[int]:
    return [v["version"] for v in ok(http.post(f"{TABLE}/{ident}/version/list", params=params))["versions"]]


def create_version(http, ident: str, version: int, path: str, **extra):
    return http.post(f"{TABLE}/{ident}/version/create", json={"version": version, "manifest_path": path, **extra})


# -- namespaces --------------------------------------------------------------------------------------------------


def test_namespace_lifecycle(http):
    assert ok(http.post(f"{NS}/db/create", json={})) == {"properties": {}}
    assert ok(http.post(f"{NS}/sales/create", json={"properties": {"owner": "ana"}})) == {
        "properties": {"owner": "ana"}}
    err(http.post(f"{NS}/sales/create", json={}), 409, 2)
    for mode in ("ExistOk", "exist_ok", "EXISTOK"):
        assert ok(http.post(f"{NS}/sales/create", json={"mode": mode})) == {"properties": {"owner": "ana"}}
    err(http.post(f"{NS}/other/create", json={"mode": "Sometimes"}), 400, 13)
    ok(http.post(f"{NS}/sales$eu/create", json={}))
    err(http.post(f"{NS}/nope$child/create", json={}), 404, 1)

    assert ok(http.get(f"{NS}/$/list")) == {"namespaces": ["db", "sales"]}
    assert ok(http.get(f"{NS}/sales/list")) == {"namespaces": ["eu"]}
    err(http.get(f"{NS}/nope/list"), 404, 1)
    assert ok(http.post(f"{NS}/sales/describe", json={})) == {"properties": {"owner": "ana"}}
    assert ok(http.post(f"{NS}/$/describe", json={})) == {"properties": {}}
    err(http.post(f"{NS}/nope/describe", json={}), 404, 1)
    r = http.post(f"{NS}/sales$eu/exists", json={})
    assert r.status_code == 200 and r.content == b""
    err(http.post(f"{NS}/sales$asia/exists", json={}), 404, 1)

    err(http.post(f"{NS}/sales/drop", json={}), 409, 3)      # holds sales.eu
    assert ok(http.post(f"{NS}/sales/list")) == {"namespaces": ["eu"]}
    ok(http.post(f"{NS}/sales$eu/drop", json={}))
    assert ok(http.post(f"{NS}/sales/drop", json={})) == {"properties": {"owner": "ana"}}
    err(http.post(f"{NS}/sales/drop", json={}), 404, 1)
    ok(http.post(f"{NS}/sales/drop", json={"mode": "Skip"}))
    err(http.post(f"{NS}/$/create", json={}), 409, 2)
    err(http.post(f"{NS}/$/drop", json={}), 400, 13)

    # Overwrite: "the existing namespace is dropped and a new empty namespace with this name is created".
    declare(http, "db$t")
    assert ok(http.post(f"{NS}/db/create", json={"mode": "Overwrite", "properties": {"v": "2"}})) == {
        "properties": {"v": "2"}}
    assert ok(http.get(f"{NS}/db/table/list")) == {"tables": []}


def test_namespace_pagination_and_delimiters(http):
    ok(http.post(f"{NS}/p/create", json={}))
    for i in range(5):
        ok(http.post(f"{NS}/p::n{i}/create", params={"delimiter": "::"}, json={}))
    seen, token = [], None
    while True:
        params = {"limit": 2, **({"page_token": token} if token else {})}
        page = ok(http.get(f"{NS}/p/list", params=params))
        assert len(page["namespaces"]) <= 2
        seen += page["namespaces"]
        token = page.get("page_token")
        if not token:
            break
    assert seen == [f"n{i}" for i in range(5)]
    err(http.get(f"{NS}/p/list", params={"limit": 0}), 400, 13)
    err(http.get(f"{NS}/p/list", params={"page_token": "%%%"}), 400, 13)
    err(http.post(f"{NS}/p$$x/create", json={}), 400, 13)          # empty level


def test_drop_namespace_cascade_removes_tables_and_children(http):
    ok(http.post(f"{NS}/c/create", json={}))
    ok(http.post(f"{NS}/c$d/create", json={}))
    t1 = declare(http, "c$t1")
    declare(http, "c$d$t2")
    err(http.post(f"{NS}/c/drop", json={"behavior": "Restrict"}), 409, 3)
    ok(http.post(f"{NS}/c/drop", json={"behavior": "Cascade"}))
    for path in ("c", "c$d"):
        err(http.post(f"{NS}/{path}/exists", json={}), 404, 1)
    assert ok(http.get(TABLE)) == {"tables": []}
    assert not local(t1["location"].removeprefix("file:///")).exists()


def test_body_identity_and_context(http):
    ok(http.post(f"{NS}/db/create", json={"id": ["db"], "identity": {"api_key": "k"}, "context": {"a": "b"}}))
    err(http.post(f"{NS}/x/create", json={"id": ["y"]}), 400, 13)
    ok(http.post(f"{NS}/db/describe", json={}, headers={"x-api-key": "k"}))
    ok(http.post(f"{NS}/db/describe", json={}, headers={"Authorization": "Bearer t0k3n"}))
    # Authentication is off here: whatever credential a client sends along is not looked at.
    ok(http.post(f"{NS}/db/describe", json={}, headers={"Authorization": "Basic dTpw"}))


# -- tables ------------------------------------------------------------------------------------------------------


def test_declare_describe_exists_and_list(http, config):
    ok(http.post(f"{NS}/db/create", json={}))
    d = declare(http, "db$t", properties={"owner": "ana"})
    assert d["managed_versioning"] is True and d["storage_options"] == {} and d["properties"] == {"owner": "ana"}
    assert d["location"].startswith(config.warehouse_uri + "/db/t-")
    err(http.post(f"{TABLE}/db$t/declare", json={}), 409, 5)
    err(http.post(f"{TABLE}/nope$t/declare", json={}), 404, 1)
    err(http.post(f"{TABLE}/db$x/declare", json={"location": "/etc/x"}), 400, 13)
    err(http.post(f"{TABLE}/db$x/declare", json={"location": config.warehouse_uri}), 400, 13)
    mine = config.warehouse_uri + "/chosen/place"
    assert declare(http, "db$u", location=mine)["location"] == mine
    create_version(http, "db$u", 1, stage(mine, 1))
    err(http.post(f"{TABLE}/db$x/declare", json={"location": mine}), 400, 13)   # holds a table: register it
    err(http.post(f"{TABLE}/$/declare", json={}), 400, 13)

    desc = ok(http.post(f"{TABLE}/db$t/describe", json={}))
    assert desc == {"table": "t", "namespace": ["db"], "location": d["location"], "storage_options": {},
                    "properties": {"owner": "ana"}, "managed_versioning": True}
    desc = ok(http.post(f"{TABLE}/db$t/describe", params={"with_table_uri": "true", "check_declared": "true"},
                        json={}))
    assert desc["table_uri"] == d["location"] and desc["is_only_declared"] is True
    err(http.post(f"{TABLE}/db$t/describe", params={"with_table_uri": "maybe"}, json={}), 400, 13)
    err(http.post(f"{TABLE}/db$t/describe", params={"load_detailed_metadata": "true"}, json={}), 406, 0)
    err(http.post(f"{TABLE}/db$t/describe", json={"version": 3}), 404, 11)
    err(http.post(f"{TABLE}/db$nope/describe", json={}), 404, 4)
    err(http.post(f"{TABLE}/nope$t/describe", json={}), 404, 1)
    r = http.post(f"{TABLE}/db$t/exists", json={})
    assert r.status_code == 200 and r.content == b""
    err(http.post(f"{TABLE}/db$nope/exists", json={}), 404, 4)

    assert ok(http.get(f"{NS}/db/table/list")) == {"tables": ["t", "u"]}
    assert ok(http.get(f"{NS}/db/table/list", params={"include_declared": "false"})) == {"tables": ["u"]}
    err(http.get(f"{NS}/nope/table/list"), 404, 1)
    create_version(http, "db$t", 1, stage(d["location"], 1))
    assert ok(http.get(f"{NS}/db/table/list", params={"include_declared": "false"})) == {"tables": ["t", "u"]}
    assert ok(http.post(f"{TABLE}/db$t/describe", params={"check_declared": "true"}, json={}))[
        "is_only_declared"] is False
    declare(http, "root_table")
    assert ok(http.get(TABLE, params={"delimiter": "."})) == {"tables": ["root_table", "db.t", "db.u"]}
    first = ok(http.get(f"{TABLE}/", params={"limit": 2}))
    rest = ok(http.get(f"{TABLE}/", params={"limit": 2, "page_token": first["page_token"]}))
    assert first["tables"] + rest["tables"] == ["root_table", "db$t", "db$u"] and "page_token" not in rest


def test_a_chosen_location_cannot_take_a_namespaces_directory(http, config):
    """Not another namespace's directory, nor one holding it: that namespace's new tables, placed there by
    default, would all overlap it."""
    ok(http.post(f"{NS}/db/create", json={}))
    ok(http.post(f"{NS}/other/create", json={}))
    ok(http.post(f"{NS}/other$sub/create", json={}))
    for place in ("other", "other/sub"):
        e = err(http.post(f"{TABLE}/db$x/declare", json={"location": f"{config.warehouse_uri}/{place}"}), 400, 13)
        assert "directory of namespace" in e["error"], e
        err(http.post(f"{TABLE}/db$x/register", json={"location": f"{config.warehouse_uri}/{place}"}), 400, 13)
        e = err(http.post(f"{TABLE}/batch-commit", json={"operations": [{"declare_table": {
            "id": ["db", "x"], "location": f"{config.warehouse_uri}/{place}"}}]}), 400, 13)
        assert "directory of namespace" in e["error"], e
    ok(http.post(f"{TABLE}/other$t/declare", json={}))   # the namespace still takes tables
    ok(http.post(f"{TABLE}/other$sub$t/declare", json={}))
    ok(http.post(f"{TABLE}/db$near/declare", json={"location": f"{config.warehouse_uri}/other-not"}))


def test_deregister_keeps_files_and_drop_deletes_them(http):
    ok(http.post(f"{NS}/db/create", json={}))
    d = declare(http, "db$t")
    create_version(http, "db$t", 1, stage(d["location"], 1))
    removed = ok(http.post(f"{TABLE}/db$t/deregister", json={}))
    assert removed == {"id": ["db", "t"], "location": d["location"], "properties": {}}
    err(http.post(f"{TABLE}/db$t/describe", json={}), 404, 4)
    err(http.post(f"{TABLE}/db$t/deregister", json={}), 404, 4)
    directory = local(d["location"].removeprefix("file:///"))
    assert any(directory.glob("_versions/*.manifest"))

    # Register it back: the versions on storage become the table's versions.
    reg = ok(http.post(f"{TABLE}/db$t/register", json={"location": d["location"]}))
    assert reg["location"] == d["location"]
    assert versions(http, "db$t") == [1]
    err(http.post(f"{TABLE}/db$t/register", json={"location": d["location"]}), 409, 5)
    ok(http.post(f"{TABLE}/db$t/register", json={"location": d["location"], "mode": "Overwrite",
                                                  "properties": {"k": "v"}}))
    assert ok(http.post(f"{TABLE}/db$t/describe", json={}))["properties"] == {"k": "v"}
    err(http.post(f"{TABLE}/db$v/register", json={"location": d["location"] + "/nothing"}), 400, 13)
    err(http.post(f"{TABLE}/db$v/register", json={}), 400, 13)

    # Drop: "drop table `id` and delete its data" (after the row is gone; poll the background clean-up).
    assert ok(http.post(f"{TABLE}/db$t/drop"))["location"] == d["location"]
    gone(directory)
    err(http.post(f"{TABLE}/db$t/drop"), 404, 4)


# -- versions ----------------------------------------------------------------------------------------------------


def test_create_version_finalizes_the_staged_manifest(http):
    ok(http.post(f"{NS}/db/create", json={}))
    loc = declare(http, "db$t")["location"]
    staging = stage(loc, 1)
    data = local(staging).read_bytes()
    created = ok(create_version(http, "db$t", 1, staging, manifest_size=len(data), naming_scheme="V2"))["version"]
    final = loc.removeprefix("file:///") + "/_versions/" + manifest_name(1, "V2")
    assert created["version"] == 1 and created["manifest_path"] == final
    assert created["manifest_size"] == len(data) and created["timestamp_millis"] > 0
    assert local(final).read_bytes() == data
    assert not local(staging).exists()   # renamed into place: gone by the time the commit is answered
    described = ok(http.post(f"{TABLE}/db$t/version/describe", json={"version": 1}))["version"]
    assert described == created
    assert ok(http.post(f"{TABLE}/db$t/version/describe", json={}))["version"] == created   # latest

    # The same commit again (its answer was lost) is answered again; another commit for 1 is a conflict.
    assert ok(create_version(http, "db$t", 1, staging))["version"] == created
    other = stage(loc, 1)
    err(create_version(http, "db$t", 1, other), 409, 14)
    assert local(other).exists(), "a refused commit's staged manifest belongs to its writer"
    twin = stage(loc, 1, data)          # byte-identical manifest: the same commit
    assert ok(create_version(http, "db$t", 1, twin))["version"]["manifest_path"] == final

    v2 = ok(create_version(http, "db$t", 2, stage(loc, 2, scheme="V1"), naming_scheme="V1"))["version"]
    assert v2["manifest_path"].endswith("/_versions/2.manifest")
    v3 = ok(create_version(http, "db$t", 3, stage(loc, 3, scheme="V1"), metadata={"k": "v"}))["version"]
    assert v3["manifest_path"].endswith("/_versions/3.manifest") and v3["metadata"] == {"k": "v"}
    # A client may also hand in the final path itself; that file is the version's manifest and stays.
    final4 = loc.removeprefix("file:///") + "/_versions/" + manifest_name(4, "V2")
    local(final4).write_bytes(fake_manifest())
    assert ok(create_version(http, "db$t", 4, final4))["version"]["manifest_path"] == final4
    time.sleep(0.2)
    assert local(final4).exists()
    assert versions(http, "db$t") == [1, 2, 3, 4]


BAD_CREATES = [
    ("gap", 409, 14), ("zero", 400, 13), ("missing", 400, 13), ("size", 400, 13), ("not-a-manifest", 400, 13),
    ("outside-versions", 400, 13), ("other-final", 400, 13), ("outside-table", 400, 13), ("scheme", 400, 13),
    ("branch", 406, 0), ("no-path", 400, 13), ("negative", 400, 13), ("string-version", 400, 13),
]


def test_bad_version_create_is_refused_and_changes_nothing(http):
    ok(http.post(f"{NS}/db/create", json={}))
    loc = declare(http, "db$t")["location"]
    staged = stage(loc, 1)
    ok(create_version(http, "db$t", 1, staged))
    gone(local(staged))
    root = Path("/" + loc.removeprefix("file:///"))
    (root / "data").mkdir()
    (root / "data" / "x.lance").write_bytes(fake_manifest())
    (root / "_versions" / "junk").write_bytes(b"hello")
    prefix = loc.removeprefix("file:///")
    for case, status, code in BAD_CREATES:
        body = {"version": 2, "manifest_path": stage(loc, 2)}
        if case == "gap":
            body["version"] = 5
        elif case == "zero":
            body["version"] = 0
        elif case == "missing":
            body["manifest_path"] = body["manifest_path"] + "-gone"
        elif case == "size":
            body["manifest_size"] = 3
        elif case == "not-a-manifest":
            body["manifest_path"] = prefix + "/_versions/junk"
        elif case == "outside-versions":
            body["manifest_path"] = prefix + "/data/x.lance"
        elif case == "other-final":
            body["manifest_path"] = prefix + "/_versions/" + manifest_name(1, "V2")
        elif case == "outside-table":
            body["manifest_path"] = prefix + "/../../../etc/passwd"
        elif case == "scheme":
            body["naming_scheme"] = "V3"
        elif case == "branch":
            body["branch"] = "dev"
        elif case == "no-path":
            del body["manifest_path"]
        elif case == "negative":
            body["version"] = -1
        elif case == "string-version":
            body["version"] = "2"
        files = sorted(p.relative_to(root) for p in root.rglob("*"))
        body_err = err(http.post(f"{TABLE}/db$t/version/create", json=body), status, code)
        assert versions(http, "db$t") == [1], case
        assert sorted(p.relative_to(root) for p in root.rglob("*")) == files, f"{case}: {body_err}"


def test_version_list_describe_and_delete(http):
    ok(http.post(f"{NS}/db/create", json={}))
    loc = declare(http, "db$t")["location"]
    assert versions(http, "db$t") == []
    for v in range(1, 8):
        ok(create_version(http, "db$t", v, stage(loc, v)))
    # pylance sends version/list as a POST with no body and no content type.
    r = http.post(f"{TABLE}/db%24t/version/list", params={"limit": 1, "descending": "true"})
    assert r.request.headers.get("content-type") is None and r.request.content == b""
    assert [v["version"] for v in ok(r)["versions"]] == [7]
    assert versions(http, "db$t") == [1, 2, 3, 4, 5, 6, 7]
    page = ok(http.post(f"{TABLE}/db$t/version/list", params={"limit": 3, "descending": "true"}))
    assert [v["version"] for v in page["versions"]] == [7, 6, 5]
    page = ok(http.post(f"{TABLE}/db$t/version/list", params={"limit": 3, "descending": "true",
                                                              "page_token": page["page_token"]}))
    assert [v["version"] for v in page["versions"]] == [4, 3, 2]
    page = ok(http.post(f"{TABLE}/db$t/version/list", params={"limit": 3, "page_token": "4"}))
    assert [v["version"] for v in page["versions"]] == [5, 6, 7] and "page_token" not in page
    err(http.post(f"{TABLE}/db$t/version/list", params={"page_token": "x"}), 400, 13)
    err(http.post(f"{TABLE}/db$t/version/list", params={"descending": "yes"}), 400, 13)
    err(http.post(f"{TABLE}/db$nope/version/list"), 404, 4)
    err(http.post(f"{TABLE}/db$t/version/list", params={"branch": "dev"}), 406, 0)

    delete = f"{TABLE}/db$t/version/delete"
    assert ok(http.post(delete, json={"ranges": [{"start_version": 1, "end_version": 3}]})) == {"deleted_count": 2}
    assert versions(http, "db$t") == [3, 4, 5, 6, 7]
    assert ok(http.post(delete, json={"ranges": [{"start_version": 1, "end_version": 3}]})) == {"deleted_count": 0}
    err(http.post(f"{TABLE}/db$t/version/describe", json={"version": 2}), 404, 11)
    for bad in ({"ranges": [{"start_version": 5, "end_version": 2}]},
                {"ranges": [{"start_version": 0, "end_version": -2}]},
                {"ranges": [{"start_version": -1, "end_version": 2}]}, {}):
        err(http.post(delete, json=bad), 400, 13)
    assert ok(http.post(delete, json={"ranges": [{"start_version": 0, "end_version": -1}]})) == {"deleted_count": 5}
    assert versions(http, "db$t") == []
    err(http.post(f"{TABLE}/db$t/version/describe", json={}), 404, 11)
    # Numbers are never reused: 7 was handed out, so the next version is 8.
    err(create_version(http, "db$t", 7, stage(loc, 7)), 409, 14)
    err(create_version(http, "db$t", 1, stage(loc, 1)), 409, 14)
    ok(create_version(http, "db$t", 8, stage(loc, 8)))
    assert versions(http, "db$t") == [8]


# -- the protocol's edges ----------------------------------------------------------------------------------------


def test_errors_have_the_spec_shape(http):
    ok(http.post(f"{NS}/db/create", json={}))
    declare(http, "db$t")
    err(http.post(f"{TABLE}/db$t/count_rows", json={}), 406, 0)
    err(http.post(f"{TABLE}/db$t/index/list", json={}), 406, 0)
    err(http.post(f"{TABLE}/db$t/rename", json={"new_table_name": "u"}), 406, 0)
    err(http.get(f"{TABLE}/db$t/describe"), 400, 13)          # a served operation, the wrong method
    err(http.post("/v1/transaction/abc/describe", json={}), 404, 10)
    err(http.post(f"{TABLE}/db$t/declare", content=b"{not json"), 400, 13)
    err(http.post(f"{TABLE}/db$t/declare", json=[1, 2]), 400, 13)
    err(http.post(f"{TABLE}/db$t/version/create", json={"version": 1}), 400, 13)
    err(http.post(f"{TABLE}/db$t/declare", json={"properties": {"a": 1}}), 400, 13)
    err(http.post(f"{TABLE}/db$t/describe", params={"delimiter": ""}, json={}), 400, 13)
    # A level holding '/' (Lance's client sends %2F; routing decodes it): invalid input, not an operation.
    for path in (f"{NS}/a%2Fb/create", f"{TABLE}/db$t%2F1/describe", f"{TABLE}/db$t%2f1/version/create",
                 f"{TABLE}/db$t%2F1/index/i/drop",
                 f"{NS}/db%2Ftable/list", f"{TABLE}/db$t%2Fversion/describe"):   # decoded, these are other routes
        assert "'/'" in err(http.post(path, json={}), 400, 13)["error"], path
    assert "'/'" in err(http.get(f"{NS}/db%2Ftable/list"), 400, 13)["error"]


def test_lance_and_iceberg_share_v1_without_ambiguity(http):
    ok(http.post(f"{NS}/db/create", json={}))
    assert ok(http.get("/v1/config"))["defaults"] == {}
    # The same name in the other protocol is another namespace.
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    assert http.get("/v1/namespaces").json()["namespaces"] == [["db"]]
    assert ok(http.get(f"{NS}/$/list")) == {"namespaces": ["db"]}
    # A Lance table named like an Iceberg route segment stays a Lance table.
    declare(http, "db$namespaces")
    ok(http.post(f"{TABLE}/db$namespaces/describe", json={}))
    assert http.get("/v1/namespaces/db/tables").json()["identifiers"] == []


def test_a_writers_own_final_manifest_in_flight_survives_another_writers_conflict(http):
    """A writer may hand in a final name as manifest_path (it wrote `_versions/<v2>` itself). Another writer that
    sees that file proposes v3 and is refused, which makes the table reload; the reload must not remove the first
    writer's file before its version/create arrives (only unrecorded manifests older than
    lance_unrecorded_grace_s are removed)."""
    ok(http.post(f"{NS}/db/create", json={}))
    loc = declare(http, "db$inflight")["location"]
    ok(create_version(http, "db$inflight", 1, stage(loc, 1)))
    final = loc.removeprefix("file:///") + "/_versions/" + manifest_name(2, "V2")
    local(final).write_bytes(fake_manifest())   # writer A's own final name for version 2
    err(create_version(http, "db$inflight", 3, stage(loc, 3)), 409, 14)   # writer B saw it: "ahead"
    time.sleep(1.1)   # past the actor's reload interval: the next request reloads
    assert versions(http, "db$inflight") == [1]
    assert local(final).exists()
    r = create_version(http, "db$inflight", 2, final)
    assert r.status_code == 200, r.text
    assert versions(http, "db$inflight") == [1, 2]
