"""Iceberg REST Catalog routes (`/v1/...`, with or without `{prefix}`): parse, call the catalog, map the result.

Spec: open-api/rest-catalog-open-api.yaml. The request and response bodies are `coordinator.iceberg.models`';
errors are answered by `errors.py`.
"""

from __future__ import annotations

from typing import Awaitable, Callable

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, Response, has_request_context, request

from coordinator.auth import Privilege, Resource, table_securable
from coordinator.errors import BadRequest
from coordinator.iceberg import parse_requirements, parse_updates
from coordinator.delta.format import DELTA   # (the Unity Catalog mount reads Delta tables)
from coordinator.iceberg.format import ICEBERG
from coordinator.iceberg.models import (COMMIT_TABLE_ROUTE, CommitTableRequest, CommitTransactionRequest,
                                        CommitViewRequest, CreateNamespaceRequest, CreateTableRequest,
                                        CreateViewRequest, RegisterTableRequest, RenameTableRequest,
                                        ReportMetricsRequest, TableIdentifier, UpdateNamespacePropertiesRequest,
                                        commit_result, load_result, staged_result)
from coordinator.iceberg.rules import parse_view_requirements, parse_view_updates
from coordinator.iceberg.state import IcebergTable, TableIdent
from coordinator.idempotency import LIFETIME_S, IdempotencyKey
from coordinator.warehouses import DEFAULT as DEFAULT_WAREHOUSE

from ..access import CREATE, DROP, READ, WRITE, Needs, authenticated, guard, listing, visible
from ..common import (CommitPart, empty_response, fields_of, json_fields, json_model, json_response, parse_model,
                      query_flag, read_fields, read_json, read_model)
from ..direct import DirectRoute
from ..context import current_coordinator, service
from . import uniform
from .endpoints import ENDPOINTS, config_defaults
from .errors import ERRORS
from .idempotency import idempotent, request_key as _key

bp = Blueprint(ICEBERG.name, __name__)

NAMESPACE_SEPARATOR = "\x1f"
# Prefixes that would make Iceberg's `/v1/{prefix}/...` collide with Lance's `/v1/namespace/...`, `/v1/table/...`.
RESERVED_PREFIXES = {"namespace", "table", "transaction", "config", "oauth"}


# -- helpers -------------------------------------------------------------------------------------------------


def _uniform() -> bool:
    """The request reads Unity Catalog's Delta tables as Iceberg (`uniform.py`'s mount), not this catalog. A direct
    route (api/direct.py) has no Quart request: it serves only this catalog's own routes."""
    return has_request_context() and request.blueprint == uniform.bp.name


def _catalog():
    return current_coordinator().uniform if _uniform() else service(ICEBERG)


def _prefix(prefix: str) -> str:
    if prefix in RESERVED_PREFIXES and not _uniform():   # (the mount's prefixes are `catalogs/<UC catalog>`)
        raise BadRequest(f"prefix {prefix!r} is reserved")
    return prefix


def _namespace(raw: str) -> tuple[str, ...]:
    levels = tuple(raw.split(NAMESPACE_SEPARATOR))
    if not raw or any(not level for level in levels):
        raise BadRequest(f"invalid namespace: {raw!r}")
    return levels


def _ident(prefix: str, namespace: str, table: str) -> TableIdent:
    return TableIdent(_prefix(prefix), _namespace(namespace), table)


def _body_ident(prefix: str, identifier: TableIdentifier) -> TableIdent:
    """A `TableIdentifier` of a request body (rename, transaction)."""
    return TableIdent(_prefix(prefix), tuple(identifier.namespace), identifier.name)


def _check_body_identifier(identifier: TableIdentifier | None, ident: TableIdent, kind: str) -> None:
    """A commit body may name its table or view too; then it must be the one in the path."""
    if identifier is not None and (tuple(identifier.namespace), identifier.name) != (ident.namespace, ident.name):
        raise BadRequest(f"identifier in the body does not match the {kind} in the path")


# -- access: what each route needs (api/access.py enforces it) -------------------------------------------------


def _securable(prefix: str, namespace: tuple[str, ...] = ()) -> Resource:
    """A catalog's (no namespace) or a namespace's securable. Read through the Unity Catalog mount, the tables are
    Delta tables: the same grants as the Delta table's reach them."""
    return (DELTA if _uniform() else ICEBERG).container(_prefix(prefix), namespace)


def _object_securable(prefix: str, namespace: tuple[str, ...], name: str) -> Resource:
    """A table's or view's securable (views and tables share their namespace's names)."""
    return table_securable(_securable(prefix, namespace), name)


def _on_namespace(privilege: Privilege):
    return lambda prefix, namespace: [(privilege, _securable(prefix, _namespace(namespace)))]


def _on_object(privilege: Privilege):
    """The table or view in the route."""
    return lambda prefix, namespace, table=None, view=None: [
        (privilege, _object_securable(prefix, _namespace(namespace), table or view))]


def _list_namespaces_needs(prefix: str) -> Needs:
    parent = request.args.get("parent")
    return [(READ, _securable(prefix, _namespace(parent) if parent else ()))]


async def _create_namespace_needs(prefix: str) -> Needs:
    body = await read_fields(CreateNamespaceRequest, "namespace")
    return [(CREATE, _securable(prefix, tuple(body.namespace[:-1])))]


async def _rename_needs(prefix: str) -> Needs:
    body = await read_model(RenameTableRequest)
    return [(DROP, _object_securable(prefix, tuple(body.source.namespace), body.source.name)),
            (CREATE, _securable(prefix, tuple(body.destination.namespace)))]


def _change_needs(prefix: str, namespace: tuple[str, ...], name: str, change: "CommitTableRequest") -> Needs:
    """A change with `assert-create` makes its table (the create transaction after a stage-create): it needs
    `create` on the namespace, as a plain create does, not `write` on a table that does not exist yet."""
    if any(isinstance(r, dict) and r.get("type") == "assert-create" for r in change.requirements):
        return [(CREATE, _securable(prefix, namespace))]
    return [(WRITE, _object_securable(prefix, namespace, name))]


async def _commit_needs(prefix: str, namespace: str, table: str) -> Needs:
    return _change_needs(prefix, _namespace(namespace), table, await read_fields(CommitTableRequest, "requirements"))


class _TransactionTables(BaseModel):
    """What a multi-table commit's policy reads: each change's table and requirements, not its updates."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    table_changes: list[fields_of(CommitTableRequest, "identifier", "requirements")] = Field(alias="table-changes")


async def _transaction_needs(prefix: str) -> Needs:
    body = await read_model(_TransactionTables)
    return [need for c in body.table_changes if c.identifier is not None
            for need in _change_needs(prefix, tuple(c.identifier.namespace), c.identifier.name, c)]


def _page() -> tuple[str | None, int | None]:
    """`pageToken` and `pageSize`. Without a `pageToken` (an empty one starts paging) the spec asks for every
    result in one response, whatever `pageSize` says."""
    size = _page_size()
    if "pageToken" not in request.args:
        return None, None
    return request.args["pageToken"], size


def _page_size() -> int | None:
    raw = request.args.get("pageSize")
    if raw is None:
        return None
    try:
        size = int(raw)
    except ValueError:
        raise BadRequest(f"pageSize must be an integer, got {raw!r}") from None
    if size < 1:
        raise BadRequest("pageSize must be >= 1")
    return min(size, 1000)



async def _table_now(prefix: str, namespace: str, table: str) -> IcebergTable:
    return await _catalog().load_table(_ident(prefix, namespace, table))


async def _view_now(prefix: str, namespace: str, view: str) -> IcebergTable:
    return await _catalog().load_view(_ident(prefix, namespace, view))


def _created_now(model: type, now: Callable[..., Awaitable[IcebergTable]]) -> Callable[..., Awaitable[IcebergTable]]:
    """`now` (`_table_now` or `_view_now`) of the object a create request (of `model`) names in its body."""
    async def created(prefix: str, namespace: str) -> IcebergTable:
        return await now(prefix, namespace, (await read_model(model)).name)
    return created


def _named(model: type) -> Callable[[], Awaitable[str]]:
    """The name of the object a create request (of `model`) names in its body."""
    async def name() -> str:
        return (await read_model(model)).name
    return name


async def _namespace_named() -> str:
    return NAMESPACE_SEPARATOR.join((await read_model(CreateNamespaceRequest)).namespace)


def _identifier_text(identifier: TableIdentifier) -> str:
    return NAMESPACE_SEPARATOR.join([*identifier.namespace, identifier.name])


async def _renamed() -> str:
    """A rename's objects, which its body names: source and destination."""
    body = await read_model(RenameTableRequest)
    return f"{_identifier_text(body.source)} {_identifier_text(body.destination)}"


async def _transaction_named() -> str:
    """The tables a multi-table commit names in its body."""
    body = await read_model(CommitTransactionRequest)
    return " ".join(sorted(_identifier_text(c.identifier) for c in body.table_changes if c.identifier is not None))


def _load_response(table: IcebergTable, status: int = 200, etag: str | None = None) -> Response:
    return json_response(load_result(table.metadata_location, table.metadata_json), status,
                         {"ETag": etag or table.etag})


def _etags(header: str | None) -> set[str]:
    if not header:
        return set()
    return {t.strip().removeprefix("W/") for t in header.split(",")}


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


@bp.before_request
async def _know_warehouse() -> None:
    await know_warehouse(current_coordinator(), request.view_args)


async def know_warehouse(coordinator, view_args: dict | None) -> None:
    """A prefix may name a warehouse another cluster member created: look it up before placing anything."""
    prefix = (view_args or {}).get("prefix")
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


@routes("/namespaces/<namespace>/tables/<table>", ["GET", "HEAD"], reads=True)
@guard(_on_object(READ))
async def load_table(prefix: str, namespace: str, table: str) -> Response:
    return await _load(_catalog(), prefix, namespace, table, request.method, request.args, request.headers)


async def _load(catalog, prefix: str, namespace: str, table: str, method: str, args, headers) -> Response:
    ident = _ident(prefix, namespace, table)
    snapshots = args.get("snapshots", "all")
    if snapshots not in ("all", "refs"):
        raise BadRequest(f"snapshots must be 'all' or 'refs', got {snapshots!r}")
    loaded = await catalog.load_table(ident)
    if method == "HEAD":
        return empty_response(204)
    etag = loaded.etag
    if snapshots == "refs":
        etag = etag[:-1] + '-refs"'
    tags = _etags(headers.get("If-None-Match"))
    if etag in tags or "*" in tags:   # RFC 9110: `*` matches any current representation
        return empty_response(304, {"ETag": etag})
    if snapshots == "refs":
        loaded = loaded.refs_only()
    return _load_response(loaded, etag=etag)


@routes("/namespaces/<namespace>/tables/<table>", ["POST"])
@guard(_commit_needs)
@idempotent(COMMIT_TABLE_ROUTE, _table_now)
async def commit_table(prefix: str, namespace: str, table: str) -> Response:
    return await _commit(_catalog(), prefix, namespace, table, await read_model(CommitTableRequest), _key())


async def _commit(catalog, prefix: str, namespace: str, table: str, body: CommitTableRequest,
                  key: IdempotencyKey | None) -> Response:
    ident = _ident(prefix, namespace, table)
    _check_body_identifier(body.identifier, ident, "table")
    committed = await catalog.commit_table(ident, parse_requirements(body.requirements), parse_updates(body.updates),
                                           key)
    return json_response(commit_result(committed.metadata_location, committed.metadata_json),
                         headers={"ETag": committed.etag})


# A table's commit (without an Idempotency-Key: with one, `idempotent` above serves it), and its load, which a
# writer repeats after a conflict and a streaming engine before each batch, are served without Quart's request
# machinery (api/direct.py), by the routes' own code.


async def _direct_commit_needs(coordinator, req, part) -> Needs:
    args = req.view_args
    return _change_needs(args["prefix"], _namespace(args["namespace"]), args["table"], part)


async def _direct_commit(coordinator, req, body: CommitTableRequest) -> Response:
    args = req.view_args
    return await _commit(coordinator.iceberg, args["prefix"], args["namespace"], args["table"], body, None)


async def _direct_load_needs(coordinator, req, body: None) -> Needs:
    return _on_object(READ)(**req.view_args)


async def _direct_load(coordinator, req, body: None) -> Response:
    return await _load(coordinator.iceberg, **req.view_args, method=req.method, args=req.args, headers=req.headers)


async def _direct_know_warehouse(coordinator, req) -> None:
    await know_warehouse(coordinator, req.view_args)


_DIRECT_COMMIT = DirectRoute(json_model(CommitTableRequest), _direct_commit_needs, _direct_commit,
                             _direct_know_warehouse, takes=lambda req: "idempotency-key" not in req.headers,
                             part=json_fields(CommitTableRequest, "requirements"))
_DIRECT_LOAD = DirectRoute(None, _direct_load_needs, _direct_load, _direct_know_warehouse)
DIRECT = {f"{bp.name}.commit_table": _DIRECT_COMMIT, f"{bp.name}.commit_table_p": _DIRECT_COMMIT,
          f"{bp.name}.load_table": _DIRECT_LOAD, f"{bp.name}.load_table_p": _DIRECT_LOAD}


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
