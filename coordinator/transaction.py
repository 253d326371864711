"""Atomic commits across tables (Iceberg `transactions/commit`, Lance `batch-commit`), format-neutral.

Each participating actor validates its part against its own state while holding its next batch (it stops
serving until the outcome is known), the storage writer writes every table's row in ONE database transaction,
then every actor applies or discards. Actors are taken in a canonical order (by table id), so two overlapping
transactions can never wait for each other in a cycle: a transaction only ever waits for actors that sort
after every actor it holds.

In a cluster the same steps run across members (two-phase over the internal channel, coordinator/cluster/
routing.py): a part whose table another member owns is validated and held there (`Registry.prepare`), this
member writes every row in its one database transaction, the decision point, and sends each owner the verdict.
Each row's write carries its owner's lease epoch, so a part whose owner lost its lease meanwhile applies nothing.
The parts' published files (`Decision.published`) are written here once that transaction committed, before any
verdict: an owner's clean-up after an applied verdict may remove what would restore them.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from uuid import UUID

import trio

from storage.errors import StorageError
from storage.records import UNFENCED, IdempotencyRecord, TableWrite, WriteGroup

from .actor import Participant, _not_applied_error
from .decision import Decision, NewTable, Proposal
from .errors import BadRequest, CoordinatorError, Unavailable, Unpublished, from_storage

if TYPE_CHECKING:
    from .registry import Registry

log = logging.getLogger(__name__)


Create = NewTable


async def transact(registry: "Registry", parts: list[tuple[UUID, Proposal]], *, creates: list[Create] = (),
                   idempotency: IdempotencyRecord | None = None) -> list[Any]:
    """Apply every part and create every table atomically, or nothing. Returns the parts' replies in the
    order given. Raises the first rejection (nothing applied), Unavailable, or OutcomeUnknown."""
    ids = [tid for tid, _ in parts] + [c.row.table_id for c in creates]
    if len(set(ids)) != len(ids):
        raise BadRequest("a transaction may name each table only once")
    order = sorted(range(len(parts)), key=lambda i: parts[i][0])
    prepared: dict[int, tuple[Participant, Decision, TableWrite]] = {}
    # Every participant offered gets a verdict, even one whose answer we never waited for (cancelled): its
    # actor holds its table until it hears one.
    offered: list[Participant] = []
    try:
        for i in order:
            table_id, proposal = parts[i]
            participant = Participant(proposal)
            offered.append(participant)
            decision, write = await registry.prepare(table_id, participant)
            prepared[i] = (participant, decision, write)
        # Files only once every part is accepted: a transaction rejected by its last table leaves none behind.
        files = [f for i in order for f in prepared[i][1].files] + [f for c in creates for f in c.files]
        try:
            await registry.files.write_many(files)
        except (CoordinatorError, StorageError):
            raise
        except Exception as exc:
            raise Unavailable(f"could not write table files: {exc}") from exc
        writes = [prepared[i][2] for i in order]
        # A table created here has no owner yet: its insert is not fenced (the unique name is its compare-and-set).
        create_epoch = 0 if registry.cluster is None else UNFENCED
        writes += [TableWrite(table_id=c.row.table_id, expected_version=0, epoch=create_epoch, state=c.row_state,
                              bump=1, log=list(c.log), insert=c.row) for c in creates]
        group = WriteGroup(writes, [idempotency] if idempotency else [])
        with trio.CancelScope(shield=True):
            result = await registry.store.write(group)
    except BaseException as exc:
        error = from_storage(exc) if isinstance(exc, (CoordinatorError, StorageError)) else None
        for participant in offered:
            participant.verdict.decide(False, error)
        raise
    if not result.applied:
        error = _not_applied_error(writes[0].table_id, result.refusal)
        for participant, _, _ in prepared.values():
            participant.verdict.decide(False, error)
        raise error
    published = [f for i in order for f in prepared[i][1].published] + [f for c in creates for f in c.published]
    unpublished = None
    try:
        with trio.CancelScope(shield=True):
            await registry.files.write_many(published)
    except Exception as exc:
        # Applied, but some published file is missing. Each owner restores its own before any clean-up (see
        # TableActor._take_part); a created table is not adopted, so that its first load restores them.
        log.error("transaction recorded but its files could not be written: %s", exc)
        unpublished = Unpublished(f"the commit was recorded but its files could not be written yet ({exc}); retry")
    for participant, _, _ in prepared.values():
        participant.verdict.decide(True, unpublished)
    for c in creates:
        if registry.cluster is not None:
            registry.cluster.router.created(c.row.table_id)
        elif unpublished is None:
            registry.adopt(replace(c.row, row_version=1, state=c.row_state), c.state)
    if unpublished is not None:
        raise unpublished
    return [prepared[i][1].reply for i in range(len(parts))]
