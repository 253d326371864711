"""What a format hands the commit machinery: proposals, their decisions, and the tables a commit creates.

A format's commit rules are `Proposal.decide(state) -> Decision`, pure functions of a table's in-memory state:
that is what lets an actor re-decide after a reload, and a commit of several tables decide every part before
any is written. This module holds only those shared value types; it imports nothing of the coordinator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol
from uuid import UUID

from storage.files import FileWrite
from storage.records import IdempotencyRecord, LogEntry, PurgeClaim, TableRow


@dataclass(frozen=True)
class Change:
    """What the commit feed says about a change once it applied: the event's type (`<format>.table.committed`,
    ...) and its format's data (at least `format` and `version`). The commit path adds the table's id and name
    and the commit's id (coordinator/events.py)."""

    type: str
    data: dict[str, Any]


@dataclass
class Decision:
    """What one request decided against a table's state.

    `row_state` set (or `delete`/`rename`/`log`/`log_delete`) means a write: the table row's `state` becomes
    `row_state` and the log rows are appended. No write means a read or a no-op, answered from `state`.

    `files` have names no other commit uses (a stale writer leaves only an orphan), so they are written before
    the row. `published` files have fixed names (Lance's `_versions/N.manifest`): only the database may decide
    who writes them, so they are written once it accepted the row, before anyone is told. It records one commit
    per name (Lance: version N once), so every writer of a name writes the same bytes: a late write by a process
    that committed and then froze is harmless. The format's loader restores them if the process dies in between.
    """

    state: Any
    reply: Any = None
    row_state: dict[str, Any] | None = None
    log: list[LogEntry] = field(default_factory=list)
    log_delete: list[tuple[int, int]] = field(default_factory=list)
    delete: bool = False
    rename: tuple[str, str, str] | None = None
    relocate: str | None = None   # the table moves (Iceberg set-location): its row's location follows
    purge: PurgeClaim | None = None   # with `delete`: `after_durable` deletes its location; claimed until it has
    files: list[tuple[str, bytes]] = field(default_factory=list)       # made durable before the row
    published: list[FileWrite] = field(default_factory=list)   # made durable after it, before replies
    idempotency: IdempotencyRecord | None = None
    after_durable: Callable[[], Awaitable[None]] | None = None         # best-effort clean-up (old files)
    marker: IdempotencyRecord | None = None   # a forwarded request's receipt (coordinator/cluster/routing.py)
    changes: list[Change] = field(default_factory=list)   # the commit feed's events, in order

    @property
    def writes(self) -> bool:
        return (self.row_state is not None or self.delete or self.rename is not None or bool(self.log)
                or bool(self.log_delete))

    @property
    def is_simple(self) -> bool:
        return not (self.delete or self.rename is not None or self.log_delete)


class Proposal(Protocol):
    """A request for one table. `decide` must be pure: it may not change `state` or anything reachable from it,
    and it raises a CoordinatorError to reject."""

    def decide(self, state: Any) -> Decision: ...

class Loader(Protocol):
    async def __call__(self, row: TableRow) -> Any: ...


@dataclass(frozen=True)
class Compaction:
    """How a format keeps an idle table small (e.g. Iceberg: the metadata file's bytes, not the parsed dict)."""

    compact: Callable[[Any], Any]
    expand: Callable[[TableRow, Any], Any]


KEEP_STATE = Compaction(compact=lambda state: state, expand=lambda row, state: state)


@dataclass
class NewTable:
    """A table that a commit creates (it has no actor yet): its row, in-memory state and first files."""

    row: TableRow
    state: Any
    row_state: dict[str, Any]
    log: list[LogEntry] = field(default_factory=list)
    files: list[tuple[str, bytes]] = field(default_factory=list)
    published: list[FileWrite] = field(default_factory=list)   # as Decision.published
    changes: list[Change] = field(default_factory=list)        # as Decision.changes


@dataclass
class PlannedPart:
    """One table's part of a commit that spans tables, as its format's service prepared it (the name resolved,
    files it needs read): the proposal the table's actor decides, and how the actor's reply becomes the part's
    answer."""

    table_id: UUID
    proposal: Proposal
    answer: Callable[[Any], Any]
