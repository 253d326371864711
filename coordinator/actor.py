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

import enum
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
from storage.records import TableRow

from . import commit
from .commit import Commit, Part, table_part, written_row
from .config import Config
from .decision import Decision, Proposal
from .errors import (AlreadyExists, BadRequest, CommitConflict, CoordinatorError, DuplicateRequest, NoSuchTable, NotFound,
                     NotOwner, OutcomeUnknown, Unavailable, Unpublished, from_storage)
from .mailbox import COMMITTED, Participant, Reply, Request

log = logging.getLogger(__name__)

RELOAD_INTERVAL_S = 1.0   # see _decide: reloads a rejection asks for
RECENT_KEYS = 64  # Idempotency-Keys remembered per table actor (see TableActor.recent_keys)
# A commit refused for what it asked (not for the store's state): the table's memory is still right, no reload.
REFUSALS = (CommitConflict, BadRequest, NotFound, AlreadyExists)

# COMMITTED (coordinator/mailbox.py) is also read from here, by api/direct.py.
__all__ = ["COMMITTED", "Host", "Life", "TableActor", "display_name"]


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


class Life(enum.Enum):
    """Where an actor's table is in its life, as the actor alone moves it."""

    UNLOADED = "unloaded"   # nothing in memory: the next request loads the table's row from the store
    SERVING = "serving"     # the row and its state in memory, as last durably written
    GONE = "gone"           # dropped, or never existed: every request hears so, then the actor retires
    MOVED = "moved"         # the shard's lease moved to another member: requests hear NotOwner, the actor retires


class TableActor:
    def __init__(self, registry: Host, table_id: UUID, mailbox_size: int, epoch: int | None = None):
        self.registry = registry
        self.table_id = table_id
        self.epoch = epoch                 # the shard lease's epoch this actor serves under (None: no cluster)
        self.send, self.receive = trio.open_memory_channel[Request](mailbox_size)
        self.life = Life.UNLOADED
        self.row: TableRow | None = None   # as last durably written
        self.state: Any = None             # format state matching `row`
        self.writing: Any = None           # the state the segment being written leaves, until that write ends
        self.loaded_at = 0.0               # monotonic time of the last load from the store
        self.batches = 0
        self.last_batch_size = 0
        # Idempotency-Keys of the table's latest changes. Requests with one key are serialized by the member
        # that receives them; this catches the same key arriving through two members at once (scale-out).
        self.recent_keys: OrderedDict[Any, None] = OrderedDict()

    @property
    def loaded(self) -> bool:
        return self.life in (Life.SERVING, Life.GONE)

    @property
    def gone(self) -> bool:
        return self.life in (Life.GONE, Life.MOVED)

    # -- what the registry may tell it ------------------------------------------------------------------------

    def start_from(self, row: TableRow, state: Any) -> None:
        """The table's row and state are known without reading the store (kept while it was idle, or just
        created here): served from them, unless something is in memory already."""
        if self.life is Life.UNLOADED:
            self.row, self.state, self.life = row, state, Life.SERVING

    def forget_if_gone(self) -> None:
        """The table this actor found gone may exist again (another member created it): read it afresh."""
        if self.life is Life.GONE:
            self.unload()

    def unload(self) -> None:
        """Forget the in-memory state: the next request reads the table from the store first."""
        if self.life is not Life.MOVED:
            self.life = Life.UNLOADED

    def ahead(self) -> Any | None:
        """The state the table will most likely be in when this actor decides a request sent now, read without
        entering the mailbox: the one its segment being written leaves, else the one last made durable; None if
        it holds none. Only a guess (the write may fail, queued requests come first): it decides against its own."""
        if self.life is not Life.SERVING:
            return None
        return self.state if self.writing is None else self.writing

    def at_rest(self) -> tuple[TableRow, Any] | None:
        """The row and state a retiring actor leaves to be kept while the table is idle (None: nothing worth it)."""
        return (self.row, self.state) if self.life is Life.SERVING and self.row is not None else None

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

    async def _serve(self, batch: list[Request]) -> None:
        """Decide the batch in arrival order, the accepted changes of consecutive requests written together (a
        segment), and answer each once what it depends on is durable."""
        self.batches += 1
        self.last_batch_size = len(batch)
        if not await self._ready(batch):
            return
        seg = _Segment(self.state)
        for req in batch:
            seg = await self._serve_one(req, seg)
        await self._settle(seg)

    async def _ready(self, batch: list[Request]) -> bool:
        """Whether this actor may decide the batch: it still holds its shard's lease, and its table is loaded.
        If not, every request of the batch hears why."""
        if not self.registry.serving(self):
            # The shard's lease lapsed or moved: whatever we hold in memory may be stale. Nothing is decided here
            # any more; the requester (or its client) retries at the current owner.
            self.life = Life.MOVED
            for req in batch:
                req.reply.fail(self._gone_error())
            return False
        try:
            await self._ensure_loaded()
        except (CoordinatorError, StorageError) as exc:
            exc = from_storage(exc)
            for req in batch:
                req.reply.fail(exc if isinstance(exc, Unavailable) else Unavailable(f"cannot load table: {exc}"))
            return False
        except Exception as exc:
            log.exception("loading table %s failed", self.table_id)
            for req in batch:
                req.reply.fail(Unavailable(f"cannot load table {self.table_id}: {exc}"))
            return False
        return True

    async def _ensure_loaded(self) -> None:
        if self.life is not Life.UNLOADED:
            return
        row = await self.registry.store.get_table(self.table_id)
        if row is None:
            self.row, self.state, self.life = None, None, Life.GONE
        else:
            self.state = await self.registry.load_state(row)
            self.row, self.life = row, Life.SERVING
        self.loaded_at = time.monotonic()

    async def _serve_one(self, req: Request, seg: _Segment) -> _Segment:
        """Decide one request against the segment's state; the segment the next request is decided in."""
        if isinstance(req.proposal, Participant):
            # A multi-table transaction: settle what came before it, then hold the table for it.
            await self._settle(seg)
            await self._take_part(req)
            return _Segment(self.state)
        if self.gone:
            req.reply.fail(self._gone_error())
            return seg
        if self._answered_as_duplicate(req, _key_of(req.proposal), seg):
            return seg
        decision = self._decide(req.proposal, req.reply, seg.state)
        if decision is None:
            self._count_refusal(req)
            return seg
        if decision.idempotency is not None and self._answered_as_duplicate(req, decision.idempotency.key, seg):
            return seg
        if not decision.writes:
            if seg.empty:
                req.reply.set(decision.reply)
            else:
                seg.readers.append((req, decision.reply))   # answered once what it read is durable
            return seg
        if not decision.is_simple:
            return await self._write_alone(req, decision, seg)
        seg.add(req, decision)
        return seg

    def _answered_as_duplicate(self, req: Request, key: Any, seg: _Segment) -> bool:
        """Whether `req` carries an Idempotency-Key (`key`) that applied already, and is answered as a duplicate:
        a request whose key applied is a duplicate before it is anything else. Decided again, its requirements
        would fail against the state it made itself (two members forwarding one retried commit at once), and the
        client would be told "conflict" about its own applied commit."""
        if key is None:
            return False
        if key in self.recent_keys:   # applied, and durable
            req.reply.fail(DuplicateRequest(key))
            return True
        if key in seg.keys:   # applied in this segment: answered once it is durable
            seg.duplicates.append((req, key))
            return True
        return False

    async def _write_alone(self, req: Request, decision: Decision, seg: _Segment) -> _Segment:
        """Drops and renames are written on their own, against the durable state: what came before is written
        first, and the request decided again after it."""
        if not seg.empty:
            seg = await self._settle(seg)
            if self.gone:
                req.reply.fail(self._gone_error())
                return seg
            decision = self._decide(req.proposal, req.reply, seg.state)
            if decision is None:
                self._count_refusal(req)
                return seg
        seg.add(req, decision)
        return await self._settle(seg)

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
        part = table_part(self.row, self.epoch, [decision], self.registry.securable(self.row.format))
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
                self.unload()
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

    async def _flush(self, seg: _Segment) -> None:
        """Write the segment as a commit of this one table, then answer everyone waiting for it."""
        decisions = [d for _, d in seg.decisions]
        part = table_part(self.row, self.epoch, decisions, self.registry.securable(self.row.format))
        receipts = [d.idempotency for d in decisions if d.idempotency is not None] \
            + [d.marker for d in decisions if d.marker is not None]
        if not self.registry.serving(self):
            # Checked again just before any file is written: a former owner writes as little as possible. The
            # database's fencing is what guarantees it applies nothing.
            error: CoordinatorError | None = NotOwner("the shard's lease lapsed before the write")
        else:
            self.writing = seg.state
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
            finally:
                self.writing = None
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
                self.life = Life.MOVED
                return self._gone_error()
            if not isinstance(error, REFUSALS):
                await self._reload()   # the write failed or its outcome is unknown: believe only the store
            return error
        self.registry.observe_batch(len(decisions))
        self.row = written_row(self.row, part.write)
        self.state = decisions[-1].state
        self.life = Life.GONE if part.write.delete else Life.SERVING
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
            self.unload()
            return False

    def _gone_error(self) -> CoordinatorError:
        if self.life is Life.MOVED:
            return NotOwner(f"table {self.table_id} moved to another member; nothing applied, retry",
                            retry_after_s=self.registry.config.retry_after_s)
        return NoSuchTable("Table does not exist")

    async def _reload(self) -> None:
        """Forget the in-memory state and read the table from the store before serving again."""
        self.unload()
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
