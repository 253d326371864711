"""Unity Catalog routes for Delta tables (`/api/2.1/unity-catalog/...`): parse, call the service, map the result.

Specs: the seed (UC Managed Tables 0.1.0: `/staging-tables`, `/tables`, `/delta/commits`, `/delta/commit`,
`/delta/metrics`) and UC OSS `api/all.yaml` (catalogs, schemas, `/delta/preview/commits`, which today's clients
call). Errors are answered by `errors.py`.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable

from quart import Blueprint, Response, current_app, request
from werkzeug.exceptions import HTTPException

from coordinator.auth import Privilege
from coordinator.delta import (CommitRequest, CreateCatalog, CreateSchema, CreateStagingTable, CreateTable,
                               GetCommitsRequest, MetricsRequest)
from coordinator.delta.models import (GenerateTemporaryPathCredential, GenerateTemporaryTableCredential,
                                      UpdateCatalogOrSchema)
from coordinator.delta.format import DELTA
from coordinator.delta.rules import split_full_name
from coordinator.errors import BadRequest

from ..access import CREATE, DROP, READ, WRITE, Needs, authenticated, guard, listing, readable, visible
from ..common import (CommitPart, INT64_MAX, body_json, fields_of, json_fields, json_model, json_response, parse_model,
                      parsed_once, query_flag, read_fields, read_model)
from ..context import service
from ..direct import DirectRoute
from .errors import ERRORS, uc_error

log = logging.getLogger(__name__)

bp = Blueprint(DELTA.name, __name__, url_prefix="/api/2.1/unity-catalog")

DEFAULT_PAGE = 100
MAX_PAGE = 1000
MAX_TABLES_PAGE = 50  # UC OSS: `max_results` of listTables is at most 50
# What a listing shows of a table the caller may not read (it holds another privilege on it): the way to name it,
# not its columns, location, properties or comment.
LISTED_ONLY = ("name", "catalog_name", "schema_name", "table_type", "table_id")


# -- helpers -------------------------------------------------------------------------------------------------


def _service():
    return service(DELTA)


def _page(cap: int) -> tuple[str | None, int]:
    """UC `max_results`: > 0 caps the page, 0 (or absent) means the server's size, < 0 is an error."""
    raw = request.args.get("max_results")
    size = DEFAULT_PAGE
    if raw is not None:
        try:
            size = int(raw)
        except ValueError:
            raise BadRequest(f"max_results must be an integer, got {raw!r}") from None
        if size < 0:
            raise BadRequest(f"max_results must be >= 0, got {size}")
        size = size or DEFAULT_PAGE
    return request.args.get("page_token") or None, min(size, cap)


def _required_arg(name: str) -> str:
    value = request.args.get(name)
    if not value:
        raise BadRequest(f"query parameter {name} is required")
    return value


# -- access: what each route needs (api/access.py enforces it) -------------------------------------------------


def _on(privilege: Privilege, *path: str) -> Needs:
    return [(privilege, (DELTA.name, *path))]


def _on_full_name(privilege: Privilege, levels: int, kind: str):
    """The schema (2 levels) or table (3) named by the route's full name."""
    def needs(full_name: str) -> Needs:
        names = split_full_name(full_name, levels, kind)
        if kind == "table":
            return [(privilege, DELTA.table(names[0], names[1:-1], names[-1]))]
        return _on(privilege, *names)
    return needs


def _on_listed(privilege: Privilege, *args: str):
    """The container named by query parameters (catalog_name, schema_name)."""
    return lambda: _on(privilege, *(_required_arg(a) for a in args))


def _on_new_table(privilege: Privilege, model):
    async def needs() -> Needs:
        body = await read_fields(model, "catalog_name", "schema_name")
        return _on(privilege, body.catalog_name, body.schema_name)
    return needs


async def _on_table_id(privilege: Privilege, table_id: str, service=None) -> Needs:
    return [(privilege, await (service or _service()).securable(table_id))]


async def _create_schema_needs() -> Needs:
    return _on(CREATE, (await read_fields(CreateSchema, "catalog_name")).catalog_name)


async def _get_commits_needs() -> Needs:
    return await _on_table_id(READ, (await _get_commits_request()).table_id)


async def _commit_needs() -> Needs:
    return await _on_table_id(WRITE, (await read_fields(CommitRequest, "table_id")).table_id)


async def _metrics_needs() -> Needs:
    return await _on_table_id(WRITE, (await read_fields(MetricsRequest, "table_id")).table_id)


async def _table_credentials_needs() -> Needs:
    req = await read_model(GenerateTemporaryTableCredential)   # (all of it: its table and operation)
    return await _on_table_id(WRITE if req.operation == "READ_WRITE" else READ, req.table_id)


def _listing(key: str, items: list[dict], token: str | None) -> Response:
    body: dict[str, Any] = {key: items}
    if token:
        body["next_page_token"] = token
    return json_response(body)


# -- catalogs and schemas ------------------------------------------------------------------------------------


@bp.post("/catalogs")
@guard(lambda: _on(CREATE))
async def create_catalog() -> Response:
    return json_response(await _service().create_catalog(await read_model(CreateCatalog)))


@bp.get("/catalogs")
@guard(listing(lambda: _on(READ)))
async def list_catalogs() -> Response:
    token, size = _page(MAX_PAGE)
    items, nxt = await _service().list_catalogs(token, size)
    return _listing("catalogs", [c for c in items if visible(DELTA.container(c["name"]))], nxt)


@bp.get("/catalogs/<name>")
@guard(lambda name: _on(READ, name))
async def get_catalog(name: str) -> Response:
    return json_response(await _service().get_catalog(name))


@bp.patch("/catalogs/<name>")
@guard(lambda name: _on(WRITE, name))
async def update_catalog(name: str) -> Response:
    return json_response(await _service().update_catalog(name, await read_model(UpdateCatalogOrSchema)))


@bp.delete("/catalogs/<name>")
@guard(lambda name: _on(DROP, name))
async def delete_catalog(name: str) -> Response:
    await _service().delete_catalog(name, query_flag("force"))
    return json_response({})


@bp.post("/schemas")
@guard(_create_schema_needs)
async def create_schema() -> Response:
    return json_response(await _service().create_schema(await read_model(CreateSchema)))


@bp.get("/schemas")
@guard(listing(_on_listed(READ, "catalog_name")))
async def list_schemas() -> Response:
    catalog = _required_arg("catalog_name")
    token, size = _page(MAX_PAGE)
    items, nxt = await _service().list_schemas(catalog, token, size)
    return _listing("schemas", [s for s in items if visible(DELTA.container(catalog, (s["name"],)))], nxt)


@bp.get("/schemas/<full_name>")
@guard(_on_full_name(READ, 2, "schema"))
async def get_schema(full_name: str) -> Response:
    return json_response(await _service().get_schema(*split_full_name(full_name, 2, "schema")))


@bp.patch("/schemas/<full_name>")
@guard(_on_full_name(WRITE, 2, "schema"))
async def update_schema(full_name: str) -> Response:
    catalog, schema = split_full_name(full_name, 2, "schema")
    return json_response(await _service().update_schema(catalog, schema, await read_model(UpdateCatalogOrSchema)))


@bp.delete("/schemas/<full_name>")
@guard(_on_full_name(DROP, 2, "schema"))
async def delete_schema(full_name: str) -> Response:
    catalog, schema = split_full_name(full_name, 2, "schema")
    await _service().delete_schema(catalog, schema, query_flag("force"))
    return json_response({})


# -- tables --------------------------------------------------------------------------------------------------


@bp.post("/staging-tables")
@guard(_on_new_table(CREATE, CreateStagingTable))
async def create_staging_table() -> Response:
    return json_response(await _service().create_staging_table(await read_model(CreateStagingTable)))


@bp.post("/tables")
@guard(_on_new_table(CREATE, CreateTable))
async def create_table() -> Response:
    return json_response(await _service().create_table(await read_model(CreateTable)))


@bp.get("/tables")
@guard(listing(_on_listed(READ, "catalog_name", "schema_name")))
async def list_tables() -> Response:
    catalog, schema = _required_arg("catalog_name"), _required_arg("schema_name")
    token, size = _page(MAX_TABLES_PAGE)
    items, nxt = await _service().list_tables(catalog, schema, token, size)
    shown = []
    for info in items:
        securable = DELTA.table(catalog, (schema,), info["name"])
        if visible(securable):
            shown.append(info if readable(securable) else {k: info[k] for k in LISTED_ONLY if k in info})
    return _listing("tables", shown, nxt)


@bp.get("/tables/<full_name>")
@guard(_on_full_name(READ, 3, "table"))
async def get_table(full_name: str) -> Response:
    return json_response(await _service().get_table(split_full_name(full_name, 3, "table")))


@bp.delete("/tables/<full_name>")
@guard(_on_full_name(DROP, 3, "table"))
async def delete_table(full_name: str) -> Response:
    await _service().delete_table(split_full_name(full_name, 3, "table"))
    return json_response({})


# -- commits -------------------------------------------------------------------------------------------------


_GET_COMMITS_INTS = ("start_version", "end_version")


def _get_commits_request() -> Awaitable[GetCommitsRequest]:
    return parsed_once(GetCommitsRequest, _read_get_commits_request)


async def _read_get_commits_request() -> GetCommitsRequest:
    return _get_commits_of(await request.get_data(), request.args)


def _get_commits_of(data: bytes, args) -> GetCommitsRequest:
    """The spec puts GET's parameters in a JSON body; some HTTP clients (unitycatalog-client's aiohttp among
    them) never send a GET body, so query parameters (`args`) are read too. Both given and different is an
    error."""
    body = body_json(data, allow_empty=True)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    for key in ("table_id", "table_uri", *_GET_COMMITS_INTS):
        raw = args.get(key)
        if raw is None:
            continue
        value: Any = raw
        if key in _GET_COMMITS_INTS:
            try:
                value = int(raw)
            except ValueError:
                raise BadRequest(f"{key} must be an integer, got {raw!r}") from None
            if not -INT64_MAX - 1 <= value <= INT64_MAX:
                raise BadRequest(f"{key} {raw} is beyond the signed 64-bit range")
        if key in body and body[key] != value:
            raise BadRequest(f"{key} is given twice, as {body[key]!r} in the body and {raw!r} in the query")
        body[key] = value
    return parse_model(GetCommitsRequest, body)


@bp.get("/delta/commits")
@bp.get("/delta/preview/commits")
@guard(_get_commits_needs)
async def get_commits() -> Response:
    return await _get_commits(_service(), await _get_commits_request())


async def _get_commits(service, req: GetCommitsRequest) -> Response:
    commits, latest = await service.get_commits(req)
    return json_response({"commits": commits, "latest_table_version": latest})


@bp.post("/delta/commit")
@bp.post("/delta/preview/commits")
@guard(_commit_needs)
async def commit() -> Response:
    return await _commit(_service(), await read_model(CommitRequest))


async def _commit(service, req: CommitRequest) -> Response:
    await service.commit(req)
    return json_response({})


# What a Delta writer calls for each commit (the table's latest commits, then its own) is served without Quart's
# request machinery (api/direct.py), by the routes' own code.


def _direct_on_table_id(privilege: Privilege):
    async def needs(coordinator, req, part) -> Needs:
        return await _on_table_id(privilege, part.table_id, coordinator.delta)
    return needs


async def _direct_commit(coordinator, req, body: CommitRequest) -> Response:
    return await _commit(coordinator.delta, body)


async def _direct_get_commits(coordinator, req, body: GetCommitsRequest) -> Response:
    return await _get_commits(coordinator.delta, body)


def _direct_get_commits_request(req) -> GetCommitsRequest:
    return _get_commits_of(req.body, req.args)


DIRECT = {f"{bp.name}.commit": DirectRoute(json_model(CommitRequest), _direct_on_table_id(WRITE), _direct_commit,
                                           part=json_fields(CommitRequest, "table_id")),
          # (its policy reads the whole of its small body, and the view gets that)
          f"{bp.name}.get_commits": DirectRoute(_direct_get_commits_request, _direct_on_table_id(READ),
                                                _direct_get_commits, part=_direct_get_commits_request)}


@bp.post("/delta/metrics")
@guard(_metrics_needs)
async def write_metrics() -> Response:
    await _service().write_metrics(await read_model(MetricsRequest))
    return json_response({})


# -- temporary credentials (UC OSS; engines ask before they read or write a table's files) ------------------------


@bp.post("/temporary-table-credentials")
@guard(_table_credentials_needs)
async def temporary_table_credentials() -> Response:
    return json_response(await _service().temporary_table_credentials(
        await read_model(GenerateTemporaryTableCredential)))


@bp.post("/temporary-path-credentials")
@guard(authenticated)   # no credential is ever vended for a path (rules.temporary_credentials): nothing to guard
async def temporary_path_credentials() -> Response:
    return json_response(await _service().temporary_path_credentials(
        await read_model(GenerateTemporaryPathCredential)))


@bp.route("/<path:rest>", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
@guard(authenticated)
async def unknown_endpoint(rest: str) -> Response:
    allowed = _methods_served_at(request.path)
    if allowed:
        return uc_error(405, "METHOD_NOT_ALLOWED", f"{request.method} is not allowed on /{rest}; allowed: "
                        f"{', '.join(allowed)}", {"Allow": ", ".join(allowed)})
    return uc_error(404, "ENDPOINT_NOT_FOUND", f"no such Unity Catalog endpoint: {request.method} /{rest}")


def _methods_served_at(path: str) -> list[str]:
    """The methods a route other than the catch-all serves at `path` (it takes every method, so werkzeug's own
    405 never happens here)."""
    adapter = current_app.create_url_adapter(request)
    allowed = []
    for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"):
        try:
            rule, _ = adapter.match(path, method=method, return_rule=True)
        except HTTPException:   # no route, or a redirect
            continue
        if rule.endpoint != request.url_rule.endpoint:
            allowed.append(method)
    return allowed


def cross_format_part(body: dict) -> CommitPart:
    """A Delta commit (the body of `POST /delta/commit`) as a part of a cross-format commit (api/commits.py)."""
    table_id = parse_model(fields_of(CommitRequest, "table_id"), body).table_id

    async def needs() -> Needs:
        return await _on_table_id(WRITE, table_id)

    def read():
        req = parse_model(CommitRequest, body)

        async def plan():
            return await _service().plan_commit(req)
        return plan
    return CommitPart(f"delta {table_id}", needs, read, ERRORS)
