"""The table actor: one trio task per active table, the only place a table's commits are sequenced.

It takes everything queued in its mailbox (a batch), decides each request against the in-memory state in
arrival order (each sees the effect of those before it), and makes the batch's accepted changes one part of a
commit (coordinator/commit.py, the one path every commit takes); it answers only once that is durable. A
rejected request is answered at once and never fails the others. If the write fails, nobody in the batch hears
"success" and the actor reloads its state from the store before serving again.

A part of a commit that spans several tables (a `Participant`) is decided here in the same way, against the same
state, and the table is held until that commit's outcome is known; then the actor takes the outcome into memory
exactly as it does its own batches' (`_conclude`).

Commit rules live in the formats' modules as `Proposal.decide(state) -> Decision`, pure functions of the state:
that is what lets the actor re-decide after a reload, and a multi-table commit decide every part before any is
written. The actor knows its registry only as a `Host`: it does not import it.
"""

from __future__ import annotations

import contextvars
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol
from uuid import UUID

import trio

from storage.errors import StorageError
from storage.files import file_write
from storage.interface import Files, Store
from storage.records import TableRow, TableWrite

from . import commit, events
from .commit import Commit, Part, written_row
from .config import Config
from .decision import Decision, Proposal
from .errors import (AlreadyExists, BadRequest, CommitConflict, CoordinatorError, DuplicateRequest, NoSuchTable, NotFound,
                     NotOwner, OutcomeUnknown, Unavailable, Unpublished, from_storage)

log = logging.getLogger(__name__)

RELOAD_INTERVAL_S = 1.0   # see _decide: reloads a rejection asks for
RECENT_KEYS = 64  # Idempotency-Keys remembered per table actor (see TableActor.recent_keys)
# A commit refused for what it asked (not for the store's state): the table's memory is still right, no reload.
REFUSALS = (CommitConflict, BadRequest, NotFound, AlreadyExists)

# The commit the current request's task was last told applied: (format, table name, version). Set by `Reply.wait`
# in the requester's task, so the HTTP layer can log what a request committed.
COMMITTED: contextvars.ContextVar[tuple[str, str, int] | None] = contextvars.ContextVar("committed", default=None)


class Host(Protocol):
    """What an actor needs of the registry that runs it."""

    config: Config
    store: Store
    files: Files

    async def load_state(self, row: TableRow) -> Any: ...
    def retire(self, actor: "TableActor") -> bool: ...
    def serving(self, actor: "TableActor") -> bool: ...
    def lease_lost(self, actor: "TableActor") -> None: ...
    def spawn_background(self, fn: Callable[[], Awaitable[None]]) -> None: ...
    def written(self, table_id: UUID, fmt: str, state: Any) -> None: ...
    def observe_batch(self, size: int) -> None: ...
    def observe_commit(self, fmt: str, outcome: str, seconds: float | None) -> None: ...


class Reply:
    """A one-shot answer slot the requester awaits."""

    __slots__ = ("_event", "value", "error", "committed")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.committed: tuple[str, str, int] | None = None  # set with the value of an applied commit

    def set(self, value: Any) -> None:
        if not self._event.is_set():
            self.value = value
            self._event.set()

    def fail(self, error: BaseException) -> None:
        if not self._event.is_set():
            # The requester raises it afresh; the actor's frames in its traceback would only be kept alive.
            self.error = error.with_traceback(None)
            self._event.set()

    async def wait(self) -> Any:
        await self._event.wait()
        error = self.error
        if error is None:
            if self.committed is not None:
                COMMITTED.set(self.committed)
            return self.value
        # Raised once, then let go: an error kept here (or in this frame) would tie a reference cycle through
        # its traceback, and every rejected commit (409s come by the thousand) would wait for the cyclic GC.
        self.error = None
        try:
            raise error
        finally:
            del error


@dataclass
class Request:
    proposal: Proposal
    reply: Reply = field(default_factory=Reply)
    arrived: float = field(default_factory=time.perf_counter)  # for the commit-latency histogram


class Verdict:
    """The transaction's outcome as seen by one participant: applied, or not (with the error to raise). Applied
    with an Unpublished error: its published files are not written yet."""

    def __init__(self) -> None:
        self.event = trio.Event()
        self.applied = False
        self.error: CoordinatorError | None = None

    def decide(self, applied: bool, error: CoordinatorError | None = None) -> None:
        if not self.event.is_set():
            self.applied, self.error = applied, error
            self.event.set()


@dataclass
class Participant:
    """Sent to an actor's mailbox. The actor answers its reply with (the proposal's reply, its commit `Part`) once
    its part is decided, then waits for `verdict` before serving anything else."""

    proposal: Proposal
    verdict: Verdict = field(default_factory=Verdict)


@dataclass
class _Segment:
    """Consecutive accepted changes of one batch, written as one compare-and-set of the table row."""

    state: Any
    decisions: list[tuple[Request, Decision]] = field(default_factory=list)
    readers: list[tuple[Request, Any]] = field(default_factory=list)
    duplicates: list[tuple[Request, Any]] = field(default_factory=list)  # (request, key) answered once durable
    keys: set[Any] = field(default_factory=set)  # Idempotency-Keys of `decisions`

    @property
    def empty(self) -> bool:
        return not self.decisions

    def add(self, req: Request, decision: Decision) -> None:
        self.decisions.append((req, decision))
        self.state = decision.state
        if decision.idempotency is not None:
            self.keys.add(decision.idempotency.key)

    @property
    def requests(self) -> list[Request]:
        """Everyone waiting for this segment's write."""
        return [r for r, _ in self.decisions] + [r for r, _ in self.readers] + [r for r, _ in self.duplicates]


class TableActor:
    def __init__(self, registry: Host, table_id: UUID, mailbox_size: int, epoch: int | None = None):
        self.registry = registry
        self.table_id = table_id
        self.epoch = epoch                 # the shard lease's epoch this actor serves under (None: no cluster)
        self.send, self.receive = trio.open_memory_channel[Request](mailbox_size)
        self.row: TableRow | None = None   # as last durably written
        self.state: Any = None             # format state matching `row`
        self.loaded = False
        self.loaded_at = 0.0          # monotonic time of the last load from the store
        self.gone = False                  # table dropped or never existed (or moved: then retire)
        self.moved = False                 # the shard's lease moved: this actor retires, answering NotOwner
        self.batches = 0
        self.last_batch_size = 0
        # Idempotency-Keys of the table's latest changes. Requests with one key are serialized by the member
        # that receives them; this catches the same key arriving through two members at once (scale-out).
        self.recent_keys: OrderedDict[Any, None] = OrderedDict()

    # -- requester side --------------------------------------------------------------------------------------

    def offer(self, proposal: Proposal) -> Reply:
        req = Request(proposal)
        try:
            self.send.send_nowait(req)
        except trio.WouldBlock:
            raise Unavailable(f"table {self.table_id} is busy: its mailbox is full; retry shortly",
                              retry_after_s=self.registry.config.retry_after_s) from None
        return req.reply

    # -- the actor's task ------------------------------------------------------------------------------------

    async def run(self) -> None:
        idle_s = self.registry.config.actor_idle_s
        while True:
            with trio.move_on_after(idle_s if idle_s > 0 else math.inf):
                first = await self.receive.receive()
                batch = [first]
                while True:
                    try:
                        batch.append(self.receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                await self._serve(batch)
                if self.gone and self.registry.retire(self):
                    return
                continue
            # Idle: retire only if nothing arrived, in the same tick as leaving the registry, so a new request
            # can never find two actors for this table.
            if self.registry.retire(self):
                return

    async def _ensure_loaded(self) -> None:
        if self.loaded:
            return
        row = await self.registry.store.get_table(self.table_id)
        if row is None:
            self.row, self.state, self.gone = None, None, True
        else:
            self.state = await self.registry.load_state(row)
            self.row, self.gone = row, False
        self.loaded, self.loaded_at = True, time.monotonic()

    async def _serve(self, batch: list[Request]) -> None:
        self.batches += 1
        self.last_batch_size = len(batch)
        if not self.registry.serving(self):
            # The shard's lease lapsed or moved: whatever we hold in memory may be stale. Nothing is decided here
            # any more; the requester (or its client) retries at the current owner.
            self.gone = self.moved = True
            for req in batch:
                req.reply.fail(self._gone_error())
            return
        try:
            await self._ensure_loaded()
        except (CoordinatorError, StorageError) as exc:
            exc = from_storage(exc)
            for req in batch:
                req.reply.fail(exc if isinstance(exc, Unavailable) else Unavailable(f"cannot load table: {exc}"))
            return
        except Exception as exc:
            log.exception("loading table %s failed", self.table_id)
            for req in batch:
                req.reply.fail(Unavailable(f"cannot load table {self.table_id}: {exc}"))
            return
        seg = _Segment(self.state)
        for req in batch:
            if isinstance(req.proposal, Participant):
                # A multi-table transaction: settle what came before it, then hold the table for it.
                await self._settle(seg)
                await self._take_part(req)
                seg = _Segment(self.state)
                continue
            if self.gone:
                req.reply.fail(self._gone_error())
                continue
            # A request whose key already applied is a duplicate before it is anything else: decided again, its
            # requirements would fail against the state it made itself (two members forwarding one retried
            # commit at once), and the client would be told "conflict" about its own applied commit.
            key = _key_of(req.proposal)
            if key is not None and key in self.recent_keys:
                req.reply.fail(DuplicateRequest(key))
                continue
            if key is not None and key in seg.keys:
                seg.duplicates.append((req, key))
                continue
            decision = self._decide(req.proposal, req.reply, seg.state)
            if decision is None:
                self._count_refusal(req)
                continue
            if decision.idempotency is not None:
                key = decision.idempotency.key
                if key in self.recent_keys:  # applied, and durable
                    req.reply.fail(DuplicateRequest(key))
                    continue
                if key in seg.keys:
                    seg.duplicates.append((req, key))  # applied in this segment: answered once it is durable
                    continue
            if not decision.writes:
                if seg.empty:
                    req.reply.set(decision.reply)
                else:
                    seg.readers.append((req, decision.reply))
                continue
            if not decision.is_simple and not seg.empty:
                # Drops and renames are written on their own, against the durable state.
                seg = await self._settle(seg)
                if self.gone:
                    req.reply.fail(self._gone_error())
                    continue
                decision = self._decide(req.proposal, req.reply, seg.state)
                if decision is None:
                    self._count_refusal(req)
                    continue
            seg.add(req, decision)
            if not decision.is_simple:
                seg = await self._settle(seg)
        await self._settle(seg)

    async def _settle(self, seg: _Segment) -> _Segment:
        """Write the segment's changes, if any; the next segment starts from the durable state."""
        if not seg.empty:
            await self._flush(seg)
        return _Segment(self.state)

    async def _take_part(self, req: Request) -> None:
        participant: Participant = req.proposal
        if self.gone:
            req.reply.fail(self._gone_error())
            return
        decision = self._decide(participant.proposal, req.reply, self.state)
        if decision is None:
            self._count_refusal(req, participant.proposal)
            return
        part = self._part([decision])
        req.reply.set((decision.reply, part))
        # Hold the table: nothing else is decided until the commit's single write has an outcome.
        with trio.CancelScope(shield=True):
            await participant.verdict.event.wait()
        error = await self._conclude(part, [decision], participant.verdict.error, applied=participant.verdict.applied)
        if decision.writes:
            self._count_written([req], error, participant.proposal)

    def _decide(self, proposal: Proposal, reply: Reply, state: Any) -> Decision | None:
        """The proposal's decision, or None once `reply` has been failed with its rejection."""
        try:
            return proposal.decide(state)
        except CoordinatorError as exc:
            reply.fail(exc)
            # At most one such reload per RELOAD_INTERVAL_S: a reload reads the store and probes the table's files,
            # and any writer could otherwise make the table reload on every request.
            if exc.reload and time.monotonic() - self.loaded_at > RELOAD_INTERVAL_S:
                self.loaded = False
        except Exception as exc:
            # Input the rules did not anticipate. Nothing was applied, so say so rather than "state unknown".
            log.exception("commit rule failed on table %s", self.table_id)
            reply.fail(BadRequest(f"cannot apply request: {type(exc).__name__}: {exc}"))
        return None

    # -- commit metrics ------------------------------------------------------------------------------------------

    def _count_refusal(self, req: Request, proposal: Proposal | None = None) -> None:
        """A commit refused by its table's rules: a conflict (409) or rejected; nothing applied either way. Not
        counted when the requester offers it again at once (`offered_again`: Iceberg's rebase reads files first)."""
        if getattr(req.reply.error, "offered_again", False):
            return
        if getattr(proposal or req.proposal, "counts_as_commit", False) and self.row is not None:
            outcome = "conflict" if req.reply.error is not None and req.reply.error.status == 409 else "rejected"
            self.registry.observe_commit(self.row.format, outcome, time.perf_counter() - req.arrived)

    def _count_written(self, requests: list[Request], error: CoordinatorError | None,
                       proposal: Proposal | None = None) -> None:
        """The outcome of written commits; an applied one also tells its requester what it committed (logs)."""
        if self.row is None:
            return
        fmt = self.row.format
        # Unpublished: applied, its files are being restored (the requester is asked to retry and hears success).
        outcome = ("applied" if error is None or isinstance(error, Unpublished) else
                   "unknown" if isinstance(error, OutcomeUnknown) else "rejected")
        now = time.perf_counter()
        committed = (fmt, display_name(self.row), self.row.row_version) if error is None else None
        for req in requests:
            if getattr(proposal or req.proposal, "counts_as_commit", False):
                self.registry.observe_commit(fmt, outcome, now - req.arrived)
                req.reply.committed = committed

    def _remember_keys(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if d.idempotency is not None:
                self.recent_keys[d.idempotency.key] = None
        while len(self.recent_keys) > RECENT_KEYS:
            self.recent_keys.popitem(last=False)

    def _part(self, decisions: list[Decision]) -> Part:
        """The decisions' changes as this table's part of a commit: one compare-and-set of its row."""
        row = self.row
        w = TableWrite(table_id=self.table_id, expected_version=row.row_version,
                       epoch=row.epoch if self.epoch is None else self.epoch, bump=len(decisions))
        part = Part(w)
        name = (row.catalog, row.namespace, row.name)
        for d in decisions:
            if d.rename is not None:
                name = d.rename
            if d.changes:   # one commit per request, named as that request leaves the table
                w.events.extend(events.records(self.table_id, name, d.changes))
            if d.row_state is not None:
                w.state = d.row_state
            w.log.extend(d.log)
            w.log_delete.extend(d.log_delete)
            w.delete = w.delete or d.delete
            w.rename = d.rename or w.rename
            w.relocate = d.relocate or w.relocate
            w.purge = d.purge or w.purge
            part.files.extend(d.files)
            part.published.extend(d.published)
        return part

    async def _flush(self, seg: _Segment) -> None:
        """Write the segment as a commit of this one table, then answer everyone waiting for it."""
        decisions = [d for _, d in seg.decisions]
        part = self._part(decisions)
        receipts = [d.idempotency for d in decisions if d.idempotency is not None] \
            + [d.marker for d in decisions if d.marker is not None]
        if not self.registry.serving(self):
            # Checked again just before any file is written: a former owner writes as little as possible. The
            # database's fencing is what guarantees it applies nothing.
            error: CoordinatorError | None = NotOwner("the shard's lease lapsed before the write")
        else:
            try:
                await commit.write(Commit([part], receipts), self.registry.store, self.registry.files)
                error = None
            except CoordinatorError as exc:
                error = exc
            except Exception as exc:
                # Not one of the errors commit.write raises to say what happened: it may come after the store
                # applied the commit, so "not applied" (Unavailable) would be a guess. The table is reloaded.
                log.exception("writing table %s failed", self.table_id)
                error = OutcomeUnknown(f"writing table {self.table_id} failed unexpectedly ({exc}); whether it "
                                       f"applied is unknown")
        applied = error is None or isinstance(error, Unpublished)
        if isinstance(error, OutcomeUnknown):
            log.error("outcome unknown for %d requests on table %s: %s", len(seg.requests), self.table_id, error)
        error = await self._conclude(part, decisions, error, applied=applied)
        self._count_written([r for r, _ in seg.decisions], error)
        if error is not None:
            for req in seg.requests:
                req.reply.fail(error)
            return
        for req, d in seg.decisions:
            req.reply.set(d.reply)
        for req, reply in seg.readers:
            req.reply.set(reply)
        for req, key in seg.duplicates:
            req.reply.fail(DuplicateRequest(key))

    async def _conclude(self, part: Part, decisions: list[Decision], error: CoordinatorError | None, *,
                        applied: bool) -> CoordinatorError | None:
        """Take a commit's outcome for this table's part into memory; the error its requesters hear (None: they
        hear success). The same for the actor's own batches and for parts of commits that span several tables."""
        if not applied:
            if isinstance(error, NotOwner):
                # The shard's lease moved (fenced by the database, or lapsed on our clock): stop serving the table
                # here; its next owner loads it from the store. Moved, not dropped: the requesters are told to
                # retry at the new owner, never "does not exist".
                self.registry.lease_lost(self)
                self.gone = self.moved = True
                return self._gone_error()
            if not isinstance(error, REFUSALS):
                await self._reload()   # the write failed or its outcome is unknown: believe only the store
            return error
        self.registry.observe_batch(len(decisions))
        self.row = written_row(self.row, part.write)
        self.state = decisions[-1].state
        self.gone = part.write.delete
        self._remember_keys(decisions)
        if isinstance(error, Unpublished) and not await self._restore(part.published):
            # Applied, but a published file is still missing: nobody hears success yet, and no clean-up runs (it
            # may remove what restores the file). A retry is answered as the same commit once it is restored.
            return Unpublished(f"table {self.table_id}: the commit was recorded but its files could not be "
                               f"written yet; retry", retry_after_s=self.registry.config.retry_after_s)
        for d in decisions:
            if d.after_durable is not None:
                self.registry.spawn_background(d.after_durable)
        self.registry.written(self.table_id, self.row.format, None if self.gone else self.state)
        return None

    async def _restore(self, files: list[tuple[str, bytes]]) -> bool:
        """Published files of an applied change could not be written. The change stands; the format's loader
        restores such files from what the rows record (Lance: the staged manifest), so reload and check. If they
        are still missing, the next request loads again."""
        with trio.CancelScope(shield=True):
            await self._reload()
            try:
                if self.loaded and all([await self.registry.files.size(uri, within=within) == len(data)
                                        for uri, data, _, within in map(file_write, files)]):
                    return True
            except Exception as exc:
                log.error("table %s: cannot check restored files: %s", self.table_id, exc)
            self.loaded = False
            return False

    def _gone_error(self) -> CoordinatorError:
        if self.moved:
            return NotOwner(f"table {self.table_id} moved to another member; nothing applied, retry",
                            retry_after_s=self.registry.config.retry_after_s)
        return NoSuchTable("Table does not exist")

    async def _reload(self) -> None:
        """Forget the in-memory state and read the table from the store before serving again."""
        self.loaded = False
        try:
            await self._ensure_loaded()
        except Exception as exc:
            log.warning("reload of table %s failed (%s); will retry on next request", self.table_id, exc)


def _key_of(proposal: Any) -> Any:
    """The Idempotency-Key a proposal carries (Iceberg's: an IdempotencyKey; its `key` is what is recorded)."""
    key = getattr(proposal, "idempotency_key", None)
    return getattr(key, "key", key)


def display_name(row: TableRow) -> str:
    """A table's name as logs and the console show it: catalog (if any), namespace levels and name, dotted."""
    return ".".join(p for p in (row.catalog, *row.namespace.split("\x1f"), row.name) if p)
