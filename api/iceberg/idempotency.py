"""What Iceberg's routes bind an Idempotency-Key to, and how a table's or view's recorded answer is replayed; the
handling itself is api/idempotency.py's, shared by every protocol."""

from __future__ import annotations

from typing import Awaitable, Callable
from urllib.parse import quote

from quart import request

from coordinator.iceberg.format import ICEBERG
from coordinator.iceberg.state import IcebergTable

from .. import idempotency
from ..context import service
from ..idempotency import request_key

__all__ = ["idempotent", "request_key"]


def idempotent(route: str, current: Callable[..., Awaitable[IcebergTable]] | None = None,
               named: Callable[[], Awaitable[str]] | None = None):
    """Iceberg's Idempotency-Key handling for a mutating route: the key is bound to the path the request was sent
    to, and for a route that names its objects in the body (creates, renames, multi-table commits) to those names
    too (`named`). A route that answers with a table or view must give `current(**route_args)`, its state now:
    the answer is replayed from the metadata file it named, or from `current` if that file is gone
    (`IcebergService.replay`)."""
    async def target() -> str:
        path = quote(request.path)
        return path if named is None else f"{path}?name={quote(await named(), safe='')}"

    async def replay(body_ref, kwargs):
        return await service(ICEBERG).replay(route, body_ref, lambda: current(**kwargs))
    return idempotency.idempotent(route, target, replay)
