"""What the coordinator uses of storage, as typed interfaces: the store (table rows, the commit log, namespaces,
idempotency records, purge claims, the signing key, the cluster's leases) and the file IO.

`PostgresStore` and `FileIO` satisfy these structurally (tests/test_storage_interface.py checks every method and
its parameters); another store, e.g. on a PostgreSQL-compatible distributed database, would implement `Store`.
Types are `storage.records` dataclasses and builtins only. Errors are `storage.errors` classes only: every store
method may raise StoreUnavailable (the database could not be reached: known not applied, safe to retry).

Namespaces and tables live in realms (one or more a format: coordinator/format.py) and catalogs; a namespace is a
path of levels joined by `records.NAMESPACE_SEP`.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol
from uuid import UUID

from .localfs import FileWrite
from .records import (EVERYTHING, EventPage, FeedScope, FileDeletion, IdempotencyRecord, LeaseRound, LogEntry,
                      Position, ReportTable, TableRow, WriteGroup, WriteResult)


class TableRows(Protocol):
    """Table rows and their commit logs."""

    async def write(self, group: WriteGroup) -> WriteResult:
        """Write a group all-or-nothing: each table's row compare-and-set on its expected version (and, fenced,
        its shard lease's epoch), its commit-log rows, and the group's idempotency records, in one transaction.
        A refused group applies nothing and says why (`WriteResult.refusal`). Raises StoreUnavailable (known
        not applied) or OutcomeLost (sent, result lost: it may have applied)."""

    async def find_table(self, realm: str, catalog: str, namespace: str, name: str) -> TableRow | None:
        """The row named so, or None."""

    async def get_table(self, table_id: UUID) -> TableRow | None:
        """The row of `table_id`, or None."""

    async def settled_row_version(self, table_id: UUID) -> int | None:
        """The row's version once no transaction is writing it (waits for an interrupted writer to end), or None
        if there is no row: final, for resolving a lost outcome."""

    async def list_tables(self, realm: str, catalog: str, namespace: str | None, *, kind: str | None = None,
                          after: str | None = None, limit: int | None = None) -> list[TableRow]:
        """Rows of one namespace (all, when None), of `kind` if given, ordered by (namespace, name), after the
        cursor `after` (`TableRow.cursor`), at most `limit`."""

    async def location_taken(self, location: str, exclude: UUID | None = None, *, purges: bool = True,
                             below: bool = True) -> bool:
        """Whether a row other than `exclude` lives at, above or (`below`) below `location`, or (`purges`) a
        dropped table's files there are still being deleted. A check ahead of a write; the write checks again
        atomically (`Refusal.LOCATION_TAKEN`)."""

    async def list_catalogs(self, realm: str) -> list[str]:
        """The catalogs of `realm` that hold a namespace or a table, in order."""

    async def read_log(self, table_id: UUID, *, start: int = 0, end: int | None = None, limit: int | None = None,
                       descending: bool = False) -> list[LogEntry]:
        """Commit-log entries with start <= version <= end, in version order (or reversed), at most `limit`."""

    async def count_log(self, table_id: UUID, ranges: list[tuple[int, int]], *, below: int,
                        excluding: list[tuple[int, int]] = ()) -> int:
        """How many entries below version `below` lie in one of the [start, end) `ranges` (end < 0: through the
        latest) and in none of the `excluding` ranges."""

    # Metric reports kept beside a table, in its format's table of them (`ReportTable`).
    async def add_report(self, table: ReportTable, table_id: UUID, key: str | int, report: dict, keep: int) -> None:
        """Keep a metrics report under `key` (`ReportTable.key`), and the table's newest `keep` (this one among
        them); only while the table's row exists if `table.while_table_exists`."""

    async def delete_reports(self, table: ReportTable, table_id: UUID) -> None:
        """Forget a table's reports."""

    async def purge_reports(self, tables: list[ReportTable], older_than_s: float) -> int:
        """Forget every report in `tables` older than `older_than_s`; returns how many."""


class Namespaces(Protocol):
    """Namespace rows: each a path with string properties. Every change is one transaction, with its idempotency
    record if given."""

    async def create_namespace(self, realm: str, catalog: str, path: str, properties: dict[str, str],
                               idempotency: IdempotencyRecord | None = None, *,
                               parent: tuple[str, str, str] | None = None) -> None:
        """Create it. Raises NamespaceExists; NamespaceMissing if `parent` (realm, catalog, path) does not exist
        (it is share-locked until this commits: a concurrent drop of it sees the child, or comes first)."""

    async def get_namespace(self, realm: str, catalog: str, path: str) -> dict[str, str] | None:
        """Its properties, or None if it does not exist."""

    async def list_namespaces(self, realm: str, catalog: str, parent: str | None, *, after: str | None = None,
                              limit: int | None = None, recursive: bool = False) -> list[str]:
        """Paths directly (or, `recursive`, at any depth) under `parent` (None or "": the top), ordered, after
        `after`, at most `limit`."""

    async def update_namespace_properties(self, realm: str, catalog: str, path: str, removals: list[str],
                                          updates: dict[str, str],
                                          idempotency: IdempotencyRecord | None = None) -> dict[str, str]:
        """Remove then set properties atomically; returns those before. Raises NamespaceMissing."""

    async def drop_namespace(self, realm: str, catalog: str, path: str, *, cascade: bool = False,
                             idempotency: IdempotencyRecord | None = None, children_realm: str = "") -> None:
        """Drop it. Raises NamespaceMissing; NamespaceNotEmpty if it holds tables or namespaces (or, with
        `children_realm`, namespaces of that realm whose catalog is `path`). `cascade` drops the namespaces below
        it too but never a table: one found there raises NamespaceRefilled and nothing is dropped."""


class IdempotencyRecords(Protocol):
    async def get_idempotency(self, key: UUID) -> IdempotencyRecord | None:
        """The answer recorded under `key`, or None."""

    async def put_idempotency(self, record: IdempotencyRecord) -> None:
        """Record an answer; a key already recorded keeps its first answer."""

    async def purge_idempotency(self, older_than_s: float) -> int:
        """Forget records older than `older_than_s`; returns how many."""


class PurgeClaims(Protocol):
    """Claims on dropped tables' locations (written by a `TableWrite.purge`), held until their files are deleted.
    Only a claim's owner (its token) renews or ends it."""

    async def pending_purges(self, older_than_s: float = 0) -> list[str]:
        """Locations claimed and not renewed for `older_than_s`, oldest first."""

    async def take_over_purge(self, location: str, older_than_s: float) -> UUID | None:
        """Atomically take over a claim nobody renewed for `older_than_s`: the new owner token for exactly one
        caller (of any member), None for the others."""

    async def confirm_purge(self, location: str, owner: UUID | None) -> tuple[bool, str | None]:
        """Whether the claim is still `owner`'s (renewed if so), and the metadata file whose reachable files alone
        are to be deleted (None: the whole location)."""

    async def renew_purge(self, location: str, owner: UUID | None) -> bool:
        """Renew the claim; False if it is no longer `owner`'s."""

    async def end_purge(self, location: str, owner: UUID | None) -> None:
        """End `owner`'s claim: the location is free for a new table."""


class FileDeletions(Protocol):
    """Claims on files of live tables that only expired snapshots referenced (`records.FileDeletion`), held until
    the files are deleted (storage/deletions.py). Only a claim's owner renews or ends it."""

    async def record(self, claim: FileDeletion) -> None:
        """Record a claim (before the expiry commit that makes its files unreferenced)."""

    async def pending(self, older_than_s: float = 0) -> list[FileDeletion]:
        """Claims nobody renewed for `older_than_s`, oldest first."""

    async def take_over(self, claim_id: UUID, older_than_s: float) -> UUID | None:
        """Atomically take over a claim nobody renewed for `older_than_s`: the new owner token for exactly one
        caller (of any member), None for the others."""

    async def renew(self, claim_id: UUID, owner: UUID) -> bool:
        """Renew the claim; False if it is no longer `owner`'s."""

    async def end(self, claim_id: UUID, owner: UUID) -> None:
        """End `owner`'s claim: its files are deleted (or kept for good)."""


class Leases(Protocol):
    """The cluster's shard leases and member rows, by the database's clock only (storage/leases.py)."""

    async def renew(self, member_id: UUID, address: str, ttl_s: float) -> LeaseRound:
        """Heartbeat the member, extend the leases it holds by `ttl_s`, read live members and every shard's lease."""

    async def take(self, member_id: UUID, shards: list[int], ttl_s: float) -> dict[int, int]:
        """Atomically take over those of `shards` whose lease expired, each under a new epoch: shard -> epoch."""

    async def release(self, member_id: UUID, shards: list[int]) -> None:
        """Expire the member's leases of `shards` now."""

    async def bump(self, member_id: UUID, shard: int, epoch: int) -> int | None:
        """Move the member's lease of `shard` from `epoch` to the next (fencing out writes under `epoch`): the new
        epoch, or None if the lease is not the member's at `epoch`."""

    async def leave(self, member_id: UUID) -> None:
        """Release all of the member's leases at once and remove its member row."""


class Events(Protocol):
    """The commit feed: the events the writer inserted with each commit (storage/events.py)."""

    async def read(self, after: Position | None, limit: int, *, formats: list[str] | None = None,
                   subjects: list[str] | None = None, scope: FeedScope = EVERYTHING) -> EventPage:
        """Up to `limit` final events after `after` (None: the oldest kept), in feed order, of those `scope` lets
        through (every event by default), filtered."""

    async def read_shared(self, after: Position, limit: int) -> EventPage:
        """`read` of every event, for all the readers waiting at once (on a connection of its own)."""

    async def prune(self, max_age_s: float, max_count: int) -> int:
        """Delete the events past retention (oldest first), raising the feed's floor; how many went."""


class Store(TableRows, Namespaces, IdempotencyRecords, PurgeClaims, Protocol):
    """The system of record."""

    leases: Leases
    events: Events
    deletions: FileDeletions
    # Called on the store's own thread whenever new events may be readable (the feed sets it to wake readers).
    on_events: Callable[[], None] | None

    def want_events(self, wanted: bool) -> None:
        """Whether readers wait on the feed here (said when the first comes and when the last goes, from any
        thread): with several members, others' commits are listened for only then (storage/events.py `listen`)."""

    def open(self) -> None:
        """Connect and bring the schema up to date (blocking; from the thread that owns the service)."""

    def close(self) -> None:
        """Stop writing and disconnect (blocking)."""

    async def signing_key(self, candidate: bytes) -> bytes:
        """The service's token-signing key: `candidate` if none is stored yet (atomically), else the stored one."""

    async def ping(self) -> None:
        """Return once the database answers; raises StoreUnavailable."""

    def writer_stats(self) -> dict[str, int]:
        """The writer's figures for /metrics (flushes, groups, last_batch, fenced)."""


class Files(Protocol):
    """Table files on local paths (file:// or bare) or object stores (s3://). Awaited from trio; blocking work runs
    in worker threads. A file is durable once written; reads raise FileMissing (no such file) or FileRefused (not
    a regular file, reached through a link, too large, a name too long, or an unserved scheme); other OS or
    object-store errors pass as they are."""

    async def write_many(self, files: list[FileWrite]) -> None:
        """Write each file durably (local: temp file, fsync, rename, directory fsync; a `source` beside it that
        holds the bytes is renamed into place instead). Files are not written atomically as a set: on an error
        some may be in place. With `within` (the table's place), nothing below it is reached through a link."""

    async def read_durable(self, uri: str, within: str) -> bytes:
        """`read`, after making the file durable (a client's staged file a commit will adopt)."""

    async def read(self, uri: str, within: str | None = None) -> bytes:
        """The file's bytes: locally only a regular file reached from `within` (None: its directory) without
        following a link; at most MAX_READ_BYTES; FileUnavailable after READ_TIMEOUT_S."""

    async def reading(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`, blocking reads (`read_within_sync`) and what parses them, on a thread of the read pool; the
        caller bounds its time (it stops waiting when cancelled)."""

    async def delete(self, uri: str, within: str) -> None:
        """Delete one file of the place `within`, if there: refused if its path is not within it; locally no link
        below the warehouse is followed."""

    async def exists(self, uri: str) -> bool:
        """Whether something is at `uri`."""

    async def names_in(self, directory: str) -> set[str]:
        """The names directly in `directory` (none if it does not exist)."""

    async def size(self, uri: str, within: str | None = None) -> int | None:
        """The file's size; None if there is no regular file (or, with `within`, it is reached through a link)."""

    async def age_s(self, uri: str) -> float | None:
        """Seconds since the file was last written; None if it does not exist."""

    async def discard(self, uris: list[str], location: str | None) -> None:
        """Remove files a refused change wrote, then the directories that leaves empty, up to `location`."""

    async def delete_tree(self, location: str, stop: Callable[[], bool] | None = None) -> None:
        """Delete everything under `location` (a purge), best effort, following no link below the warehouse;
        nothing if its path could lead elsewhere. Raises DeletionStopped once `stop()` is true."""

    # For purges that walk a table's metadata in a worker thread:
    def read_within_sync(self, uri: str, within: str | None = None, durable: bool = False,
                         limit: int | None = None) -> bytes:
        """`read`, blocking; `durable`: a local file is fsynced too, through the descriptor it was read by; at most
        `limit` bytes (None: MAX_READ_BYTES, its most)."""

    def delete_listed_sync(self, location: str, uris: list[str], stop: Callable[[], bool] | None = None) -> None:
        """Delete those of `uris` within `location`, then the directories that leaves empty; paths that name no
        file are skipped. Stops as `delete_tree` does."""

    def leads_elsewhere(self, location: str) -> bool:
        """Whether `location`'s local path could lead out of the place its text names (a `..`, a link below the
        warehouse): a purge then deletes nothing."""
