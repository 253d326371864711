"""What the coordinator reads from and hands to the store: plain records, no driver types."""

from __future__ import annotations

import enum
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

NAMESPACE_SEP = "\x1f"  # joins namespace levels in the `path`/`namespace` columns

# Scale-out: tables map to a fixed number of shards, each owned by one member under a lease (migration 005 creates
# exactly this many lease rows). Fixed, so that every member, of any version, computes the same owner.
SHARDS = 64
UNFENCED = -1  # TableWrite.epoch of a table created inside a multi-table transaction: it has no owner yet


def shard_of(table_id: UUID) -> int:
    """Stable across processes and hosts (no per-process hash seed); crc32 also spreads non-random UUIDs."""
    return zlib.crc32(table_id.bytes) % SHARDS


def join_namespace(levels: tuple[str, ...] | list[str]) -> str:
    return NAMESPACE_SEP.join(levels)


def split_namespace(path: str) -> tuple[str, ...]:
    return tuple(path.split(NAMESPACE_SEP)) if path else ()


@dataclass(frozen=True)
class TableRow:
    table_id: UUID
    realm: str              # which protocol's universe the name lives in (its format's realm)
    catalog: str            # Iceberg prefix, Unity Catalog catalog name, "" for Lance
    namespace: str          # levels joined by NAMESPACE_SEP
    name: str
    format: str             # the kind of row, one of its format's (coordinator/format.py TableKind)
    location: str | None
    row_version: int = 0
    epoch: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    kind: str = "table"     # "table" | "view"

    @property
    def cursor(self) -> str:
        """A listing's position after this row, for `list_tables(after=...)` (a page token's content)."""
        return self.namespace + chr(30) + self.name


@dataclass(frozen=True)
class ReportTable:
    """Where one format's metrics reports are kept (a table of its own, made by a migration, with `table_id`,
    `report`, `seq` and `created_at`): the column the report's key goes in (its kind, or its commit's version), and
    whether a report is kept only while its table's row exists (one racing a drop is dropped with it)."""

    name: str
    key: str
    while_table_exists: bool = False


@dataclass(frozen=True)
class WarehouseUse:
    """What a format places in a warehouse, by its namespace rows of `realm`: those of the catalog named after the
    warehouse (`catalog`; such a catalog is `called` so, and a warehouse may not take the name of one that already
    has namespaces elsewhere), those whose property `named_by` names it, or those whose property `root_within` is a
    path within the warehouse's root. A warehouse is not dropped while one is there."""

    realm: str
    catalog: bool = False
    called: str = ""
    named_by: str | None = None
    root_within: str | None = None


@dataclass(frozen=True)
class LogEntry:
    version: int
    payload: dict[str, Any]


@dataclass(frozen=True)
class EventRecord:
    """One event of the commit feed, written with the commit it reports (table `events`). `data` is the
    CloudEvent's data; the rest of the envelope is fixed or comes from the row's place in the feed. `securable`
    is what a reader must be allowed to read to see it, as a key `FeedScope` matches (migration 015)."""

    id: UUID
    type: str
    subject: str
    catalog: str
    data: dict[str, Any]
    securable: str


@dataclass(frozen=True)
class IdempotencyRecord:
    """A finalized answer to replay. `body_ref`, when set, names an immutable file the body is rebuilt from (an
    Iceberg table's metadata file) instead of `body` holding it."""

    key: UUID
    route: str
    status: int
    body: bytes | None
    body_ref: str | None = None


@dataclass(frozen=True)
class PurgeClaim:
    """A drop's claim on its table's location (table `purges`), written in the drop's transaction and held until
    its files are deleted, so that no table is created there meanwhile."""

    location: str
    # The claim's token, also given to the deletion: a fresh one per drop, so that a drop whose claim was not
    # inserted (another claim holds the place) never takes that claim for its own.
    owner: UUID
    metadata_location: str | None = None   # only the files this Iceberg metadata reaches (None: all)


@dataclass(frozen=True)
class FileDeletion:
    """A claim on files of a live table that only expired snapshots referenced (table `file_deletions`): recorded
    before the expiry commit, held until the files are deleted. The deletion finds the files from the expired
    snapshots' manifest lists, checking each against the table's snapshots of that moment."""

    claim_id: UUID
    table_id: UUID
    location: str                 # nothing outside it is deleted
    manifest_lists: list[str]     # the expired snapshots'
    owner: UUID                   # only the claim's owner renews or ends it; a take-over gives a fresh one


@dataclass
class TableWrite:
    """One table's part of a write group: a compare-and-set of its row, plus its new commit-log rows.

    `expected_version` is the row_version the actor validated against; the row becomes `expected_version +
    bump`. `insert` creates the row instead (the CAS is then the unique name); `delete` removes it.
    """

    table_id: UUID
    expected_version: int
    epoch: int
    state: dict[str, Any] | None = None
    bump: int = 1
    log: list[LogEntry] = field(default_factory=list)
    log_delete: list[tuple[int, int]] = field(default_factory=list)   # [start, end) version ranges
    insert: TableRow | None = None
    delete: bool = False
    rename: tuple[str, str, str] | None = None                         # (catalog, namespace, name)
    relocate: str | None = None   # the table's new location (Iceberg set-location): still exclusive, re-keyed
    purge: PurgeClaim | None = None   # with `delete`: the location whose files will be deleted, claimed until then
    events: list[EventRecord] = field(default_factory=list)   # the commit feed's, written only if this applies

    @property
    def new_version(self) -> int:
        return self.expected_version + self.bump

    @property
    def is_simple(self) -> bool:
        """The hot path: a CAS update plus log inserts, written set-based with everyone else's."""
        return (self.insert is None and not self.delete and self.rename is None and not self.log_delete
                and self.relocate is None)

    def applied_at(self, row_version: int | None) -> bool:
        """Whether the table's row, read at `row_version` (None: no row) after this write's outcome was lost,
        shows it applied. Sound only while nobody else can write the row (its actor still waits on this write,
        or the writer's lease epoch is fenced out)."""
        return row_version is None if self.delete else row_version == self.new_version


@dataclass
class WriteGroup:
    """An all-or-nothing unit: one actor's batch, or every table of one multi-table transaction."""

    writes: list[TableWrite]
    idempotency: list[IdempotencyRecord] = field(default_factory=list)

    @property
    def is_simple(self) -> bool:
        return len(self.writes) == 1 and self.writes[0].is_simple


class Refusal(enum.Enum):
    """Why a write group applied nothing (its compare-and-set did not hold)."""

    STALE = "stale"                  # the row is not at the expected version (or an interrupted write did not apply)
    FENCED = "fenced"                # the writer's shard lease moved to a new epoch
    NAME_TAKEN = "name-taken"        # an inserted or renamed row's name exists
    NO_NAMESPACE = "no-namespace"    # an inserted or renamed row's namespace does not exist
    LOCATION_TAKEN = "location-taken"  # an inserted or moved row's location overlaps another's


@dataclass
class WriteResult:
    applied: bool
    refusal: Refusal | None = None   # when not applied


@dataclass(frozen=True)
class ShardLeaseRow:
    """A shard's lease row as read in a lease round (coordinator/cluster/leases.py): who owns it, under which
    epoch, where to reach them, and its age by the database's clock."""

    shard: int
    owner: UUID | None
    epoch: int
    address: str | None   # the owner's internal-channel address (its member row), if it has one
    live: bool            # not expired when read
    orphaned: bool        # expired for longer than a whole ttl: its owner is gone


@dataclass(frozen=True)
class LeaseRound:
    """What one member's lease round found, all in one transaction-free pass on one connection."""

    renewed: dict[int, int]        # shard -> epoch of every lease this member held and renewed
    live_members: int              # members whose heartbeat is within the ttl (this one included)
    shards: list[ShardLeaseRow]    # every shard's lease, in shard order


Position = tuple[int, int]   # (xid, seq): everything at or before it has been read


@dataclass(frozen=True)
class StoredEvent:
    position: Position
    id: UUID
    type: str
    subject: str
    catalog: str
    securable: str
    data: dict[str, Any]
    time: datetime


@dataclass(frozen=True)
class FeedScope:
    """The events a feed reader may see, by their `securable` keys: all of them, those of the tables named (a key
    each), and those within the containers named (a key each, ending in "/": every key that starts with it). The
    store applies it in its query, so that what a reader is answered never depends on events it may not see."""

    everything: bool = False
    tables: tuple[str, ...] = ()
    containers: tuple[str, ...] = ()

    @property
    def nothing(self) -> bool:
        return not (self.everything or self.tables or self.containers)

    def sees(self, securable: str) -> bool:
        return self.everything or securable in self.tables or securable.startswith(self.containers)


EVERYTHING = FeedScope(everything=True)   # a reader with every grant, or any reader without authentication


@dataclass(frozen=True)
class EventPage:
    events: list[StoredEvent]
    horizon: int        # the snapshot's xmin: every event below it is final
    next_xid: int       # the snapshot's xmax: no transaction has an id at or above it yet (a token above it is not ours)
    floor: Position     # retention deleted everything at or before this
    pending: bool       # committed events exist at or above the horizon (visible soon)
