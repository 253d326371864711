"""Lance Namespace REST routes (`/v1/namespace/{id}/...`, `/v1/table/{id}/...`): parse, call the service, answer.

Spec: lance-namespace-rest-open-api.yaml with lance-namespace-rest-catalog.md. `{id}` is the object's levels
joined by the `delimiter` query parameter (default `$`); the delimiter alone is the root namespace. Errors are
answered by `errors.py`. These routes share `/v1` with Iceberg's, which reserves the prefixes "namespace",
"table" and "transaction" so that every Lance path is unambiguous.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict
from quart import Blueprint, Response, request

from coordinator.auth import Privilege, Resource
from coordinator.errors import BadRequest, NoSuchTransaction, Unsupported
from coordinator.lance import (BatchCommitTablesRequest, BatchCreateTableVersionsRequest,
                               BatchDeleteTableVersionsRequest, CreateNamespaceRequest, CreateTableVersionRequest,
                               DeclareTableRequest, DeregisterTableRequest, DescribeNamespaceRequest,
                               DescribeTableRequest, DescribeTableVersionRequest, DropNamespaceRequest,
                               DropTableRequest, LanceTable, Page, RegisterTableRequest, TableExistsRequest,
                               TableVersion)
from coordinator.lance.format import LANCE
from coordinator.lance.models import CreateTableVersionEntry

from ..access import CREATE, DROP, READ, WRITE, Needs, authenticated, guard, listing, visible
from ..common import CommitPart, empty_response, fields_of, json_response, parse_json, parse_model, parsed_once
from ..direct import DirectRoute
from ..context import service
from .errors import ERRORS

log = logging.getLogger(__name__)

bp = Blueprint(LANCE.name, __name__)

DEFAULT_DELIMITER = "$"

@bp.before_request
async def _no_slash_in_the_id() -> None:
    no_slash_in_the_id(request.scope.get("raw_path") or b"")


def no_slash_in_the_id(raw_path: bytes) -> None:
    """`/v1/table/a%2Fb/describe`: the path is decoded before routing, so a `/` in an id level would make another
    route (or another id) serve the request. The raw path still tells."""
    raw = raw_path.split(b"/")
    if len(raw) > 3 and b"%2f" in raw[3].lower():
        raise BadRequest(f"invalid identifier {unquote(raw[3].decode('latin-1'))!r}: an identifier level may not "
                         f"contain '/'")


# -- request plumbing ------------------------------------------------------------------------------------------


def _catalog():
    return service(LANCE)


def _delimiter(args=None) -> str:
    """The `delimiter` query parameter (of `args`; None: the request's)."""
    value = (request.args if args is None else args).get("delimiter", DEFAULT_DELIMITER)
    if not value:
        raise BadRequest("delimiter must not be empty")
    return value


def _levels(raw: str, delimiter: str | None = None) -> tuple[str, ...]:
    """An id's levels, joined by `delimiter` (None: the request's `delimiter` parameter)."""
    delimiter = _delimiter() if delimiter is None else delimiter
    if raw == delimiter:
        return ()
    levels = tuple(raw.split(delimiter))
    if any(not level for level in levels):
        raise BadRequest(f"invalid identifier {raw!r}: empty level (delimiter {delimiter!r})")
    return levels


def _table(raw: str, delimiter: str | None = None) -> tuple[str, ...]:
    levels = _levels(raw, delimiter)
    if not levels:
        raise BadRequest("a table identifier cannot be the root namespace")
    return levels


async def _body(model: type[BaseModel], levels: tuple[str, ...] | None = None) -> Any:
    """The JSON body as `model`, parsed once per request (the batch routes' access policies read it too). A
    missing body (pylance sends none for some operations) or JSON `null` reads as `{}`. An `id` in the body
    must agree with the route (spec: "Standard Operations")."""
    body = await parsed_once(model, lambda: _read_body(model))
    if levels is not None:
        _same_id(body, levels)
    return body


def _same_id(body: BaseModel, levels: tuple[str, ...]) -> None:
    body_id = getattr(body, "id", None)
    if body_id is not None and tuple(body_id) != levels:
        raise BadRequest(f"the id in the body {body_id!r} does not match the id in the route {list(levels)!r}")


async def _read_body(model: type[BaseModel]) -> Any:
    return parse_model(model, await parsed_once("lance-body", _read_object))


async def _read_object() -> dict[str, Any]:
    return _object_of(await request.get_data())


def _model_of(model: type[BaseModel], data: bytes) -> Any:
    return parse_model(model, _object_of(data))


def _object_of(data: bytes) -> dict[str, Any]:
    value = parse_json(data) if data.strip() else {}
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise BadRequest("request body must be a JSON object")
    return value


# -- access: what each route needs (api/access.py enforces it) -------------------------------------------------

_BATCH_PRIVILEGES = {"declare_table": CREATE, "create_table_version": WRITE, "delete_table_versions": WRITE,
                     "deregister_table": DROP}


def _namespace_securable(levels: tuple[str, ...]) -> Resource:
    return LANCE.container("", levels)


def _table_securable(ident: tuple[str, ...]) -> Resource:
    """A table's securable: its namespace's, then its name as a table's (an id of no level names no table, and
    is refused as such by the route; its securable is then the whole Lance realm)."""
    return LANCE.table("", ident[:-1], ident[-1]) if ident else LANCE.container("")


def _on_namespace(privilege: Privilege):
    """The namespace named by the route's id."""
    return lambda id, **_: [(privilege, _namespace_securable(_levels(id)))]


def _on_table(privilege: Privilege):
    """The table named by the route's id (its levels joined by `delimiter`; None: the request's)."""
    return lambda id, delimiter=None, **_: [(privilege, _table_securable(_levels(id, delimiter)))]


def _in_parent(privilege: Privilege):
    """The namespace that holds the table or namespace the route's id names (a create's)."""
    return lambda id, **_: [(privilege, _namespace_securable(_levels(id)[:-1]))]


def _creating(model: type[BaseModel], replaces: Callable[[tuple[str, ...]], Resource]):
    """CREATE in the parent namespace, and with mode overwrite DROP on what `replaces` names (the named namespace
    or table) too: an overwrite drops what is there (a namespace with its tables and their data; a table's
    registration)."""
    async def needs(id: str) -> Needs:
        levels = _levels(id)
        out = [(CREATE, _namespace_securable(levels[:-1]))]
        body = await _body(fields_of(model, "id", "mode"), levels)
        if (body.mode or "").replace("_", "").lower() == "overwrite":   # as models.parse_mode reads it
            out.append((DROP, replaces(levels)))
        return out
    return needs


# What the batch routes' policies read: each entry's or operation's table (and an operation's kind), not the rest.
_EntryTable = fields_of(CreateTableVersionEntry, "id")
_DeclaredTable = fields_of(DeclareTableRequest, "id")
_VersionTable = fields_of(CreateTableVersionRequest, "id")
_DeletedVersionsTable = fields_of(BatchDeleteTableVersionsRequest, "id")
_DeregisteredTable = fields_of(DeregisterTableRequest, "id")


class _EntryTables(BaseModel):
    model_config = ConfigDict(extra="ignore")
    entries: list[_EntryTable]


class _OperationTable(BaseModel):
    """An operation that sets more than one kind is refused by the whole model (after); each is checked here."""

    model_config = ConfigDict(extra="ignore")
    declare_table: Optional[_DeclaredTable] = None
    create_table_version: Optional[_VersionTable] = None
    delete_table_versions: Optional[_DeletedVersionsTable] = None
    deregister_table: Optional[_DeregisteredTable] = None


class _OperationTables(BaseModel):
    model_config = ConfigDict(extra="ignore")
    operations: list[_OperationTable]


async def _batch_create_needs() -> Needs:
    body = await _body(_EntryTables)
    return [(WRITE, _table_securable(tuple(e.id))) for e in body.entries]


async def _batch_commit_needs() -> Needs:
    body = await _body(_OperationTables)
    needs = []
    for op in body.operations:
        for kind in _BATCH_PRIVILEGES:
            named = getattr(op, kind)
            if named is None:
                continue
            ident = tuple(named.id or ())
            if kind == "declare_table":
                needs.append((CREATE, _namespace_securable(ident[:-1])))
            else:
                needs.append((_BATCH_PRIVILEGES[kind], _table_securable(ident)))
    return needs


def _arg_bool(name: str, default: bool | None = None, args=None) -> bool | None:
    """A boolean query parameter (of `args`; None: the request's)."""
    raw = (request.args if args is None else args).get(name)
    if raw is None:
        return default
    low = raw.lower()
    if low in ("true", "1"):
        return True
    if low in ("false", "0"):
        return False
    raise BadRequest(f"query parameter {name} must be true or false, got {raw!r}")


def _arg_int(name: str, minimum: int, args=None) -> int | None:
    """An integer query parameter (of `args`; None: the request's)."""
    raw = (request.args if args is None else args).get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"query parameter {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise BadRequest(f"query parameter {name} must be >= {minimum}, got {value}")
    return value


def _limit(args=None) -> int | None:
    limit = _arg_int("limit", 1, args)
    return min(limit, 10_000) if limit is not None else None


def _page(key: str, page: Page, items: list[Any]) -> Response:
    body: dict[str, Any] = {key: items}
    if page.next_token:
        body["page_token"] = page.next_token
    return json_response(body)


# -- response shapes (spec names) ------------------------------------------------------------------------------


def declare_response(t: LanceTable) -> dict[str, Any]:
    return {"location": t.location, "storage_options": {}, "properties": dict(t.properties),
            "managed_versioning": True}


def removed_response(t: LanceTable) -> dict[str, Any]:
    return {"id": t.ident, "location": t.location, "properties": dict(t.properties)}


def version_response(v: TableVersion) -> dict[str, Any]:
    return {"version": v.to_spec()}


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


@bp.post("/v1/table/<id>/version/create")
@guard(_on_table(WRITE))
async def create_table_version(id: str) -> Response:
    ident = _table(id)
    return await _create_version(_catalog(), ident, await _body(CreateTableVersionRequest, ident))


async def _create_version(catalog, ident: tuple[str, ...], body: CreateTableVersionRequest) -> Response:
    return json_response(version_response(await catalog.create_table_version(ident, body)))


@bp.post("/v1/table/<id>/version/describe")
@guard(_on_table(READ))
async def describe_table_version(id: str) -> Response:
    ident = _table(id)
    return await _describe_version(_catalog(), ident, await _body(DescribeTableVersionRequest, ident))


async def _describe_version(catalog, ident: tuple[str, ...], body: DescribeTableVersionRequest) -> Response:
    return json_response(version_response(await catalog.describe_table_version(ident, body.version, body.branch)))


@bp.route("/v1/table/<id>/version/list", methods=["GET", "POST"])
@guard(_on_table(READ))
async def list_table_versions(id: str) -> Response:
    return await _list_versions(_catalog(), _table(id), request.args)


async def _list_versions(catalog, ident: tuple[str, ...], args) -> Response:
    page = await catalog.list_table_versions(ident, _limit(args), args.get("page_token"),
                                             _arg_bool("descending", False, args), args.get("branch"))
    return _page("versions", page, [v.to_spec() for v in page.items])


# What a Lance writer asks for each commit (pylance: the latest version, perhaps its manifest, then the new one)
# is served without Quart's request machinery (api/direct.py), by the routes' own code.


def _direct_on_table(privilege: Privilege):
    async def needs(coordinator, req, body) -> Needs:
        return _on_table(privilege)(req.view_args["id"], _delimiter(req.args))
    return needs


def _direct_table(req, body: BaseModel | None) -> tuple[str, ...]:
    """The route's table, as `_table` and `_body` read it (a body naming another id is refused)."""
    ident = _table(req.view_args["id"], _delimiter(req.args))
    if body is not None:
        _same_id(body, ident)
    return ident


async def _direct_create_version(coordinator, req, body: CreateTableVersionRequest) -> Response:
    return await _create_version(coordinator.lance, _direct_table(req, body), body)


async def _direct_describe_version(coordinator, req, body: DescribeTableVersionRequest) -> Response:
    return await _describe_version(coordinator.lance, _direct_table(req, body), body)


async def _direct_list_versions(coordinator, req, body: None) -> Response:
    return await _list_versions(coordinator.lance, _direct_table(req, None), req.args)


async def _direct_no_slash_in_the_id(coordinator, req) -> None:
    no_slash_in_the_id(req.raw_path)


def _direct_body(model: type[BaseModel]):
    return lambda req: _model_of(model, req.body)


DIRECT = {f"{bp.name}.{endpoint}": DirectRoute(read, _direct_on_table(privilege), view, _direct_no_slash_in_the_id)
          for endpoint, read, privilege, view in (
              ("create_table_version", _direct_body(CreateTableVersionRequest), WRITE, _direct_create_version),
              ("describe_table_version", _direct_body(DescribeTableVersionRequest), READ, _direct_describe_version),
              ("list_table_versions", None, READ, _direct_list_versions))}


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
