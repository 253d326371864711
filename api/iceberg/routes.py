"""Iceberg REST Catalog routes (`/v1/...`, with or without `{prefix}`): parse, call the catalog, map the result.

Spec: open-api/rest-catalog-open-api.yaml. The request and response bodies are `coordinator.iceberg.models`';
errors are answered by `errors.py`.
"""

from __future__ import annotations

from quart import Blueprint, Response, request

from coordinator.errors import BadRequest
from coordinator.iceberg import parse_requirements, parse_updates
from coordinator.iceberg.format import ICEBERG
from coordinator.iceberg.models import (COMMIT_TABLE_ROUTE, CommitTableRequest, CommitTransactionRequest,
                                        CommitViewRequest, CreateNamespaceRequest, CreateTableRequest,
                                        CreateViewRequest, RegisterTableRequest, RenameTableRequest,
                                        ReportMetricsRequest, UpdateNamespacePropertiesRequest, commit_result,
                                        staged_result)
from coordinator.iceberg.rules import parse_view_requirements, parse_view_updates
from coordinator.iceberg.state import TableIdent
from coordinator.idempotency import LIFETIME_S
from coordinator.warehouses import DEFAULT as DEFAULT_WAREHOUSE

from ..access import CREATE, DROP, READ, WRITE, Needs, authenticated, guard, listing, visible
from ..common import (CommitPart, empty_response, fields_of, json_fields, json_model, json_response, parse_model,
                      query_flag, read_json, read_model)
from ..direct import before_request, direct
from ..context import current_coordinator
from . import uniform
from .endpoints import ENDPOINTS, config_defaults
from .errors import ERRORS
from .idempotency import idempotent, request_key as _key
from .requests import (_body_ident, _catalog, _catalog_of, _change_needs, _check_body_identifier,
                       _create_namespace_needs, _created_now, _etags, _ident, _list_namespaces_needs, _load_response,
                       _named, _namespace, _namespace_named, _object_securable, _on_namespace, _on_object, _page,
                       _prefix, _rename_needs, _renamed, _securable, _table_now, _transaction_named,
                       _transaction_needs, _view_now)

bp = Blueprint(ICEBERG.name, __name__)


def routes(rule: str, methods: list[str], reads: bool = False):
    """Register a handler under both `/v1/{prefix}/...` and `/v1/...` (prefix ""); a read (`reads`) also under the
    Unity Catalog mount, whose prefix is `catalogs/{UC catalog}` (`uniform.py`)."""
    def wrap(fn):
        bp.add_url_rule("/v1/<prefix>" + rule, view_func=fn, methods=methods, endpoint=fn.__name__ + "_p")
        bp.add_url_rule("/v1" + rule, view_func=fn, methods=methods, endpoint=fn.__name__,
                        defaults={"prefix": ""})
        if reads:
            uniform.bp.add_url_rule("/v1/catalogs/<prefix>" + rule, view_func=fn, methods=methods)
        return fn
    return wrap


# -- config --------------------------------------------------------------------------------------------------


@before_request(bp)
async def know_warehouse(coordinator, req) -> None:
    """A prefix may name a warehouse another cluster member created: look it up before placing anything."""
    prefix = req.view_args.get("prefix")
    if prefix:
        await coordinator.warehouses.resolve(prefix)


@bp.get("/v1/config")
@guard(authenticated)
async def get_config() -> Response:
    coordinator = current_coordinator()
    defaults = config_defaults(coordinator)
    # The separator is a /config override (spec, `parent`), where Java and pyiceberg read it: not a top-level key.
    overrides = {"namespace-separator": "%1F"}
    named = request.args.get("warehouse")
    if named:   # a name or a location; never the default in place of one that does not exist
        warehouse = await coordinator.warehouses.find(named)
        if warehouse.name != DEFAULT_WAREHOUSE:
            overrides["prefix"] = warehouse.name
    return json_response({"defaults": defaults, "overrides": overrides, "endpoints": ENDPOINTS,
                          "idempotency-key-lifetime": f"PT{LIFETIME_S // 60}M"})


# -- namespaces ----------------------------------------------------------------------------------------------


@routes("/namespaces", ["GET"], reads=True)
@guard(listing(_list_namespaces_needs))
async def list_namespaces(prefix: str) -> Response:
    parent = request.args.get("parent")
    names, nxt = await _catalog().list_namespaces(_prefix(prefix), _namespace(parent) if parent else (), *_page())
    shown = [list(n) for n in names if visible(_securable(prefix, n))]
    # null, not omitted, on the last page: the spec's answer for a server that pages
    return json_response({"namespaces": shown, "next-page-token": nxt})


@routes("/namespaces", ["POST"])
@guard(_create_namespace_needs)
@idempotent("create-namespace", named=_namespace_named)
async def create_namespace(prefix: str) -> Response:
    body = await read_model(CreateNamespaceRequest)
    return json_response(await _catalog().create_namespace(_prefix(prefix), tuple(body.namespace),
                                                           body.properties, _key()))


@routes("/namespaces/<namespace>", ["GET", "HEAD"], reads=True)
@guard(_on_namespace(READ))
async def load_namespace(prefix: str, namespace: str) -> Response:
    ns = _namespace(namespace)
    props = await _catalog().load_namespace(_prefix(prefix), ns)
    if request.method == "HEAD":
        return empty_response(204)
    return json_response({"namespace": list(ns), "properties": props})


@routes("/namespaces/<namespace>", ["DELETE"])
@guard(_on_namespace(DROP))
@idempotent("drop-namespace")
async def drop_namespace(prefix: str, namespace: str) -> Response:
    await _catalog().drop_namespace(_prefix(prefix), _namespace(namespace), _key())
    return empty_response(204)


@routes("/namespaces/<namespace>/properties", ["POST"])
@guard(_on_namespace(WRITE))
@idempotent("update-namespace-properties")
async def update_namespace_properties(prefix: str, namespace: str) -> Response:
    body = await read_model(UpdateNamespacePropertiesRequest)
    return json_response(await _catalog().update_namespace_properties(
        _prefix(prefix), _namespace(namespace), body.removals, body.updates, _key()))


# -- tables --------------------------------------------------------------------------------------------------


@routes("/namespaces/<namespace>/tables", ["GET"], reads=True)
@guard(listing(_on_namespace(READ)))
async def list_tables(prefix: str, namespace: str) -> Response:
    return await _list_identifiers(prefix, namespace, "table")


async def _list_identifiers(prefix: str, namespace: str, kind: str) -> Response:
    """ListTablesResponse for tables or views: one page of identifiers and the next page's token."""
    idents, nxt = await _catalog().list_tables(_prefix(prefix), _namespace(namespace), *_page(), kind=kind)
    shown = [i for i in idents if visible(_object_securable(prefix, i.namespace, i.name))]
    return json_response({"identifiers": [{"namespace": list(i.namespace), "name": i.name} for i in shown],
                          "next-page-token": nxt})


@routes("/namespaces/<namespace>/tables", ["POST"])
@guard(_on_namespace(CREATE))
@idempotent("create-table", _created_now(CreateTableRequest, _table_now), _named(CreateTableRequest))
async def create_table(prefix: str, namespace: str) -> Response:
    body = await read_model(CreateTableRequest)
    ident = _ident(prefix, namespace, body.name)
    table = await _catalog().create_table(
        ident, schema=body.schema_, location=body.location, partition_spec=body.partition_spec,
        write_order=body.write_order, properties=body.properties, stage_create=body.stage_create,
        idempotency_key=_key())
    if body.stage_create:
        return json_response(staged_result(table.metadata_json))
    return _load_response(table)


@routes("/namespaces/<namespace>/register", ["POST"])
@guard(_on_namespace(CREATE))
@idempotent("register-table", _created_now(RegisterTableRequest, _table_now), _named(RegisterTableRequest))
async def register_table(prefix: str, namespace: str) -> Response:
    body = await read_model(RegisterTableRequest)
    if body.overwrite:
        raise BadRequest("register with overwrite=true is not supported; drop the table first")
    table = await _catalog().register_table(_ident(prefix, namespace, body.name), body.metadata_location, _key())
    return _load_response(table)


# A table's load, which a writer repeats after a conflict and a streaming engine before each batch, and its commit
# (without an Idempotency-Key: one with a key is served through Quart, by `idempotent`) are served without Quart's
# request machinery (api/direct.py); the load through the Unity Catalog mount is Quart's.


async def _load_needs(coordinator, req, part) -> Needs:
    return _on_object(READ)(**req.view_args)


@routes("/namespaces/<namespace>/tables/<table>", ["GET", "HEAD"], reads=True)
@direct(needs=_load_needs, takes=lambda req: not req.path.startswith(uniform.MOUNT))
async def load_table(coordinator, req, body: None) -> Response:
    args = req.view_args
    ident = _ident(args["prefix"], args["namespace"], args["table"])
    snapshots = req.args.get("snapshots", "all")
    if snapshots not in ("all", "refs"):
        raise BadRequest(f"snapshots must be 'all' or 'refs', got {snapshots!r}")
    loaded = await _catalog_of(coordinator).load_table(ident)
    if req.method == "HEAD":
        return empty_response(204)
    etag = loaded.etag
    if snapshots == "refs":
        etag = etag[:-1] + '-refs"'
    tags = _etags(req.headers.get("If-None-Match"))
    if etag in tags or "*" in tags:   # RFC 9110: `*` matches any current representation
        return empty_response(304, {"ETag": etag})
    if snapshots == "refs":
        loaded = loaded.refs_only()
    return _load_response(loaded, etag=etag)


async def _commit_needs(coordinator, req, part) -> Needs:
    args = req.view_args
    return _change_needs(args["prefix"], _namespace(args["namespace"]), args["table"], part)


@routes("/namespaces/<namespace>/tables/<table>", ["POST"])
@idempotent(COMMIT_TABLE_ROUTE, _table_now)
@direct(needs=_commit_needs, read=json_model(CommitTableRequest), part=json_fields(CommitTableRequest, "requirements"),
        takes=lambda req: "idempotency-key" not in req.headers)
async def commit_table(coordinator, req, body: CommitTableRequest) -> Response:
    args = req.view_args
    ident = _ident(args["prefix"], args["namespace"], args["table"])
    _check_body_identifier(body.identifier, ident, "table")
    committed = await coordinator.service(ICEBERG).commit_table(
        ident, parse_requirements(body.requirements), parse_updates(body.updates), req.idempotency_key)
    return json_response(commit_result(committed.metadata_location, committed.metadata_json),
                         headers={"ETag": committed.etag})


@routes("/transactions/commit", ["POST"])
@guard(_transaction_needs)
@idempotent("commit-transaction", named=_transaction_named)
async def commit_transaction(prefix: str) -> Response:
    body = await read_model(CommitTransactionRequest)
    changes = []
    for i, change in enumerate(body.table_changes):
        if change.identifier is None:
            raise BadRequest(f"table-changes[{i}].identifier is required")
        changes.append((_body_ident(prefix, change.identifier), parse_requirements(change.requirements),
                        parse_updates(change.updates)))
    if not changes:
        raise BadRequest("table-changes must name at least one table")
    await _catalog().commit_transaction(changes, _key())
    return empty_response(204)


@routes("/namespaces/<namespace>/tables/<table>", ["DELETE"])
@guard(_on_object(DROP))
@idempotent("drop-table")
async def drop_table(prefix: str, namespace: str, table: str) -> Response:
    await _catalog().drop_table(_ident(prefix, namespace, table), query_flag("purgeRequested"), _key())
    return empty_response(204)


@routes("/namespaces/<namespace>/tables/<table>/metrics", ["POST"], reads=True)
@guard(_on_object(READ))
async def report_metrics(prefix: str, namespace: str, table: str) -> Response:
    raw = await read_json()
    parse_model(ReportMetricsRequest, raw)
    await _catalog().report_metrics(_ident(prefix, namespace, table), raw)
    return empty_response(204)


@routes("/namespaces/<namespace>/tables/<table>/credentials", ["GET"], reads=True)
@guard(_on_object(READ))
async def load_credentials(prefix: str, namespace: str, table: str) -> Response:
    return json_response({"storage-credentials": await _catalog().credentials(_ident(prefix, namespace, table))})


# -- views ---------------------------------------------------------------------------------------------------


@routes("/namespaces/<namespace>/views", ["GET"])
@guard(listing(_on_namespace(READ)))
async def list_views(prefix: str, namespace: str) -> Response:
    return await _list_identifiers(prefix, namespace, "view")


@routes("/namespaces/<namespace>/views", ["POST"])
@guard(_on_namespace(CREATE))
@idempotent("create-view", _created_now(CreateViewRequest, _view_now), _named(CreateViewRequest))
async def create_view(prefix: str, namespace: str) -> Response:
    body = await read_model(CreateViewRequest)
    view = await _catalog().create_view(_ident(prefix, namespace, body.name), schema=body.schema_,
                                        view_version=body.view_version, location=body.location,
                                        properties=body.properties, idempotency_key=_key())
    return _load_response(view)


@routes("/namespaces/<namespace>/views/<view>", ["GET", "HEAD"])
@guard(_on_object(READ))
async def load_view(prefix: str, namespace: str, view: str) -> Response:
    loaded = await _catalog().load_view(_ident(prefix, namespace, view))
    if request.method == "HEAD":
        return empty_response(204)
    return _load_response(loaded)


@routes("/namespaces/<namespace>/views/<view>", ["POST"])
@guard(_on_object(WRITE))
@idempotent("replace-view", _view_now)
async def replace_view(prefix: str, namespace: str, view: str) -> Response:
    body = await read_model(CommitViewRequest)
    ident = _ident(prefix, namespace, view)
    _check_body_identifier(body.identifier, ident, "view")
    replaced = await _catalog().replace_view(ident, parse_view_requirements(body.requirements),
                                             parse_view_updates(body.updates), _key())
    return _load_response(replaced)


@routes("/namespaces/<namespace>/views/<view>", ["DELETE"])
@guard(_on_object(DROP))
@idempotent("drop-view")
async def drop_view(prefix: str, namespace: str, view: str) -> Response:
    await _catalog().drop_view(_ident(prefix, namespace, view), _key())
    return empty_response(204)


async def _rename_idents(prefix: str) -> tuple[TableIdent, TableIdent]:
    body = await read_model(RenameTableRequest)
    return _body_ident(prefix, body.source), _body_ident(prefix, body.destination)


@routes("/views/rename", ["POST"])
@guard(_rename_needs)
@idempotent("rename-view", named=_renamed)
async def rename_view(prefix: str) -> Response:
    source, dest = await _rename_idents(prefix)
    await _catalog().rename_view(source, dest, _key())
    return empty_response(204)


@routes("/tables/rename", ["POST"])
@guard(_rename_needs)
@idempotent("rename-table", named=_renamed)
async def rename_table(prefix: str) -> Response:
    source, dest = await _rename_idents(prefix)
    await _catalog().rename_table(source, dest, _key())
    return empty_response(204)


def cross_format_part(body: dict) -> CommitPart:
    """An Iceberg `CommitTableRequest` (its table named by `identifier`, in catalog `prefix`) as a part of a
    cross-format commit (api/commits.py)."""
    named = parse_model(fields_of(CommitTableRequest, "identifier", "requirements"), body)
    if named.identifier is None:
        raise BadRequest("identifier is required")
    prefix = body.get("prefix") or ""
    if not isinstance(prefix, str):
        raise BadRequest("prefix must be a string")
    ident = _body_ident(prefix, named.identifier)

    async def needs() -> Needs:
        return _change_needs(prefix, ident.namespace, ident.name, named)

    def read():
        change = parse_model(CommitTableRequest, body)

        async def plan():
            return await _catalog().plan_commit(ident, parse_requirements(change.requirements),
                                                parse_updates(change.updates))
        return plan
    return CommitPart(f"iceberg {ident}", needs, read, lambda exc: (exc.status, ERRORS(exc)[1]))
