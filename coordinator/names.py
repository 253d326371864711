"""A format's table names -> what they stand for, cached, and the hand-over of a proposal to a named table's actor.

Actors are keyed by table id; requests name tables. Resolving a name reads the store, so what it resolves to is
cached. A cached name goes stale when its table is renamed or dropped (here or on another member): the actor then
answers that the table is gone (`NoSuchTable`; `NameMoved` when the id now carries another name), and `submit`
resolves the name afresh and tries once more, which finds the table under its new id, or finds that the name no
longer exists.

Generic over the name: any hashable value (Iceberg: its `TableIdent` with the kind, table or view; Lance: the
identifier's levels). A name resolves to the table's id, or to a value that carries it (Lance: the id and the
location, which a proposal's file reads need before it is handed over; `table_id` tells the id). The format gives
`resolve(name)`, which returns that or raises the format's typed not-found error, and `gone(name)`, the error to
raise when the retry fails too.

    names = Names(registry, resolve=..., gone=lambda name: NoSuchTable(f"Table does not exist: {name}"))
    table = await names.submit(name, lambda: LoadTable(...))
"""

from __future__ import annotations

import uuid
from typing import Any, Awaitable, Callable, Generic, Hashable, TypeVar

from .decision import Proposal
from .errors import NoSuchTable

N = TypeVar("N", bound=Hashable)
R = TypeVar("R")

MAX_NAMES = 100_000   # beyond this the cache starts afresh (it holds only what is cheap to resolve again)


def _itself(ref: Any) -> uuid.UUID:
    return ref


class Names(Generic[N, R]):
    def __init__(self, registry, resolve: Callable[[N], Awaitable[R]], gone: Callable[[N], Exception],
                 max_names: int = MAX_NAMES, table_id: Callable[[R], uuid.UUID] = _itself):
        self.registry = registry
        self._resolve = resolve
        self._gone = gone
        self._max = max_names
        self._table_id = table_id
        self._refs: dict[N, R] = {}

    async def ref(self, name: N) -> R:
        """What `name` stands for: cached, else resolved (which raises the format's not-found error)."""
        ref = self._refs.get(name)
        if ref is None:
            ref = await self._resolve(name)
            self.remember(name, ref)
        return ref

    async def id(self, name: N) -> uuid.UUID:
        """The table id `name` denotes."""
        return self._table_id(await self.ref(name))

    def remember(self, name: N, ref: R) -> None:
        """A name known to stand for `ref` (its table just created or resolved)."""
        if len(self._refs) >= self._max:
            self._refs.clear()
        self._refs[name] = ref

    def forget(self, name: N) -> None:
        """A name that no longer stands for what is cached (dropped, renamed away)."""
        self._refs.pop(name, None)

    async def submit(self, name: N, make_proposal: Callable[[], Proposal]) -> Any:
        """Hand a fresh proposal (`make_proposal()`) to the named table's actor, and return its reply (`submit_to`)."""
        async def make(_ref: R) -> Proposal:
            return make_proposal()
        return await self.submit_to(name, make)

    async def submit_to(self, name: N, make: Callable[[R], Awaitable[Proposal]]) -> Any:
        """Hand the proposal `make(ref)` builds (it may read files first, given what the name stands for) to the
        named table's actor, and return its reply. If the actor answers that the table is gone, resolve the name
        again and try once more; then `gone(name)`. The actor decided nothing in that answer, so trying again
        cannot apply a change twice."""
        for attempt in (0, 1):
            ref = await self.ref(name)
            try:
                return await self.registry.submit(self._table_id(ref), await make(ref))
            except NoSuchTable:   # gone, or NameMoved: the id now carries another name
                self.forget(name)
                if attempt:
                    raise self._gone(name) from None
