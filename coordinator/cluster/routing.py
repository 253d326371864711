"""Routing: any member accepts any request and hands the parsed request to the table's owner.

The HTTP work (parse, authenticate, validate, resolve the name, build the proposal) happens on the member the
client reached; the proposal goes to the owner of the table's shard: this member's own actor, or a peer's over
the internal channel (channel.py), where it enters the same actor path. Owner-side handlers are `on_*` below.

When the owner cannot answer (killed, paused, partitioned, or stopping), a request that reached it has an unknown
outcome until its lease moves to a new epoch: from then on the former owner can apply nothing (every write checks
the lease's epoch). So the forwarding member waits for the shard's epoch to move, then reads whether the request's
receipt (`marker`, written in the same statement as its change) exists: present means applied (answered as such);
absent means known not applied, so the request goes to the shard's next owner, within `cluster_route_wait_s` of
its arrival (past that: 503 + Retry-After, nothing applied). An owner that answers NotOwner (its lease moved, or
it is handing its shards over as it stops) applied nothing either: the request is sent again once the lease map
shows the next owner. A rolling restart thus shows clients latency, not errors.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

import trio

from storage.records import IdempotencyRecord, TableWrite, shard_of

from ..mailbox import Participant
from ..commit import Part
from ..decision import Decision, NewTable, Proposal
from ..errors import AppliedReplyLost, CoordinatorError, NotOwner, OutcomeUnknown, Unavailable, Unpublished
from .channel import AnswerLost, PeerUnreachable

log = logging.getLogger(__name__)

MARKER_ROUTE = "cluster-forward"
NOT_APPLIED = object()   # a resolver's word that a lost request applied nothing: send it to the next owner


@dataclass
class Marked:
    """A forwarded proposal: if it writes, its write also records `marker` (a receipt the sender can look up)."""

    proposal: Proposal
    marker: UUID

    @property
    def idempotency_key(self) -> Any:
        """The forwarded proposal's own key: the owner checks it before deciding, as for a local request."""
        return getattr(self.proposal, "idempotency_key", None)

    def decide(self, state: Any) -> Decision:
        decision = self.proposal.decide(state)
        if decision.writes:
            decision.marker = IdempotencyRecord(self.marker, MARKER_ROUTE, 0, None)
        return decision


class Member(Protocol):
    """What the router needs of the cluster member it routes for (coordinator/cluster/cluster.py)."""

    registry: Any
    leases: Any
    config: Any
    member_id: UUID
    nursery: trio.Nursery | None

    def peer(self, address: str) -> Any: ...
    async def call_watching(self, peer: Any, shard: int, member: UUID, method: str, *args: Any) -> Any: ...


class Router:
    def __init__(self, cluster: Member):
        self.cluster = cluster
        self.registry = cluster.registry
        self.leases = cluster.leases
        self.config = cluster.config
        # txid -> (participant, its write, whether it publishes files) of parts held here for another member
        self.prepared: dict[UUID, tuple[Participant, TableWrite, bool]] = {}
        self.forwarded = 0

    # -- the sending side --------------------------------------------------------------------------------------

    async def submit(self, table_id: UUID, proposal: Proposal) -> Any:
        marker = uuid.uuid4()

        async def resolve() -> Any:
            if await self.registry.store.get_idempotency(marker) is None:
                return NOT_APPLIED
            raise AppliedReplyLost(f"the owner of table {table_id} applied the request but failed before answering")

        return await self._route(table_id, lambda: self.registry.owner(table_id).offer(proposal).wait(),
                                 "submit", (table_id, proposal, marker), resolve)

    async def create(self, new: NewTable, idempotency: IdempotencyRecord | None) -> None:
        row = new.row
        args = (new, idempotency)

        async def resolve() -> Any:
            found = await self.registry.store.get_table(row.table_id)
            if found is None or (found.realm, found.catalog, found.namespace, found.name) != \
                    (row.realm, row.catalog, row.namespace, row.name):
                return NOT_APPLIED
            return None

        return await self._route(row.table_id, lambda: self.registry.create_local(*args), "create", args, resolve)

    async def prepare(self, table_id: UUID, participant: Participant) -> tuple[Any, Part]:
        """A transaction's part at the table's owner. A remote owner holds its table until `verdict` arrives;
        its reply and commit part come back (its clean-up hook stays: it runs at the owner once applied). This
        member writes the part's files (published ones once its transaction applied, before the verdict)."""
        txid = uuid.uuid4()

        async def resolve() -> Any:
            # Nothing is written before every part is prepared: the transaction is known not applied. The owner
            # settles its hold by itself (on_prepare's deadline).
            return NOT_APPLIED

        via: list = []
        answer = await self._route(table_id, lambda: self.registry.owner(table_id).offer(participant).wait(),
                                   "prepare", (txid, table_id, participant.proposal), resolve, via=via)
        if via:
            self.cluster.nursery.start_soon(self._send_verdict, via[0], txid, participant)
        return answer

    async def _send_verdict(self, peer, txid: UUID, participant: Participant) -> None:
        await participant.verdict.event.wait()
        try:
            await peer.call("verdict", txid, participant.verdict.applied, participant.verdict.error)
        except (CoordinatorError, AnswerLost) as exc:
            # The owner settles by itself from the database (on_prepare): a lost verdict delays, never corrupts.
            log.warning("verdict for transaction %s not delivered: %s", txid, exc)

    def created(self, table_id: UUID) -> None:
        """A transaction created a table: the owner of its shard may hold an actor that believes it gone."""
        shard = shard_of(table_id)
        if self.leases.epoch(shard) is not None:
            self.registry.forget(table_id)
            return
        owner = self.leases.owner(shard)
        if owner is not None and owner.address and owner.member != self.cluster.member_id:
            peer = self.cluster.peer(owner.address)

            async def tell() -> None:
                try:
                    await peer.call("forget", table_id)
                except (CoordinatorError, AnswerLost):
                    pass
            self.cluster.nursery.start_soon(tell)

    async def _route(self, table_id: UUID, local, method: str, args: tuple, resolve, *, via: list | None = None):
        """Run `local()` if this member owns the table's shard, else `method(*args)` at the owner (appending the
        peer to `via`); retry while the shard moves, up to cluster_route_wait_s; resolve lost answers (`resolve()`:
        the outcome, or NOT_APPLIED, and then the request goes to the next owner)."""
        shard = shard_of(table_id)
        deadline = trio.current_time() + self.config.cluster_route_wait_s
        while True:
            if self.leases.epoch(shard) is not None:
                try:
                    return await local()
                except NotOwner:
                    pass  # the lease lapsed between the check and the actor: nothing applied
            else:
                owner = self.leases.owner(shard)
                if owner is not None and owner.live and owner.address and owner.member != self.cluster.member_id:
                    peer = self.cluster.peer(owner.address)
                    self.forwarded += 1
                    try:
                        result = await self.cluster.call_watching(peer, shard, owner.member, method, *args)
                        if via is not None:
                            via.append(peer)
                        return result
                    except (NotOwner, PeerUnreachable):
                        pass  # our map is stale, or the owner is gone before we sent: nothing applied
                    except AnswerLost:
                        await self._await_move(shard, owner.epoch)
                        outcome = await resolve()
                        if outcome is not NOT_APPLIED:
                            return outcome
                        log.info("the owner of shard %d (epoch %d) applied nothing before its lease moved; "
                                 "sending the request to the next owner", shard, owner.epoch)
            if trio.current_time() >= deadline:
                raise Unavailable(f"table {table_id}'s shard {shard} has no reachable owner right now (it is "
                                  f"moving between members); nothing applied, retry",
                                  retry_after_s=self.config.retry_after_s)
            with trio.move_on_after(max(deadline - trio.current_time(), 0)):
                await self.leases.next_round()

    async def _await_move(self, shard: int, epoch: int) -> None:
        """Wait until `shard`'s lease is past `epoch` (taken over): from then on nothing under `epoch` applies, so
        the store is final. (A lease merely released keeps its epoch: a write already sent under it may still
        land, and the takeover's row lock waits for that write to end.)"""
        with trio.move_on_after(self.config.lease_ttl_s * 3 + 5):
            while True:
                owner = self.leases.owner(shard)
                if owner is not None and owner.epoch > epoch:
                    return
                await self.leases.next_round()
        raise OutcomeUnknown(f"shard {shard}'s owner stopped answering but still holds its lease; outcome unknown")

    # -- the owner's side (called by peers over the channel) -----------------------------------------------------

    async def on_submit(self, table_id: UUID, proposal: Proposal, marker: UUID) -> Any:
        reply = await self.registry.owner(table_id).offer(Marked(proposal, marker)).wait()
        # A proposal may say what of its reply the forwarding member needs (Lance's ReadTable: the latest versions)
        cut = getattr(proposal, "reply_for_peer", None)
        return reply if cut is None else cut(reply)

    async def on_create(self, *args) -> None:
        await self.registry.create_local(*args)

    async def on_prepare(self, txid: UUID, table_id: UUID, proposal: Proposal) -> tuple[Any, Part]:
        participant = Participant(proposal)
        reply, part = await self.registry.owner(table_id).offer(participant).wait()
        self.prepared[txid] = (participant, part.write, bool(part.published))
        self.cluster.nursery.start_soon(self._settle_if_abandoned, txid, table_id)
        return reply, part

    async def on_verdict(self, txid: UUID, applied: bool, error: CoordinatorError | None) -> None:
        entry = self.prepared.pop(txid, None)
        if entry is not None:
            entry[0].verdict.decide(applied, error)

    async def on_forget(self, table_id: UUID) -> None:
        self.registry.forget(table_id)

    async def _settle_if_abandoned(self, txid: UUID, table_id: UUID) -> None:
        """The transaction's member fell silent while we hold the table: fence it out by moving our own lease to
        a new epoch (its write, carrying the old one, can then apply nothing), then read the row to learn
        whether its write got in first."""
        with trio.move_on_after(self.config.cluster_prepare_timeout_s):
            entry = self.prepared.get(txid)
            if entry is None:
                return
            await entry[0].verdict.event.wait()
            return
        entry = self.prepared.pop(txid, None)
        if entry is None:
            return
        participant, write, publishes = entry
        shard = shard_of(table_id)
        try:
            await self.leases.bump(shard, write.epoch)
            row = await self.registry.store.get_table(table_id)
            applied = write.applied_at(None if row is None else row.row_version)
            log.warning("transaction %s abandoned by its member: settled %s from the store", txid,
                        "applied" if applied else "not applied")
            error = None if applied else Unavailable("transaction abandoned")
            if applied and publishes:
                # Its member may have died before writing our part's published files: the actor restores them
                # (if missing) before its clean-up.
                error = Unpublished("transaction abandoned after it applied")
            participant.verdict.decide(applied, error)
        except Exception as exc:
            # Cannot tell: stop serving the shard; the next owner loads the table from the store.
            log.error("cannot settle abandoned transaction %s: %s", txid, exc)
            self.leases.lost(shard, write.epoch)
            participant.verdict.decide(False, Unavailable("transaction abandoned"))

