"""Unity Catalog's Delta API v1.0 routes (`/api/2.1/unity-catalog/delta/v1/...`, the Managed Tables
Specification v1.0 and its `delta.yaml`), on the Delta blueprint beside the preview API's routes: parse,
authorize, call the v1 service (coordinator/delta/v1), answer. Every route's grants are named by its path, so
they are checked before any of a body is parsed. Errors are answered by `errors.py` (api/delta/protocol.py sends
it every error of a `/delta/v1` path)."""

from __future__ import annotations

from typing import Any

from quart import Response, request

from coordinator.auth import Privilege
from coordinator.delta.format import DELTA
from coordinator.delta.v1.errors import MalformedRequest
from coordinator.delta.v1.models import CreateStagingTable, CreateTable, RenameTable, ReportMetrics, model, update_table
from coordinator.delta.v1.service import DeltaV1
from coordinator.errors import BadRequest, NoSuchRoute

from ...access import CREATE, DROP, READ, WRITE, Needs, authenticated, guard, listing
from ...common import body_json, empty_response, json_response
from ...context import service
from ...direct import direct
from ..requests import _required_arg
from ..routes import _methods_served_at, bp
from .errors import v1_error

V1 = "/delta/v1"
TABLE = V1 + "/catalogs/<catalog>/schemas/<schema>/tables/<table>"
SCHEMA = V1 + "/catalogs/<catalog>/schemas/<schema>"
OPERATIONS = ("READ", "READ_WRITE")


def _v1() -> DeltaV1:
    return DeltaV1(service(DELTA))


async def _body() -> Any:
    """The request's JSON; not JSON (or none) is the spec's BadRequestException."""
    try:
        return body_json(await request.get_data())
    except BadRequest as exc:
        raise MalformedRequest(exc.message) from None


def _operation() -> str:
    raw = request.args.get("operation")
    if raw not in OPERATIONS:
        raise MalformedRequest(f"query parameter operation must be one of {', '.join(OPERATIONS)}, got {raw!r}")
    return raw


# -- access: what each route needs, from its path alone -------------------------------------------------------


def _on_table(privilege: Privilege):
    def needs(catalog: str, schema: str, table: str) -> Needs:
        return [(privilege, DELTA.table(catalog, (schema,), table))]
    return needs


def _on_schema(privilege: Privilege):
    def needs(catalog: str, schema: str) -> Needs:
        return [(privilege, (DELTA.name, catalog, schema))]
    return needs


def _rename_needs(catalog: str, schema: str, table: str) -> Needs:
    # The table leaves its name (as a drop would) and takes another in its schema (as a create would).
    return [*_on_table(DROP)(catalog, schema, table), *_on_schema(CREATE)(catalog, schema)]


def _credentials_needs(catalog: str, schema: str, table: str) -> Needs:
    privilege = WRITE if request.args.get("operation") == "READ_WRITE" else READ
    return _on_table(privilege)(catalog, schema, table)


# -- configuration and credentials -------------------------------------------------------------------------------


@bp.get(V1 + "/config")
@guard(listing(lambda: [(READ, (DELTA.name, _required_arg("catalog")))]))
async def v1_config() -> Response:
    return json_response(await _v1().config(_required_arg("catalog"), _required_arg("protocol-versions")))


@bp.get(V1 + "/staging-tables/<table_id>/credentials")
@guard(authenticated)   # only the staging table's creator: checked by its actor (proposals.StagingLocation)
async def v1_staging_credentials(table_id: str) -> Response:
    return json_response(await _v1().staging_credentials(table_id))


@bp.get(TABLE + "/credentials")
@guard(_credentials_needs)
async def v1_table_credentials(catalog: str, schema: str, table: str) -> Response:
    return json_response(await _v1().table_credentials((catalog, schema, table), _operation()))


@bp.get(V1 + "/temporary-path-credentials")
@guard(authenticated)   # no credential is ever vended for a path with authentication on (preview rules)
async def v1_path_credentials() -> Response:
    return json_response(await _v1().path_credentials(_required_arg("location"), _operation()))


# -- tables ------------------------------------------------------------------------------------------------------


@bp.post(SCHEMA + "/staging-tables")
@guard(_on_schema(CREATE))
async def v1_create_staging_table(catalog: str, schema: str) -> Response:
    body = model(CreateStagingTable, await _body())
    return json_response(await _v1().create_staging_table(catalog, schema, body.name))


@bp.post(SCHEMA + "/tables")
@guard(_on_schema(CREATE))
async def v1_create_table(catalog: str, schema: str) -> Response:
    return json_response(await _v1().create_table(catalog, schema, model(CreateTable, await _body())))


# HEAD first: werkzeug serves a HEAD by the GET route otherwise.
@bp.route(TABLE, methods=["HEAD"])
@guard(_on_table(READ))
async def v1_table_exists(catalog: str, schema: str, table: str) -> Response:
    await _v1().table_exists((catalog, schema, table))
    return empty_response(204)


@bp.get(TABLE)
@guard(_on_table(READ))
async def v1_load_table(catalog: str, schema: str, table: str) -> Response:
    return json_response(await _v1().load_table((catalog, schema, table)))


def _update_body(req):
    """updateTable's body as its view reads it: not JSON is the spec's BadRequestException."""
    try:
        value = req.json()
    except BadRequest as exc:
        raise MalformedRequest(exc.message) from None
    return update_table(value)


async def _update_needs(coordinator, req, part) -> Needs:
    return _on_table(WRITE)(**req.view_args)


# updateTable is what a Delta writer calls for each commit: served without Quart's request machinery too
# (api/direct.py), its grants checked from the path alone, before any of the body is received.
@bp.post(TABLE)
@direct(needs=_update_needs, read=_update_body)
async def v1_update_table(coordinator, req, body) -> Response:
    a = req.view_args
    v1 = DeltaV1(coordinator.service(DELTA))
    return json_response(await v1.update_table((a["catalog"], a["schema"], a["table"]), body))


@bp.delete(TABLE)
@guard(_on_table(DROP))
async def v1_delete_table(catalog: str, schema: str, table: str) -> Response:
    await _v1().delete_table((catalog, schema, table))
    return empty_response(204)


@bp.post(TABLE + "/rename")
@guard(_rename_needs)
async def v1_rename_table(catalog: str, schema: str, table: str) -> Response:
    body = model(RenameTable, await _body())
    await _v1().rename_table((catalog, schema, table), body.new_name)
    return empty_response(204)


@bp.post(TABLE + "/metrics")
@guard(_on_table(WRITE))
async def v1_report_metrics(catalog: str, schema: str, table: str) -> Response:
    await _v1().report_metrics((catalog, schema, table), model(ReportMetrics, await _body()))
    return empty_response(204)


@bp.route(V1 + "/<path:rest>", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"])
@guard(authenticated)
async def v1_unknown_endpoint(rest: str) -> Response:
    allowed = _methods_served_at(request.path)
    if allowed:
        return v1_error(405, "BadRequestException", f"{request.method} is not allowed on {V1}/{rest}; allowed: "
                        f"{', '.join(allowed)}", {"Allow": ", ".join(allowed)})
    raise NoSuchRoute(f"no such endpoint of Unity Catalog's Delta API v1.0: {request.method} {V1}/{rest} (GET "
                      f"{V1}/config lists them)")
