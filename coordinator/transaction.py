"""Commits that span several tables, or create one: every part decided by its table's owner, then one commit.

Iceberg `transactions/commit`, Lance `batch-commit`, a cross-format commit and a single table's creation all run
here. Each named table's actor decides its part against its own state and holds the table (it stops serving)
until the outcome is known (`Participant`); the tables the commit creates have no actor yet (`NewTable`). Then
every part goes down the one commit path (coordinator/commit.py) as ONE commit, and every actor takes the
outcome. Actors are taken in a canonical order (by table id), so two overlapping commits can never wait for each
other in a cycle: a commit only ever waits for actors that sort after every actor it holds.

In a cluster the same steps run across members (coordinator/cluster/routing.py): a part whose table another
member owns is decided and held there, this member writes every row in its one database transaction, the
decision point, and sends each owner the verdict. Each row's write carries its owner's lease epoch, so a part
whose owner lost its lease meanwhile applies nothing. The parts' published files are written here once that
transaction committed, before any verdict: an owner's clean-up after an applied verdict may remove what would
restore them.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol
from uuid import UUID

from storage.interface import Files, Store
from storage.records import IdempotencyRecord, TableRow, TableWrite

from . import commit, events
from .mailbox import Participant
from .commit import Commit, Part, written_row
from .decision import NewTable, Proposal
from .errors import BadRequest, CoordinatorError, Unpublished
from .keys import new_key


class Owners(Protocol):
    """Who decides each part, and where the commit is written (the registry)."""

    store: Store
    files: Files

    async def prepare(self, table_id: UUID, participant: Participant) -> tuple[Any, Part]: ...
    def insert_epoch(self, table_id: UUID) -> int: ...
    def securable(self, kind: str) -> events.Securable: ...
    def created(self, new: NewTable, row: TableRow, *, complete: bool) -> None: ...


Receipt = IdempotencyRecord | Callable[[list[Any]], IdempotencyRecord] | None


async def transact(owners: Owners, parts: list[tuple[UUID, Proposal]], *, creates: list[NewTable] = (),
                   idempotency: Receipt = None) -> list[Any]:
    """Apply every part and create every table atomically, or nothing. Returns the parts' replies in the order
    given. Raises the first refusal (nothing applied; a part's own refusal carries its index as `part`),
    Unavailable, Unpublished (applied) or OutcomeUnknown.

    `idempotency` is the record written with the commit, or a function that makes it from the parts' replies (in
    the order given), for an answer that names what the parts made (a cross-format commit's results)."""
    ids = [tid for tid, _ in parts] + [c.row.table_id for c in creates]
    if len(set(ids)) != len(ids):
        raise BadRequest("a transaction may name each table only once")
    order = sorted(range(len(parts)), key=lambda i: parts[i][0])
    prepared: dict[int, tuple[Any, Part]] = {}
    # Every participant offered gets a verdict, even one whose answer we never waited for (cancelled): its actor
    # holds its table until it hears one.
    offered: list[Participant] = []
    error: CoordinatorError | None = None
    try:
        for i in order:
            table_id, proposal = parts[i]
            participant = Participant(proposal)
            offered.append(participant)
            try:
                prepared[i] = await owners.prepare(table_id, participant)
            except CoordinatorError as exc:
                exc.part = i
                raise
        commit_id = new_key()   # the commit feed's events of every part carry it
        for i in order:
            events.share_commit_id(prepared[i][1].write.events, commit_id)
        new_parts = [Part(TableWrite(table_id=c.row.table_id, expected_version=0,
                                     epoch=owners.insert_epoch(c.row.table_id), state=c.row_state, bump=1,
                                     log=list(c.log), insert=c.row,
                                     events=events.records(c.row.table_id, (c.row.catalog, c.row.namespace,
                                                                            c.row.name), c.changes,
                                                           owners.securable(c.row.format), commit_id)),
                          list(c.files), list(c.published))
                     for c in creates]
        if callable(idempotency):
            idempotency = idempotency([prepared[i][0] for i in range(len(parts))])
        await commit.write(Commit([prepared[i][1] for i in order] + new_parts, [idempotency] if idempotency else []),
                           owners.store, owners.files)
    except Unpublished as exc:
        error = exc   # applied: each owner restores its published files before any clean-up
    except BaseException as exc:
        for participant in offered:
            participant.verdict.decide(False, exc if isinstance(exc, CoordinatorError) else None)
        raise
    for participant in offered:
        participant.verdict.decide(True, error)
    for c, p in zip(creates, new_parts):
        owners.created(c, written_row(None, p.write), complete=error is None)
    if error is not None:
        raise error
    return [prepared[i][0] for i in range(len(parts))]
