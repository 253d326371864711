"""Lance namespaces: rows of the shared `namespaces` table in Lance's realm (catalog "": rows.py), separate from the
other formats'. A cascading drop drops the tables through the service (their actors), then the namespaces.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Awaitable, Callable

from storage import errors as storage_errors
from storage.files import join, path_segment
from storage.interface import Store
from storage.records import join_namespace, split_namespace

from .. import name_limits
from ..errors import (BadRequest, CommitConflict, NamespaceExists, NamespaceNotEmpty, NamespaceRefilled,
                      NoSuchNamespace, NotFound, from_storage)
from ..paging import decode_page_token, one_more, page
from ..placement import check_namespace_directory_free
from ..warehouses import DEFAULT as DEFAULT_WAREHOUSE
from ..warehouses import Warehouses, how_to_create
from .layout import show
from .models import Page, parse_mode
from .rows import CATALOG, REALM
from .rules import Ident, check_levels

WAREHOUSE_PROPERTY = "warehouse"   # a top-level namespace's tables go to this warehouse's root
CASCADE_ROUNDS = 10   # a cascade drop drops the tables declared while it ran this many times before giving up


class LanceNamespaces:
    """`warehouses`: the service's warehouses (coordinator/warehouses.py); `warehouse`: the default one's root;
    `drop_table`: the service's drop of a table, through its actor (a cascading drop's)."""

    def __init__(self, store: Store, warehouses: Warehouses, warehouse: str,
                 drop_table: Callable[[Ident], Awaitable[Any]]):
        self.store = store
        self.warehouses = warehouses
        self.warehouse = warehouse
        self.drop_table = drop_table
        # Namespaces a cascade drop is emptying here: nothing new is created in or below them meanwhile, or
        # steady declares could keep the drop from ever finding them empty (`_drop_cascading`).
        self._dropping: Counter[Ident] = Counter()
        # Top-level namespace -> the warehouse its `warehouse` property names (None: the default), as learnt.
        self._warehouse_of: dict[str, str | None] = {}

    def directory(self, ns: Ident) -> str:
        return join(self.root(ns), *(path_segment(level) for level in ns))

    def root(self, ns: Ident) -> str:
        """The root of the warehouse `ns` lies in: the one its top-level namespace names in its `warehouse`
        property (as `learn` found it), else the default one."""
        named = self._warehouse_of.get(ns[0]) if ns else None
        return (self.warehouses.root(named) if named else None) or self.warehouse

    async def learn(self, ns: Ident) -> None:
        """Find which warehouse `ns`'s top-level namespace names, once: `root` then answers without a lookup."""
        if ns and ns[0] not in self._warehouse_of:
            props = await self.store.get_namespace(REALM, CATALOG, join_namespace(ns[:1]))
            named = (props or {}).get(WAREHOUSE_PROPERTY)
            if named:
                await self.warehouses.resolve(named)
            if props is not None:
                self._warehouse_of[ns[0]] = named

    async def _check_warehouse(self, ns: Ident, props: dict[str, str]) -> None:
        """A top-level namespace may name a warehouse for its tables; nothing below one may name another."""
        named = props.get(WAREHOUSE_PROPERTY)
        if named is None:
            return
        if len(ns) > 1:
            raise BadRequest(f"only a top-level namespace may name a {WAREHOUSE_PROPERTY!r}: {show(ns)} lies in "
                             f"{show(ns[:1])}'s")
        if named != DEFAULT_WAREHOUSE and await self.warehouses.resolve(named) is None:
            raise BadRequest(f"warehouse {named!r} does not exist; {how_to_create(named)}")

    def not_being_dropped(self, ns: Ident) -> None:
        """Refuses to create anything in or below a namespace a cascade drop is emptying here."""
        for depth in range(1, len(ns) + 1):
            if self._dropping[ns[:depth]]:
                raise CommitConflict(f"Namespace {show(ns[:depth])} is being dropped; nothing was created; retry")

    async def create(self, ns: Ident, mode: str | None, properties: dict[str, str] | None) -> dict[str, str]:
        mode = parse_mode(mode, ("create", "existok", "overwrite"), "create", "mode")
        check_levels(ns, "namespace")
        if not ns:
            if mode == "create":
                raise NamespaceExists("the root namespace always exists")
            return {}
        props = dict(properties or {})
        name_limits.check_namespace(ns)
        self.not_being_dropped(ns[:-1])
        await self._check_warehouse(ns, props)
        await self.learn(ns[:-1])
        if len(ns) == 1:
            self._warehouse_of.pop(ns[0], None)   # whatever an earlier namespace of this name named
            if props.get(WAREHOUSE_PROPERTY):
                await self.warehouses.resolve(props[WAREHOUSE_PROPERTY])
            self._warehouse_of[ns[0]] = props.get(WAREHOUSE_PROPERTY)
        await check_namespace_directory_free(self.store, self.directory(ns), show(ns))
        try:
            await self._store_create_namespace(ns, props)
        except NamespaceExists:
            if mode == "create":
                raise
            if mode == "existok":
                return await self.describe(ns)
            # Overwrite: "the existing namespace is dropped and a new empty namespace with this name is created".
            try:
                await self.drop(ns, None, "cascade")
            except NoSuchNamespace:
                pass   # a concurrent overwrite or drop came first: gone all the same
            await self._store_create_namespace(ns, props)
        return props

    async def _store_create_namespace(self, ns: Ident, props: dict[str, str]) -> None:
        """The store's create, its refusals as the typed errors they mean (`from_storage`): the name is taken, or
        the parent namespace is gone."""
        try:
            await self.store.create_namespace(REALM, CATALOG, join_namespace(ns), props, parent=_parent(ns))
        except storage_errors.StorageError as exc:
            raise from_storage(exc) from None

    async def describe(self, ns: Ident) -> dict[str, str]:
        check_levels(ns, "namespace")
        if not ns:
            return {}
        props = await self.store.get_namespace(REALM, CATALOG, join_namespace(ns))
        if props is None:
            raise NoSuchNamespace(f"Namespace does not exist: {show(ns)}")
        return props

    async def list(self, ns: Ident, page_token: str | None, limit: int | None) -> Page:
        await self.describe(ns)
        paths = await self.store.list_namespaces(REALM, CATALOG, join_namespace(ns),
                                                 after=decode_page_token(page_token), limit=one_more(limit))
        paths, nxt = page(paths, limit)
        return Page([split_namespace(p)[-1] for p in paths], nxt)

    async def drop(self, ns: Ident, mode: str | None, behavior: str | None) -> dict[str, str]:
        mode = parse_mode(mode, ("fail", "skip"), "fail", "mode")
        behavior = parse_mode(behavior, ("restrict", "cascade"), "restrict", "behavior")
        check_levels(ns, "namespace")
        if not ns:
            raise BadRequest("the root namespace cannot be dropped")
        try:
            props = await self.describe(ns)
            if behavior == "cascade":
                await self._drop_cascading(ns)
            else:
                await self._store_drop_namespace(ns)
        except NoSuchNamespace:
            if mode == "skip":
                return {}
            raise
        except NamespaceNotEmpty:
            raise NamespaceNotEmpty(f"Namespace is not empty: {show(ns)}; drop its tables and namespaces first or "
                                    f"use behavior Cascade") from None
        return props

    async def _store_drop_namespace(self, ns: Ident, cascade: bool = False) -> None:
        """The store's drop, its refusals as the typed errors they mean (`from_storage`): the namespace is gone, or
        not empty (a cascade refuses only for tables created while it ran: NamespaceRefilled)."""
        try:
            await self.store.drop_namespace(REALM, CATALOG, join_namespace(ns), cascade=cascade)
            self._warehouse_of.pop(ns[0], None)
        except storage_errors.StorageError as exc:
            raise from_storage(exc) from None

    async def _drop_cascading(self, ns: Ident) -> None:
        """Spec, Cascade: "all tables and child namespaces in the namespace are dropped before the namespace is
        dropped". Tables go through their actors (so none keeps serving from memory and their files are purged),
        then the namespaces, in a transaction that keeps new tables out. Tables declared meanwhile are dropped in
        another round (in a cluster, where other members go on creating, up to CASCADE_ROUNDS)."""
        self._dropping[ns] += 1
        try:
            await self._drop_rounds(ns)
        finally:
            self._dropping[ns] -= 1
            if not self._dropping[ns]:
                del self._dropping[ns]

    async def _drop_rounds(self, ns: Ident) -> None:
        path = join_namespace(ns)
        for _ in range(CASCADE_ROUNDS):
            for child in [path] + await self.store.list_namespaces(REALM, CATALOG, path, recursive=True):
                for row in await self.store.list_tables(REALM, CATALOG, child):
                    try:
                        await self.drop_table((*split_namespace(row.namespace), row.name))
                    except NotFound:
                        pass   # (gone meanwhile, or its namespace: nothing to drop)
            try:
                return await self._store_drop_namespace(ns, cascade=True)
            except NamespaceRefilled:
                pass
        raise CommitConflict(f"Namespace {show(ns)} was not dropped: tables kept being created in it; the tables "
                             f"dropped so far stay dropped; retry")


def _parent(ns: Ident) -> tuple[str, str, str] | None:
    """The namespace a nested namespace is created in, which must exist (the store locks it against a drop)."""
    return (REALM, CATALOG, join_namespace(ns[:-1])) if len(ns) > 1 else None
