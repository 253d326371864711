"""Unity Catalog routes for Delta tables (`/api/2.1/unity-catalog/...`): parse, call the service, map the result.

Specs: the seed (UC Managed Tables 0.1.0: `/staging-tables`, `/tables`, `/delta/commits`, `/delta/commit`,
`/delta/metrics`) and UC OSS `api/all.yaml` (catalogs, schemas, `/delta/preview/commits`, which today's clients
call). Errors are answered by `errors.py`.
"""

from __future__ import annotations

import logging
from typing import Any

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
                      query_flag, read_model)
from ..direct import direct
from .errors import ERRORS, uc_error
from .requests import (_create_schema_needs, _listing, _metrics_needs, _on, _on_full_name, _on_listed, _on_new_table,
                       _on_table_id, _page, _required_arg, _service, _table_credentials_needs)

log = logging.getLogger(__name__)

PREFIX = "/api/2.1/unity-catalog"
bp = Blueprint(DELTA.name, __name__, url_prefix=PREFIX)

MAX_PAGE = 1000
MAX_TABLES_PAGE = 50  # UC OSS: `max_results` of listTables is at most 50
# What a listing shows of a table the caller may not read (it holds another privilege on it): the way to name it,
# not its columns, location, properties or comment.
LISTED_ONLY = ("name", "catalog_name", "schema_name", "table_type", "table_id")


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


def _get_commits_request(req) -> GetCommitsRequest:
    """The spec puts GET's parameters in a JSON body; some HTTP clients (unitycatalog-client's aiohttp among
    them) never send a GET body, so query parameters are read too. Both given and different is an error."""
    args = req.args
    body = body_json(req.body, allow_empty=True)
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


def _on_the_table(privilege: Privilege):
    """The table the body (or query) names by id, as the policy read it."""
    async def needs(coordinator, req, part) -> Needs:
        return await _on_table_id(privilege, part.table_id, coordinator.service(DELTA))
    return needs


# What a Delta writer calls for each commit (the table's latest commits, then its own) is served without Quart's
# request machinery (api/direct.py).


@bp.get("/delta/commits")
@bp.get("/delta/preview/commits")
# (its policy reads the whole of its small body, and the view gets that)
@direct(needs=_on_the_table(READ), read=_get_commits_request, part=_get_commits_request)
async def get_commits(coordinator, req, body: GetCommitsRequest) -> Response:
    commits, latest = await coordinator.service(DELTA).get_commits(body)
    return json_response({"commits": commits, "latest_table_version": latest})


@bp.post("/delta/commit")
@bp.post("/delta/preview/commits")
@direct(needs=_on_the_table(WRITE), read=json_model(CommitRequest), part=json_fields(CommitRequest, "table_id"))
async def commit(coordinator, req, body: CommitRequest) -> Response:
    await coordinator.service(DELTA).commit(body)
    return json_response({})


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
