"""Lance Namespace REST routes (`/v1/namespace/{id}/...`, `/v1/table/{id}/...`): parse, call the service, answer.

Spec: lance-namespace-rest-open-api.yaml with lance-namespace-rest-catalog.md. `{id}` is the object's levels
joined by the `delimiter` query parameter (default `$`); the delimiter alone is the root namespace. Errors are
answered by `errors.py`. These routes share `/v1` with Iceberg's, which reserves the prefixes "namespace",
"table" and "transaction" so that every Lance path is unambiguous.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import unquote

from pydantic import BaseModel
from quart import Blueprint, Response, request

from coordinator.auth import Privilege
from coordinator.errors import BadRequest, NoSuchTransaction, Unsupported
from coordinator.lance import (BatchCommitTablesRequest, BatchCreateTableVersionsRequest,
                               BatchDeleteTableVersionsRequest, CreateNamespaceRequest, CreateTableVersionRequest,
                               DeclareTableRequest, DeregisterTableRequest, DescribeNamespaceRequest,
                               DescribeTableRequest, DescribeTableVersionRequest, DropNamespaceRequest,
                               DropTableRequest, RegisterTableRequest, TableExistsRequest)
from coordinator.lance.format import LANCE

from ..access import CREATE, DROP, READ, WRITE, Needs, authenticated, guard, listing, visible
from ..common import CommitPart, empty_response, fields_of, json_response, parse_model
from ..direct import before_request, direct
from .errors import ERRORS
from .requests import (_arg_bool, _batch_commit_needs, _batch_create_needs, _body, _catalog, _creating, _delimiter,
                       _in_parent, _levels, _limit, _model_of, _namespace_securable, _on_namespace, _on_table, _page,
                       _same_id, _table, _table_securable, declare_response, removed_response, version_response)

log = logging.getLogger(__name__)

bp = Blueprint(LANCE.name, __name__)


@before_request(bp)
async def no_slash_in_the_id(coordinator, req) -> None:
    """`/v1/table/a%2Fb/describe`: the path is decoded before routing, so a `/` in an id level would make another
    route (or another id) serve the request. The raw path still tells."""
    raw = req.raw_path.split(b"/")
    if len(raw) > 3 and b"%2f" in raw[3].lower():
        raise BadRequest(f"invalid identifier {unquote(raw[3].decode('latin-1'))!r}: an identifier level may not "
                         f"contain '/'")


# -- namespaces --------------------------------------------------------------------------------------------------


@bp.post("/v1/namespace/<id>/create")
@guard(_creating(CreateNamespaceRequest, _namespace_securable))
async def create_namespace(id: str) -> Response:
    ns = _levels(id)
    body = await _body(CreateNamespaceRequest, ns)
    props = await _catalog().create_namespace(ns, body.mode, body.properties)
    return json_response({"properties": props})


@bp.route("/v1/namespace/<id>/list", methods=["GET", "POST"])
@guard(listing(_on_namespace(READ)))
async def list_namespaces(id: str) -> Response:
    ns = _levels(id)
    page = await _catalog().list_namespaces(ns, request.args.get("page_token"), _limit())
    return _page("namespaces", page, [name for name in page.items if visible(_namespace_securable((*ns, name)))])


@bp.post("/v1/namespace/<id>/describe")
@guard(_on_namespace(READ))
async def describe_namespace(id: str) -> Response:
    ns = _levels(id)
    await _body(DescribeNamespaceRequest, ns)
    return json_response({"properties": await _catalog().describe_namespace(ns)})


@bp.post("/v1/namespace/<id>/exists")
@guard(_on_namespace(READ))
async def namespace_exists(id: str) -> Response:
    ns = _levels(id)
    await _body(DescribeNamespaceRequest, ns)
    await _catalog().describe_namespace(ns)
    return empty_response(200)


@bp.post("/v1/namespace/<id>/drop")
@guard(_on_namespace(DROP))
async def drop_namespace(id: str) -> Response:
    ns = _levels(id)
    body = await _body(DropNamespaceRequest, ns)
    props = await _catalog().drop_namespace(ns, body.mode, body.behavior)
    return json_response({"properties": props})


@bp.route("/v1/namespace/<id>/table/list", methods=["GET", "POST"])
@guard(listing(_on_namespace(READ)))
async def list_tables(id: str) -> Response:
    ns = _levels(id)
    page = await _catalog().list_tables(ns, request.args.get("page_token"), _limit(),
                                        _arg_bool("include_declared", True))
    return _page("tables", page, [name for name in page.items if visible(_table_securable((*ns, name)))])


# -- tables ------------------------------------------------------------------------------------------------------


@bp.route("/v1/table", methods=["GET"])
@bp.route("/v1/table/", methods=["GET"])
@bp.route("/v1/table/list", methods=["GET"])
@guard(listing(lambda: [(READ, LANCE.container(""))]))
async def list_all_tables() -> Response:
    delimiter = _delimiter()
    page = await _catalog().list_tables(None, request.args.get("page_token"), _limit(),
                                        _arg_bool("include_declared", True))
    return _page("tables", page, [delimiter.join(ident) for ident in page.items
                                  if visible(_table_securable(tuple(ident)))])


@bp.post("/v1/table/<id>/declare")
@guard(_in_parent(CREATE))
async def declare_table(id: str) -> Response:
    ident = _table(id)
    body = await _body(DeclareTableRequest, ident)
    table = await _catalog().declare_table(ident, body.location, body.properties)
    return json_response(declare_response(table))


@bp.post("/v1/table/<id>/describe")
@guard(_on_table(READ))
async def describe_table(id: str) -> Response:
    ident = _table(id)
    body = await _body(DescribeTableRequest, ident)
    with_uri = _arg_bool("with_table_uri", body.with_table_uri or False)
    check_declared = _arg_bool("check_declared", body.check_declared or False)
    if _arg_bool("load_detailed_metadata", body.load_detailed_metadata or False):
        raise Unsupported("load_detailed_metadata: this server tracks versions and does not open datasets; "
                          "open the table with Lance for its schema and statistics")
    if body.tag is not None:
        raise Unsupported("describe by tag: tags live in the dataset (_refs/tags); resolve the tag with Lance")
    table = await _catalog().describe_table(ident, body.version, body.branch)
    out: dict[str, Any] = {"table": table.name, "namespace": list(table.namespace), "location": table.location,
                           "storage_options": {}, "properties": dict(table.properties), "managed_versioning": True}
    if body.version is not None:
        out["version"] = body.version
    if with_uri:
        out["table_uri"] = table.location
    if check_declared:
        out["is_only_declared"] = table.only_declared
    return json_response(out)


@bp.post("/v1/table/<id>/exists")
@guard(_on_table(READ))
async def table_exists(id: str) -> Response:
    ident = _table(id)
    body = await _body(TableExistsRequest, ident)
    await _catalog().describe_table(ident, body.version)
    return empty_response(200)


@bp.post("/v1/table/<id>/register")
@guard(_creating(RegisterTableRequest, _table_securable))
async def register_table(id: str) -> Response:
    ident = _table(id)
    body = await _body(RegisterTableRequest, ident)
    table = await _catalog().register_table(ident, body.location, body.mode, body.properties)
    return json_response({"location": table.location, "properties": dict(table.properties)})


@bp.post("/v1/table/<id>/deregister")
@guard(_on_table(DROP))
async def deregister_table(id: str) -> Response:
    ident = _table(id)
    await _body(DeregisterTableRequest, ident)
    return json_response(removed_response(await _catalog().deregister_table(ident)))


@bp.post("/v1/table/<id>/drop")
@guard(_on_table(DROP))
async def drop_table(id: str) -> Response:
    ident = _table(id)
    await _body(DropTableRequest, ident)
    return json_response(removed_response(await _catalog().drop_table(ident)))


# -- versions ----------------------------------------------------------------------------------------------------


# What a Lance writer asks for each commit (pylance: the latest version, perhaps its manifest, then the new one)
# is served without Quart's request machinery (api/direct.py).


def _on_the_table(privilege: Privilege):
    async def needs(coordinator, req, part) -> Needs:
        return _on_table(privilege)(req.view_args["id"], _delimiter(req.args))
    return needs


def _the_table(req, body: BaseModel | None) -> tuple[str, ...]:
    """The route's table, as `_table` and `_body` read it (a body naming another id is refused)."""
    ident = _table(req.view_args["id"], _delimiter(req.args))
    if body is not None:
        _same_id(body, ident)
    return ident


def _body_as(model: type[BaseModel]):
    return lambda req: _model_of(model, req.body)


@bp.post("/v1/table/<id>/version/create")
@direct(needs=_on_the_table(WRITE), read=_body_as(CreateTableVersionRequest))
async def create_table_version(coordinator, req, body: CreateTableVersionRequest) -> Response:
    version = await coordinator.service(LANCE).create_table_version(_the_table(req, body), body)
    return json_response(version_response(version))


@bp.post("/v1/table/<id>/version/describe")
@direct(needs=_on_the_table(READ), read=_body_as(DescribeTableVersionRequest))
async def describe_table_version(coordinator, req, body: DescribeTableVersionRequest) -> Response:
    version = await coordinator.service(LANCE).describe_table_version(_the_table(req, body), body.version,
                                                                       body.branch)
    return json_response(version_response(version))


@bp.route("/v1/table/<id>/version/list", methods=["GET", "POST"])
@direct(needs=_on_the_table(READ))
async def list_table_versions(coordinator, req, body: None) -> Response:
    args = req.args
    page = await coordinator.service(LANCE).list_table_versions(
        _the_table(req, None), _limit(args), args.get("page_token"), _arg_bool("descending", False, args),
        args.get("branch"))
    return _page("versions", page, [v.to_spec() for v in page.items])


@bp.post("/v1/table/<id>/version/delete")
@guard(_on_table(WRITE))
async def delete_table_versions(id: str) -> Response:
    ident = _table(id)
    body = await _body(BatchDeleteTableVersionsRequest, ident)
    ranges = [(r.start_version, r.end_version) for r in body.ranges]
    count = await _catalog().delete_table_versions(ident, ranges, body.branch)
    return json_response({"deleted_count": count})


@bp.post("/v1/table/version/batch-create")
@guard(_batch_create_needs)
async def batch_create_table_versions() -> Response:
    body = await _body(BatchCreateTableVersionsRequest)
    entries = [(tuple(e.id), e) for e in body.entries]
    versions = await _catalog().batch_create_versions(entries)
    return json_response({"versions": [v.to_spec() for v in versions]})


@bp.post("/v1/table/batch-commit")
@guard(_batch_commit_needs)
async def batch_commit() -> Response:
    body = await _body(BatchCommitTablesRequest)
    ops = []
    for i, op in enumerate(body.operations):
        if not op.request.id:
            raise BadRequest(f"operation {i} ({op.kind}): id is required")
        ops.append((op.kind, tuple(op.request.id), op.request))
    results = await _catalog().batch_commit(ops)
    return json_response({"results": [{kind: _result(kind, reply)} for kind, reply in results]})


def _result(kind: str, reply: Any) -> dict[str, Any]:
    if kind == "declare_table":
        return declare_response(reply)
    if kind == "create_table_version":
        return version_response(reply)
    if kind == "delete_table_versions":
        return {"deleted_count": reply}
    return removed_response(reply)


# -- everything else under the Lance prefixes --------------------------------------------------------------------


@bp.post("/v1/transaction/<id>/describe")
@bp.post("/v1/transaction/<id>/alter")
@guard(authenticated)
async def transaction(id: str) -> Response:
    raise NoSuchTransaction(f"no transaction {id!r}: this server applies every commit synchronously and issues "
                            f"no transaction ids")


SERVED = {"create", "list", "describe", "exists", "drop", "table/list", "declare", "register", "deregister",
          "version/create", "version/describe", "version/list", "version/delete"}


@bp.route("/v1/table/<id>/<path:operation>", methods=["GET", "POST"])
@bp.route("/v1/namespace/<id>/<path:operation>", methods=["GET", "POST"])
@guard(authenticated)
async def unsupported(id: str, operation: str) -> Response:
    if operation in SERVED:
        raise BadRequest(f"{operation} is served with another method: see the spec (lists take GET, others "
                         f"POST)")
    raise Unsupported(f"operation {operation!r} is not supported: this server is the commit authority for "
                      f"Lance tables (namespaces, tables, versions); read and write data with Lance itself")


def cross_format_part(body: dict) -> CommitPart:
    """A Lance `CreateTableVersionRequest` (its table named by `id`) as a part of a cross-format commit
    (api/commits.py)."""
    named = parse_model(fields_of(CreateTableVersionRequest, "id"), body)
    if not named.id:
        raise BadRequest("id is required: the table's identifier levels")
    ident = tuple(named.id)

    async def needs() -> Needs:
        return [(WRITE, _table_securable(ident))]

    def read():
        req = parse_model(CreateTableVersionRequest, body)

        async def plan():
            return await _catalog().plan_commit(ident, req)
        return plan

    return CommitPart(f"lance {'.'.join(ident)}", needs, read, ERRORS)
