"""How Lance's routes read a request (an id's levels, the body), what each needs (its access policy, which
api/access.py and api/direct.py enforce), and the spec's response shapes."""

from __future__ import annotations

from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict
from quart import Response, request

from coordinator.auth import Privilege, Resource
from coordinator.errors import BadRequest
from coordinator.lance import (BatchDeleteTableVersionsRequest, CreateTableVersionRequest, DeclareTableRequest,
                               DeregisterTableRequest, LanceTable, Page, TableVersion)
from coordinator.lance.format import LANCE
from coordinator.lance.models import CreateTableVersionEntry

from ..access import CREATE, DROP, WRITE, Needs
from ..common import fields_of, json_response, parse_json, parse_model, parsed_once
from ..context import service

DEFAULT_DELIMITER = "$"


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
