"""Idempotency-Key handling, in one place for every route of every protocol that takes the header (Iceberg's
mutating routes, the commit across formats): validate the key, replay a finalized answer, or run the handler once.
The machinery is `coordinator.idempotency`'s (the operation records its answer in the same transaction as its
change); a recorded error comes back raised, and the protocol's error translation words it.

A route served straight from ASGI (api/direct.py) takes no request with a key: those come here, through Quart."""

from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable

from quart import g, request

from coordinator.idempotency import IdempotencyKey, IdempotencyRecord, bind, parse_key

from .access import POLICIES
from .common import empty_response, json_response
from .context import current_coordinator

HEADER = "Idempotency-Key"


def request_key() -> IdempotencyKey | None:
    """The request's key, bound to its route (None without the header): the operation records with it."""
    return g.get("idempotency_key")


def idempotent(route: str, target: Callable[[], Awaitable[str]],
               replay: Callable[[Any, dict[str, Any]], Awaitable[Any]] | None = None):
    """Idempotency-Key handling for a route (under its route decorators and policy): the key is bound to the
    operation `route` and its `target()` (what it acts on, percent-encoded), so that a key reused elsewhere is
    refused, not answered with another object's answer. A record that names its answer rather than holding it
    (`body_ref`) is answered by `replay(body_ref, route_args)`."""
    def wrap(fn):
        @functools.wraps(fn)
        async def handler(**kwargs: Any):
            raw = request.headers.get(HEADER)
            if raw is None:
                return await fn(**kwargs)
            key = IdempotencyKey(parse_key(raw), bind(route, await target()))
            g.idempotency_key = key
            result = await current_coordinator().idempotency.run(key.key, key.route, lambda: fn(**kwargs))
            if not isinstance(result, IdempotencyRecord):
                return result  # not a replay: the handler's own response, headers included
            if result.body_ref is not None and replay is not None:
                return json_response(await replay(result.body_ref, kwargs), result.status)
            if result.body:   # an answer (or an error recorded in this protocol's words by earlier versions)
                return json_response(bytes(result.body), result.status)
            return empty_response(result.status)
        if fn in POLICIES:   # the policy declared for the view it wraps
            POLICIES[handler] = POLICIES[fn]
        return handler
    return wrap
