"""How Iceberg's routes read a request (its prefix, namespace and names; its body) and what each needs (its access
policy, which api/access.py and api/direct.py enforce)."""

from __future__ import annotations

from typing import Awaitable, Callable

from pydantic import BaseModel, ConfigDict, Field
from quart import Response, has_request_context, request

from coordinator.auth import Privilege, Resource, table_securable
from coordinator.errors import BadRequest
from coordinator.delta.format import DELTA   # (the Unity Catalog mount reads Delta tables)
from coordinator.iceberg.format import ICEBERG
from coordinator.iceberg.models import (CommitTableRequest, CommitTransactionRequest, CreateNamespaceRequest,
                                        RenameTableRequest, TableIdentifier, load_result)
from coordinator.iceberg.state import IcebergTable, TableIdent

from ..access import CREATE, DROP, READ, WRITE, Needs
from ..common import fields_of, json_response, read_fields, read_model
from ..context import current_coordinator
from . import uniform

NAMESPACE_SEPARATOR = "\x1f"
# Prefixes that would make Iceberg's `/v1/{prefix}/...` collide with Lance's `/v1/namespace/...`, `/v1/table/...`.
RESERVED_PREFIXES = {"namespace", "table", "transaction", "config", "oauth"}


# -- helpers -------------------------------------------------------------------------------------------------


def _uniform() -> bool:
    """The request reads Unity Catalog's Delta tables as Iceberg (`uniform.py`'s mount), not this catalog. A direct
    route (api/direct.py) has no Quart request: it serves only this catalog's own routes."""
    return has_request_context() and request.blueprint == uniform.bp.name


def _catalog():
    return _catalog_of(current_coordinator())


def _catalog_of(coordinator):
    """This catalog, or the Unity Catalog mount's (whose routes are Quart's: `_uniform` needs its request)."""
    return coordinator.uniform if _uniform() else coordinator.service(ICEBERG)


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
