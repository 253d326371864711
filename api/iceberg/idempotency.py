"""Idempotency-Key handling for Iceberg's mutating routes (the spec's `Idempotency-Key` header): validate the key,
replay a finalized answer, or run the handler once. The machinery is `coordinator.idempotency`'s; a recorded error
comes back raised, and `errors.error_response` words it."""

from __future__ import annotations

import functools
from typing import Awaitable, Callable
from urllib.parse import quote

from quart import g, request

from coordinator.iceberg.format import ICEBERG
from coordinator.iceberg.state import IcebergTable
from coordinator.idempotency import IdempotencyKey, IdempotencyRecord, bind, parse_key

from ..common import empty_response, json_response
from ..context import current_coordinator, service


def request_key() -> IdempotencyKey | None:
    """The request's key, bound to its route (None without the header): the catalog operation records with it."""
    return g.get("idempotency_key")


async def _target(named: Callable[[], Awaitable[str]] | None) -> str:
    """What a key is bound to besides its operation: the path the request was sent to, and for a route that
    names its objects in the body (creates, renames, multi-table commits), those names too. Percent-encoded, so
    any name fits the route column."""
    path = quote(request.path)
    return path if named is None else f"{path}?name={quote(await named(), safe='')}"


def idempotent(route: str, current: Callable[..., Awaitable[IcebergTable]] | None = None,
               named: Callable[[], Awaitable[str]] | None = None):
    """Idempotency-Key handling for a mutating route: validate the key, replay a finalized answer, or run the
    handler once (its catalog operation records success in the same transaction as the change). The record is
    bound to the route and its target (`_target`; `named` gives the object a create names in its body): the key
    reused elsewhere is refused, not answered with another object's answer. A route that answers with a table
    or view must give `current(**route_args)`, its state now: the answer is replayed from the metadata file it
    named, or from `current` if that file is gone (`IcebergService.replay`)."""
    def wrap(fn):
        @functools.wraps(fn)
        async def handler(**kwargs):
            raw = request.headers.get("Idempotency-Key")
            if raw is None:
                return await fn(**kwargs)
            key = IdempotencyKey(parse_key(raw), bind(route, await _target(named)))
            g.idempotency_key = key
            result = await current_coordinator().idempotency.run(key.key, key.route, lambda: fn(**kwargs))
            if not isinstance(result, IdempotencyRecord):
                return result  # not a replay: the handler's own response, headers included
            if result.body_ref is not None:  # only routes that answer with a table or view record one
                body = await service(ICEBERG).replay(route, result.body_ref, lambda: current(**kwargs))
                return json_response(body, result.status)
            if result.body:   # an answer (or an error recorded in this protocol's words by earlier versions)
                return json_response(result.body, result.status)
            return empty_response(result.status)
        return handler
    return wrap
