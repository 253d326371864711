"""A fourth format that lives only here: a versioned pointer (a table is a version number and the target it points
at; a commit moves it to a new target if the version it expects is the latest), with a protocol of its own.

It is declared as every format is (coordinator/format.py `Format`, api/protocol.py `Protocol`) and handed to the
service beside the three it ships with, with no edit anywhere else: its commits, commits across formats, the commit
feed and its `format=` filter, metrics, grants and the console take it as they take the others. One of its routes is
declared to be served straight from ASGI (api/direct.py), as the others' commits are.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import httpx
import pytest
from pydantic import BaseModel, ConfigDict
from quart import Blueprint, Response

from api.access import CREATE, READ, WRITE, guard
from api.console import COOKIE
from api.common import CommitPart, json_model, json_response, parse_model, read_model
from api.context import service
from api.direct import direct
from api.error_map import ErrorMap
from api.protocol import Protocol, Protocols
from api.protocols import PROTOCOLS
from api.server import EmbeddedService
from coordinator.auth import Grants
from coordinator.decision import Change, Decision, PlannedPart
from coordinator.errors import (BadRequest, CommitConflict, CoordinatorError, Forbidden, NamespaceExists,
                                NoSuchNamespace, NoSuchTable, NotFound, TableExists, Unauthorized, from_storage)
from coordinator.format import Format, Services, TableKind
from coordinator.names import Names
from storage.records import TableRow
from tests.support import fetch_token, write_auth_file

NAME = "pointer"
EVENTS = "/api/coordinator/v1/events"


# -- the format: its state, its one commit rule, its service ----------------------------------------------------


@dataclass(frozen=True)
class Pointer:
    version: int
    target: str

    def row_state(self) -> dict:
        return {"version": self.version, "target": self.target}


async def load(services: Services, row: TableRow) -> Pointer:
    return Pointer(row.state["version"], row.state["target"])


def _change(what: str, state: Pointer) -> Change:
    return Change(f"{NAME}.table.{what}", {"format": NAME, "version": state.version, "target": state.target})


@dataclass(frozen=True)
class Move:
    """Point at `target`, if `expected` is still the table's version."""

    expected: int
    target: str
    counts_as_commit = True   # (a commit in the metrics: a change of the table's contents)

    def decide(self, state: Pointer) -> Decision:
        if state.version != self.expected:
            raise CommitConflict(f"the pointer is at version {state.version}, not {self.expected}")
        moved = Pointer(state.version + 1, self.target)
        return Decision(state=moved, reply=moved, row_state=moved.row_state(), changes=[_change("committed", moved)])


@dataclass(frozen=True)
class Read:
    def decide(self, state: Pointer) -> Decision:
        return Decision(state=state, reply=state)


class PointerService:
    def __init__(self, services: Services):
        self.store, self.registry = services.store, services.registry
        self.names: Names[tuple[str, str], uuid.UUID] = Names(
            self.registry, self._find, lambda name: NoSuchTable(f"no pointer {'.'.join(name)}"))

    async def _find(self, name: tuple[str, str]) -> uuid.UUID:
        row = await self.store.find_table(NAME, "", *name)
        if row is None:
            raise NoSuchTable(f"no pointer {'.'.join(name)}")
        return row.table_id

    async def create_namespace(self, namespace: str) -> None:
        await self.store.create_namespace(NAME, "", namespace, {})

    async def create(self, namespace: str, name: str, target: str) -> Pointer:
        state = Pointer(0, target)
        row = TableRow(table_id=uuid.uuid4(), realm=NAME, catalog="", namespace=namespace, name=name, format=NAME,
                       location=None, state=state.row_state())
        await self.registry.create(row, state=state, row_state=state.row_state(), changes=[_change("created", state)])
        self.names.remember((namespace, name), row.table_id)
        return state

    async def get(self, name: tuple[str, str]) -> Pointer:
        return await self.names.submit(name, Read)

    async def move(self, name: tuple[str, str], expected: int, target: str) -> Pointer:
        return await self.names.submit(name, lambda: Move(expected, target))

    async def plan_commit(self, name: tuple[str, str], expected: int, target: str) -> PlannedPart:
        return PlannedPart(await self.names.id(name), Move(expected, target), lambda p: {"version": p.version})


POINTER: Format[PointerService] = Format(
    name=NAME, realm=NAME, catalog_called="catalog", tables={NAME: TableKind(load)},
    grants=Grants(shape=f"{NAME}/<namespace>/<name>", table_depth=3, exact=True, catalog=False),
    service=PointerService, changes=tuple(f"{NAME}.table.{what}" for what in ("created", "committed")))


# -- its protocol: routes, errors, its part of a commit across formats -----------------------------------------

bp = Blueprint(NAME, __name__, url_prefix=f"/{NAME}/v1")


class MoveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    expected: int
    target: str


class CreateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: str


def _table(namespace: str, name: str):
    return POINTER.table("", (namespace,), name)


@bp.post("/<namespace>")
@guard(lambda namespace: [(CREATE, POINTER.container("", (namespace,)))])
async def create_namespace(namespace: str) -> Response:
    await service(POINTER).create_namespace(namespace)
    return json_response({})


@bp.post("/<namespace>/<name>")
@guard(lambda namespace, name: [(CREATE, POINTER.container("", (namespace,)))])
async def create(namespace: str, name: str) -> Response:
    state = await service(POINTER).create(namespace, name, (await read_model(CreateRequest)).target)
    return json_response(state.row_state())


@bp.get("/<namespace>/<name>")
@guard(lambda namespace, name: [(READ, _table(namespace, name))])
async def get(namespace: str, name: str) -> Response:
    return json_response((await service(POINTER).get((namespace, name))).row_state())


async def _move_needs(coordinator, req, part) -> list:
    return [(WRITE, _table(req.view_args["namespace"], req.view_args["name"]))]


@bp.post("/<namespace>/<name>/move")
@direct(needs=_move_needs, read=json_model(MoveRequest))
async def move(coordinator, req, body: MoveRequest) -> Response:
    args = req.view_args
    moved = await coordinator.service(POINTER).move((args["namespace"], args["name"]), body.expected, body.target)
    return json_response(moved.row_state())


ERRORS: ErrorMap[str] = ErrorMap(
    rows=((NoSuchNamespace, 404, "NO_NAMESPACE"), (NotFound, 404, "NO_POINTER"),
          (NamespaceExists, 409, "EXISTS"), (TableExists, 409, "EXISTS"), (CommitConflict, 409, "MOVED"),
          (BadRequest, 400, "BAD_REQUEST"), (Unauthorized, 401, "UNAUTHENTICATED"), (Forbidden, 403, "FORBIDDEN")),
    fault=(None, "INTERNAL"), otherwise=(None, "FAILED"))


def error_response(exc: BaseException, req) -> Response:
    exc = from_storage(exc)
    if not isinstance(exc, CoordinatorError):   # the framework's own (no route: 404)
        return json_response({"pointer_error": "NO_ROUTE", "message": str(exc)}, getattr(exc, "code", 400) or 400)
    status, code = ERRORS(exc)
    return json_response({"pointer_error": code, "message": exc.message}, status)


def cross_format_part(body: dict) -> CommitPart:
    named = parse_model(_Named, body)
    name = (named.namespace, named.name)

    async def needs() -> list:
        return [(WRITE, _table(*name))]

    def read():
        req = parse_model(_CrossMove, body)

        async def plan():
            return await service(POINTER).plan_commit(name, req.expected, req.target)
        return plan
    return CommitPart(f"{NAME} {'.'.join(name)}", needs, read, ERRORS)


class _Named(BaseModel):
    model_config = ConfigDict(extra="ignore")
    namespace: str
    name: str


class _CrossMove(MoveRequest):
    model_config = ConfigDict(extra="forbid")
    namespace: str
    name: str


PROTOCOL = Protocol(POINTER, paths=(f"/{NAME}/",), blueprints=(bp,), error_response=error_response,
                    cross_format_part=cross_format_part)
WITH_POINTER = Protocols((*PROTOCOLS, PROTOCOL))   # the registration: the service's protocols, and this one


# -- the proof ----------------------------------------------------------------------------------------------------

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


@pytest.fixture
def served(config):
    with EmbeddedService(config, protocols=WITH_POINTER) as base, httpx.Client(base_url=base, timeout=30) as http:
        assert http.post("/pointer/v1/ns").status_code == 200
        created = http.post("/pointer/v1/ns/p", json={"target": "a"})
        assert created.status_code == 200 and created.json() == {"version": 0, "target": "a"}, created.text
        yield base, http


def _commit_count(http: httpx.Client, outcome: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(f'coordinator_commits_total{{format="{NAME}",outcome="{outcome}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_its_commits_its_errors_and_its_metrics(served, monkeypatch):
    _, http = served
    import api.direct
    direct_serves = []
    serve = api.direct.DirectRoutes.serve

    async def counted(self, taken, *args):
        direct_serves.append(taken[1].endpoint)
        return await serve(self, taken, *args)
    monkeypatch.setattr(api.direct.DirectRoutes, "serve", counted)

    moved = http.post("/pointer/v1/ns/p/move", json={"expected": 0, "target": "b"})
    assert moved.status_code == 200 and moved.json() == {"version": 1, "target": "b"}, moved.text
    assert direct_serves == ["pointer.move"], "its commit is served straight from ASGI, as declared"
    stale = http.post("/pointer/v1/ns/p/move", json={"expected": 0, "target": "c"})
    assert stale.status_code == 409 and stale.json()["pointer_error"] == "MOVED", stale.text
    assert http.get("/pointer/v1/ns/p").json() == {"version": 1, "target": "b"}, "the refused commit changed nothing"
    missing = http.get("/pointer/v1/ns/nope")
    assert missing.status_code == 404 and missing.json()["pointer_error"] == "NO_POINTER", missing.text
    bad = http.post("/pointer/v1/ns/p/move", json={"expected": "one"})
    assert bad.status_code == 400 and bad.json()["pointer_error"] == "BAD_REQUEST", bad.text
    assert http.get("/pointer/v1/nowhere/at/all").json()["pointer_error"] == "NO_ROUTE", "its paths, its errors"
    assert _commit_count(http, "applied") >= 1 and _commit_count(http, "conflict") >= 1
    assert 'coordinator_request_seconds_count{protocol="pointer"' in http.get("/metrics").text


def test_a_commit_across_formats_takes_it_with_the_others(served):
    _, http = served
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    iceberg = {"format": "iceberg", "identifier": {"namespace": ["db"], "name": "t"}, "requirements": [],
               "updates": [{"action": "set-properties", "updates": {"k": "v"}}]}
    pointer = {"format": NAME, "namespace": "ns", "name": "p", "expected": 0, "target": "x"}
    r = http.post("/api/coordinator/v1/commit", json={"parts": [iceberg, pointer]})
    assert r.status_code == 200 and r.json()["results"][1] == {"version": 1}, r.text
    # A part that conflicts refuses the whole commit, in the words of its own protocol, and nothing applies.
    iceberg["updates"] = [{"action": "set-properties", "updates": {"k": "w"}}]
    r = http.post("/api/coordinator/v1/commit", json={"parts": [iceberg, pointer]})
    assert r.status_code == 409 and r.json()["error"]["part"] == 1 and r.json()["error"]["type"] == "MOVED", r.text
    assert http.get("/v1/namespaces/db/tables/t").json()["metadata"]["properties"]["k"] == "v"
    assert http.get("/pointer/v1/ns/p").json() == {"version": 1, "target": "x"}
    unknown = http.post("/api/coordinator/v1/commit", json={"parts": [{**pointer, "format": "fifth"}]})
    assert unknown.status_code == 400 and NAME in unknown.json()["error"]["message"], unknown.text


def test_the_feed_carries_its_events_and_filters_by_it(served):
    _, http = served
    assert http.post("/pointer/v1/ns/p/move", json={"expected": 0, "target": "b"}).status_code == 200
    assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    ours = http.get(EVENTS, params={"format": NAME}).json()["events"]
    assert [e["type"] for e in ours] == ["pointer.table.created", "pointer.table.committed"], ours
    assert ours[1]["subject"] == "ns.p" and ours[1]["data"]["target"] == "b"
    everything = http.get(EVENTS).json()["events"]
    assert {e["type"].split(".")[0] for e in everything} == {NAME, "iceberg"}
    r = http.get(EVENTS, params={"format": "fifth"})
    assert r.status_code == 400 and NAME in r.json()["error"]["message"], r.text


def test_grants_console_and_feed_reach_it_as_they_reach_the_others(config, tmp_path):
    config.auth_file = write_auth_file(tmp_path / "auth.toml", {
        "admin": ("s1", [("*", ["read", "write", "create", "drop"])]),
        "reader": ("s2", [(f"{NAME}/ns", ["read"])]),
        "other": ("s3", [(f"{NAME}/elsewhere", ["read", "write"])])})
    with EmbeddedService(config, protocols=WITH_POINTER) as base:
        tokens = {c: fetch_token(base, c, s) for c, s in (("admin", "s1"), ("reader", "s2"), ("other", "s3"))}

        def client(who: str) -> httpx.Client:
            return httpx.Client(base_url=base, timeout=30, headers={"Authorization": f"Bearer {tokens[who]}"})
        with client("admin") as admin, client("reader") as reader, client("other") as other:
            assert admin.post("/pointer/v1/ns").status_code == 200
            assert admin.post("/pointer/v1/ns/p", json={"target": "a"}).status_code == 200
            assert reader.get("/pointer/v1/ns/p").json() == {"version": 0, "target": "a"}
            refused = reader.post("/pointer/v1/ns/p/move", json={"expected": 0, "target": "b"})
            assert refused.status_code == 403 and refused.json()["pointer_error"] == "FORBIDDEN", refused.text
            assert other.get("/pointer/v1/ns/p").status_code == 403
            assert httpx.get(base + "/pointer/v1/ns/p").status_code == 401
            assert admin.get("/pointer/v1/ns/p").json()["version"] == 0, "the refused commit changed nothing"
            # The feed shows each reader the events of what it may read.
            assert len(reader.get(EVENTS, params={"format": NAME}).json()["events"]) == 1
            assert other.get(EVENTS).json()["events"] == []
            # The console lists the table to whoever may read it, and shows its page.
            table_id = admin.get(EVENTS).json()["events"][0]["data"]["table-id"]
            reader.cookies.set(COOKIE, tokens["reader"])
            other.cookies.set(COOKIE, tokens["other"])
            home = reader.get("/ui/")
            assert home.status_code == 200 and f"/ui/tables/{table_id}" in home.text, home.text[:2000]
            assert f'format {NAME}' in home.text
            assert f"/ui/tables/{table_id}" not in other.get("/ui/").text
            page = reader.get(f"/ui/tables/{table_id}")
            assert page.status_code == 200 and NAME in page.text, page.text[:2000]
            assert other.get(f"/ui/tables/{table_id}").status_code == 404
