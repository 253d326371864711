"""A format's table names -> table ids, cached, and the hand-over of a proposal to a named table's actor.

Actors are keyed by table id; requests name tables. Resolving a name reads the store, so ids are cached. A cached
id goes stale when its table is renamed or dropped (here or on another member): the actor then answers that the
table is gone (`NoSuchTable`; `NameMoved` when the id now carries another name), and `submit` resolves the name
afresh and tries once more, which finds the table under its new id, or finds that the name no longer exists.

Generic over the name: any hashable value (Iceberg: its `TableIdent` with the kind, table or view). The format
gives `resolve(name)`, which returns the id or raises the format's typed not-found error, and `gone(name)`, the
error to raise when the retry fails too.

    names = Names(registry, resolve=..., gone=lambda name: NoSuchTable(f"Table does not exist: {name}"))
    table = await names.submit(name, lambda: LoadTable(...))
"""

from __future__ import annotations

import uuid
from typing import Any, Awaitable, Callable, Generic, Hashable, TypeVar

from .decision import Proposal
from .errors import NoSuchTable

N = TypeVar("N", bound=Hashable)

MAX_NAMES = 100_000   # beyond this the cache starts afresh (it holds only what is cheap to resolve again)


class Names(Generic[N]):
    def __init__(self, registry, resolve: Callable[[N], Awaitable[uuid.UUID]],
                 gone: Callable[[N], Exception], max_names: int = MAX_NAMES):
        self.registry = registry
        self._resolve = resolve
        self._gone = gone
        self._max = max_names
        self._ids: dict[N, uuid.UUID] = {}

    async def id(self, name: N) -> uuid.UUID:
        """The table id `name` denotes: cached, else resolved (which raises the format's not-found error)."""
        table_id = self._ids.get(name)
        if table_id is None:
            table_id = await self._resolve(name)
            self.remember(name, table_id)
        return table_id

    def remember(self, name: N, table_id: uuid.UUID) -> None:
        """A name known to denote `table_id` (just created or resolved)."""
        if len(self._ids) >= self._max:
            self._ids.clear()
        self._ids[name] = table_id

    def forget(self, name: N) -> None:
        """A name that no longer denotes its cached id (dropped, renamed away)."""
        self._ids.pop(name, None)

    async def submit(self, name: N, make_proposal: Callable[[], Proposal]) -> Any:
        """Hand a fresh proposal (`make_proposal()`) to the named table's actor, and return its reply. If the actor
        answers that the table is gone, resolve the name again and try once more; then `gone(name)`. The actor
        decided nothing in that answer, so trying again cannot apply a change twice."""
        for attempt in (0, 1):
            table_id = await self.id(name)
            try:
                return await self.registry.submit(table_id, make_proposal())
            except NoSuchTable:   # gone, or NameMoved: the id now carries another name
                self.forget(name)
                if attempt:
                    raise self._gone(name) from None
