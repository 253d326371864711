"""The format seam: what a table format declares about itself, once (`Format`), what its parts are built from
(`Services`), and the set of formats a coordinator serves (`Formats`).

The core (the registry and its actors, metrics, the commit feed, grants, the console, commits across formats,
placement, warehouses, metrics reports) names no format: it is given the registered formats (`Formats`; the
service's own list is coordinator/formats.py) and asks each what it declared here. A format's package
(`coordinator/<name>/`) declares its `Format` in `format.py`; the HTTP half, its protocol, is declared beside its
routes (`api/<name>/protocol.py`, api/protocol.py) and names this one.

What a format declares, and who asks:

    name         its tables' securables begin with it (grants), its feed events' types and `format=` filter, its
                 commits' metrics label, the `format` of a part of a commit across formats
    realm        where its namespaces and tables are named in the store
    tables       each kind of its table rows (TableRow.format): how the row loads into the actor's state, and how
                 that state is kept while the table is idle (the registry)
    grants       where a table's name sits in its securable paths (coordinator/auth.py, the console, the feed)
    service      what its protocol calls, built from the coordinator's Services
    changes      the commit feed's event types its proposals write (docs/events.md)
    purge        what its drops' purge claims that name its metadata delete (coordinator/purges.py)
    directories  where its namespaces have directories in a warehouse (coordinator/placement.py)
    warehouses   what of it a warehouse holds (coordinator/warehouses.py, storage/warehouses.py)
    reports      where the metrics reports its clients send are kept (coordinator/reports.py)
    settings     its own fields of the service's Config
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Generic, Iterator, Mapping, TypeVar

from storage.records import ReportTable, TableRow, WarehouseUse, split_namespace

from .auth import Grants, Resource, table_securable
from .decision import KEEP_STATE, Compaction
from .purges import PurgeListing

if TYPE_CHECKING:   # (types only: the parts Services holds are built before any format's)
    from storage.files import FileIO
    from storage.postgres import PostgresStore

    from .auth import AuthConfig
    from .config import Config
    from .feed import Feed
    from .idempotency import Idempotency
    from .metrics import Metrics
    from .registry import Registry
    from .warehouses import Warehouses

S = TypeVar("S")


@dataclass(frozen=True)
class Services:
    """What a format's service (`Format.service`), its loaders (`TableKind.load`), the warehouses' users, UniForm and
    the cluster are built from: every shared part, made once when the coordinator opens, and complete when they are
    built: nothing is filled in later, and nothing else reaches them."""

    config: Config
    formats: Formats            # the formats served (coordinator/formats.py)
    store: PostgresStore
    files: FileIO
    metrics: Metrics
    registry: Registry
    feed: Feed
    idempotency: Idempotency
    warehouses: Warehouses
    auth: AuthConfig | None     # None: authentication is off, every request is anonymous and allowed


@dataclass(frozen=True)
class TableKind:
    """One kind of a format's table rows (its TableRow.format: Iceberg has tables and views): how the actor's
    in-memory state is loaded from a row (given the coordinator's Services), and how it is kept while the table is
    idle (by default as it is)."""

    load: Callable[[Services, TableRow], Awaitable[Any]]
    compaction: Compaction = KEEP_STATE


@dataclass(frozen=True)
class Directories:
    """Where a format's namespaces have directories in a warehouse, which a location a client chooses may not be
    nor hold (coordinator/placement.py). `top_catalog(warehouse)`: the catalog whose namespaces are the top-level
    directories of that warehouse's root (None: the default warehouse), if any; `own_directory(catalog)`: the
    top-level directory of the default warehouse that a catalog has to itself, if any; `reserves(segment)`: whether a
    top-level directory of the default warehouse belongs to one of its catalogs alone (or to none of them), which
    `reserved_for` names in a refusal."""

    top_catalog: Callable[[str | None], str | None]
    own_directory: Callable[[str], str | None] = lambda catalog: None
    reserves: Callable[[str], bool] = lambda segment: False
    reserved_for: str = ""


@dataclass(frozen=True)
class Format(Generic[S]):
    """A table format, as the core knows it (the module docstring says who asks for what)."""

    name: str
    realm: str
    catalog_called: str   # what its catalogs are called in messages ("catalog prefix", "catalog")
    tables: Mapping[str, TableKind]
    grants: Grants
    service: Callable[[Services], S]
    changes: tuple[str, ...]
    purge: PurgeListing | None = None
    directories: Directories | None = None
    # The catalog of this format that a warehouse named so is (Iceberg: the prefix named after it; the default
    # warehouse's is "", no prefix), if any: its grants tell who uses the warehouse (the console).
    warehouse_catalog: Callable[[str], str | None] = lambda warehouse: None
    warehouses: tuple[WarehouseUse, ...] = ()   # what of it a warehouse holds: it is not dropped while any is there
    reports: ReportTable | None = None
    settings: tuple[str, ...] = ()

    def container(self, catalog: str, levels: tuple[str, ...] | list[str] = ()) -> Resource:
        """The securable of a catalog (no levels) or a namespace of this format."""
        return (self.name, *((catalog,) if self.grants.catalog else ()), *levels)

    def table(self, catalog: str, levels: tuple[str, ...] | list[str], name: str) -> Resource:
        """The securable of a table (or view) of this format."""
        return table_securable(self.container(catalog, levels), name)

    def securable(self, catalog: str, namespace: str, name: str) -> Resource:
        """A table's securable from its name as the store keeps it (its namespace's levels joined): what grants
        name, and what a feed reader must be allowed to read to see its events."""
        return self.table(catalog, split_namespace(namespace), name)

    def row_securable(self, row: TableRow) -> Resource:
        """A table row's name as grants name it."""
        return self.securable(row.catalog, row.namespace, row.name)


@dataclass(frozen=True)
class Formats:
    """The formats a coordinator serves, in the order they were registered, found by name, realm or row kind."""

    all: tuple[Format, ...]
    by_name: dict[str, Format] = field(init=False)
    by_realm: dict[str, Format] = field(init=False)
    by_kind: dict[str, Format] = field(init=False)   # by TableRow.format

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {f.name: f for f in self.all})
        object.__setattr__(self, "by_realm", {f.realm: f for f in self.all})
        object.__setattr__(self, "by_kind", {kind: f for f in self.all for kind in f.tables})
        for what, found in (("name", self.by_name), ("realm", self.by_realm)):
            if len(found) != len(self.all):
                raise ValueError(f"two registered formats share a {what}: {[f.name for f in self.all]}")

    def __iter__(self) -> Iterator[Format]:
        return iter(self.all)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.by_name)

    @property
    def grants(self) -> dict[str, Grants]:
        """Where each format's tables sit in the paths grants name, by the format's name (coordinator/auth.py)."""
        return {f.name: f.grants for f in self.all}
