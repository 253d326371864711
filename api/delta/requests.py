"""How Unity Catalog's Delta routes read a request (paging, arguments) and what each needs (its access policy,
which api/access.py and api/direct.py enforce)."""

from __future__ import annotations

from typing import Any

from quart import Response, request

from coordinator.auth import Privilege
from coordinator.delta import CreateSchema, MetricsRequest
from coordinator.delta.models import GenerateTemporaryTableCredential
from coordinator.delta.format import DELTA
from coordinator.delta.rules import split_full_name
from coordinator.errors import BadRequest

from ..access import CREATE, READ, WRITE, Needs
from ..common import json_response, read_fields, read_model
from ..context import service


DEFAULT_PAGE = 100


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
