"""The commit feed for readers: pages after a token, and long-polls that answer as soon as a commit lands.

Events are final and in order below the database's horizon (storage/events.py); a page's `next` token is the
position up to which the reader has seen everything, so it resumes exactly, on any member, after any restart.

What a reader is answered depends only on the events it may read. Its grants are applied in the store's query
(`FeedScope`), so `next` is either its last event's position or the horizon (the same for every reader at that
moment), never the position of an event it may not see; and a reader that may see nothing reads no event at all.

Waiting readers share one read. The store calls `on_events` after each flush that applied something (and, with
several members, when another member's commit NOTIFYs); only while a reader that may see something waits does that
reach the trio thread, where `run` reads the events that became final, once, and offers them to every waiting
reader, each taking those its scope and filters let through. A commit costs one read however many wait. The
latest shared reads are kept (the tail): a long-poll from a position in it, a reader keeping up, is answered
from it or waits with no read of its own. Waiting readers are bounded, in all and per client: beyond, a
long-poll is refused at once (429, or 503 when the service is full, with Retry-After).
"""

from __future__ import annotations

import bisect
import functools
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import trio

from storage.errors import StorageError
from storage.interface import Store
from storage.records import EVERYTHING, EventPage, FeedScope, Position, StoredEvent

from .auth import Principal, Privilege, Table
from .config import Config
from .errors import BadRequest, EventsExpired, TooManyRequests, Unavailable
from .events import cloud_event, position, securable_key, token

log = logging.getLogger(__name__)

MAX_LIMIT = 1000
MAX_WAIT_S = 60.0
PRUNE_EVERY_S = 60.0   # how often retention runs (coordinator/service.py)
# An event committed behind a transaction that is still open becomes readable once that one ends: while one is
# pending, the shared read looks again after this long, doubling up to RECHECK_MAX_S (no wake-up comes for it).
RECHECK_S = 0.002
RECHECK_MAX_S = 0.1
RETRY_S = 0.5          # after a failed shared read (the database unreachable), the next try
TAIL_MAX = 2 * MAX_LIMIT   # events of the latest shared reads kept to answer long-polls that keep up


def _position(e: StoredEvent) -> Position:
    return e.position


@functools.lru_cache(maxsize=1024)
def scope_of(principal: Principal | None) -> FeedScope:
    """The events `principal` may see: those of the tables it may read (`read` on the table or anything above it,
    as for loading the table). Without authentication (None), every event."""
    if principal is None:
        return EVERYTHING
    readable = [g.path for g in principal.grants if g.allows(Privilege.READ, g.path)]
    if () in readable:
        return EVERYTHING
    containers = {securable_key(p) + "/" for p in readable if not isinstance(p[-1], Table)}
    # Ranges the store reads once each: none within another, so that no event comes twice.
    containers = {c for c in containers if not c.startswith(tuple(containers - {c}))}
    tables = {k for k in (securable_key(p) for p in readable if isinstance(p[-1], Table))
              if not k.startswith(tuple(containers))}
    return FeedScope(tables=tuple(sorted(tables)), containers=tuple(sorted(containers)))


@dataclass(eq=False)
class _Waiter:
    """A reader in a long-poll: `at` is how far the feed has been looked at for it (by its own read, the tail, the
    shared reads), `next` the token it is answered with if nothing comes (never an event it may not see)."""

    scope: FeedScope
    formats: frozenset[str] | None
    subjects: frozenset[str] | None
    limit: int
    at: Position
    next: Position
    found: list[StoredEvent] = field(default_factory=list)
    expired: bool = False
    done: trio.Event = field(default_factory=trio.Event)

    @property
    def interest(self) -> tuple:
        """What decides which events it takes: readers alike are matched once per shared read."""
        return self.scope, self.formats, self.subjects

    def takes(self, e: StoredEvent) -> bool:
        return (self.scope.sees(e.securable) and (self.formats is None or e.type.split(".", 1)[0] in self.formats)
                and (self.subjects is None or e.subject in self.subjects))

    def offer(self, page: EventPage, matching: list[StoredEvent], full: bool) -> None:
        """A shared read (or the tail) from at or before this reader's `at` (`full`: more events follow it),
        `matching` the events of it this reader takes."""
        if self.at < page.floor:   # retention deleted events after this reader's position meanwhile
            self.expired = True
            self.done.set()
            return
        after = [e for e in matching if e.position > self.at]
        if after:
            self.found = after[:self.limit]
            # At the horizon only if the page held everything up to it and this reader was given all it takes.
            whole = not full and len(after) <= self.limit
            self.next = max(self.at, (page.horizon, 0)) if whole else self.found[-1].position
            self.done.set()
        elif full:
            self.at = max(self.at, page.events[-1].position)   # read on from there; `next` stays
        else:
            self.at = self.next = max(self.at, (page.horizon, 0))


class Feed:
    def __init__(self, store: Store, config: Config, formats: tuple[str, ...]):
        self.store = store
        self.config = config
        self.formats = formats   # the names of the formats served: what the `format` filter may name
        self.waiting = 0       # readers in a long-poll, for /metrics
        self._by_client: Counter[str] = Counter()
        # Long-polls that may see something, from before their own read: read by the store's thread to decide
        # whether to wake us (a commit landing during that read still wakes the shared read).
        self._listening = 0
        self._waiters: set[_Waiter] = set()    # those past their own read, offered every shared read
        self._woken = trio.Event()
        self._wakes = 0        # wake-ups so far
        self._deafened = 0     # times nobody listened any more (wake-ups were dropped from then on)
        # The tail: the events the shared reads brought, every one after `_tail_start` up to `_tail_end` (the
        # horizon of the latest, or its last event if it was full), in feed order, at most TAIL_MAX. A long-poll
        # from a position in it is answered from it or waits with no read of its own; `_fresh` while nothing
        # can have been committed after it.
        self._tail: list[StoredEvent] = []
        self._tail_start: Position | None = None
        self._tail_page: EventPage | None = None   # the tail as a page: the latest read's horizon, floor, pending
        self._tail_full = False
        self._fresh = False

    @property
    def _tail_end(self) -> Position:
        return self._tail[-1].position if self._tail_full else (self._tail_page.horizon, 0)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Takes the store's wake-ups and does the one shared read for every waiting reader, until cancelled."""
        trio_token = trio.lowlevel.current_trio_token()

        def on_events() -> None:   # on the store's thread
            if self._listening:
                trio_token.run_sync_soon(self._wake)
        self.store.on_events = on_events
        task_status.started()
        recheck = None   # while an event is pending behind an open transaction: when to look again
        while True:
            with trio.move_on_after(recheck if recheck is not None else float("inf")):
                await self._woken.wait()
            self._woken = trio.Event()
            if not self._waiters:
                recheck = None
                continue
            start, heard = min(w.at for w in self._waiters), (self._wakes, self._deafened)
            try:
                page = await self.store.events.read_shared(start, MAX_LIMIT)   # each takes what it may see
            except StorageError as exc:
                log.warning("commit feed: reading for waiting readers failed (%s); trying again", exc)
                recheck = RETRY_S
                continue
            except Exception:   # the readers' one read must go on: they end at their deadlines meanwhile
                log.exception("commit feed: reading for waiting readers failed; trying again")
                recheck = RETRY_S
                continue
            full = len(page.events) == MAX_LIMIT
            self._remember(start, page, full)
            self._fresh = not full and not page.pending and heard == (self._wakes, self._deafened)
            behind = False
            served: dict[tuple, list[StoredEvent]] = {}
            for w in list(self._waiters):
                behind |= not self._serve(w, served)
            if full or behind:
                self._wake()   # read on at once
            elif page.pending:   # (each time events came, as if anew: the pending ones are likely new too)
                recheck = RECHECK_S if recheck is None or page.events else min(recheck * 2, RECHECK_MAX_S)
            else:
                recheck = None

    def _wake(self) -> None:
        self._wakes += 1
        self._fresh = False
        self._woken.set()

    def _remember(self, start: Position, page: EventPage, full: bool) -> None:
        """Adds a shared read, of the events after `start`, to the tail (in its place if it joins on)."""
        end = page.events[-1].position if full else (page.horizon, 0)
        horizon = self._tail_page.horizon if self._tail_page is not None else 0
        if self._tail_start is not None and self._tail_start <= start <= self._tail_end:
            if end > self._tail_end:
                last = self._tail_end
                self._tail.extend(e for e in page.events if e.position > last)
                self._tail_full, horizon = full, max(horizon, page.horizon)
        else:
            self._tail, self._tail_start, self._tail_full, horizon = list(page.events), start, full, page.horizon
        self._tail_page = EventPage(self._tail, horizon, page.next_xid, page.floor, page.pending)
        if len(self._tail) > TAIL_MAX:
            cut = len(self._tail) - TAIL_MAX
            self._tail_start = self._tail[cut - 1].position
            del self._tail[:cut]

    def _covers(self, at: Position) -> bool:
        return self._tail_start is not None and self._tail_start <= at <= self._tail_end

    def _serve(self, w: _Waiter, served: dict[tuple, list[StoredEvent]] | None = None) -> bool:
        """Offers a reader the tail after its position (`served`: what readers alike took, by interest and
        place); False if the tail does not reach back to it."""
        if not self._covers(w.at):
            return False
        i = bisect.bisect_right(self._tail, w.at, key=_position)
        key = (w.interest, i)
        if served is None or key not in served:
            matching = [] if w.scope.nothing else [e for e in self._tail[i:] if w.takes(e)]
            if served is not None:
                served[key] = matching
        w.offer(self._tail_page, matching if served is None else served[key], self._tail_full)
        if w.done.is_set():
            self._waiters.discard(w)
        return True

    async def read(self, after: str | None, *, limit: int = 100, wait_s: float = 0.0,
                   formats: list[str] | None = None, tables: list[str] | None = None,
                   scope: FeedScope = EVERYTHING, client: str = "anonymous") -> dict[str, Any]:
        """`{"events": [...], "next": token}`: the events after `after` (None: the oldest kept) that `scope` lets
        through and pass the filters. With `wait_s`, an empty answer waits up to that long for one; `client` is
        whose share of the waiting readers that takes."""
        if not limit >= 1:
            raise BadRequest(f"limit must be at least 1, got {limit}")
        if not wait_s >= 0:
            raise BadRequest(f"wait must be 0 or more seconds, got {wait_s:g}")
        limit, wait_s = min(limit, MAX_LIMIT), min(wait_s, MAX_WAIT_S)   # more is served at the cap, as pages are
        for fmt in formats or ():
            if fmt not in self.formats:
                raise BadRequest(f"format must be one of {', '.join(self.formats)}, got {fmt!r}")
        at = position(after) if after is not None else None
        if wait_s == 0:
            page = await self._page(at, limit, formats, tables, scope)
            return self._answer(page.events, self._next(at, page, limit))
        deadline = trio.current_time() + wait_s
        self._admit(client)
        listens = not scope.nothing   # a reader that may see nothing waits out its time: nothing can wake it
        try:
            self._listening += listens
            if listens and self._listening == 1:
                self.store.want_events(True)   # (another member's commit before it listens: it wakes us once it does)
            waiter = _Waiter(scope, frozenset(formats) if formats else None, frozenset(tables) if tables else None,
                             limit, at or (0, 0), at or (0, 0))
            heard = (self._wakes, self._deafened)
            if at is not None and self._serve(waiter):   # a reader keeping up: from memory
                fresh = self._fresh
            else:
                page = await self._page(at, limit, formats, tables, scope)
                waiter.at = waiter.next = self._next(at, page, limit)
                if page.events:
                    return self._answer(page.events, waiter.next)
                fresh = not page.pending and heard == (self._wakes, self._deafened)
                self._serve(waiter)   # what the shared reads brought meanwhile
            if not waiter.done.is_set():
                if not listens:
                    await trio.sleep_until(deadline)
                    return self._answer([], waiter.next)
                self._waiters.add(waiter)
                try:
                    if not fresh:
                        self._wake()   # the shared read looks for what may have been committed since
                    with trio.move_on_at(deadline):
                        await waiter.done.wait()
                finally:
                    self._waiters.discard(waiter)
            if waiter.expired:
                raise self._expired()
            return self._answer(waiter.found, waiter.next)
        finally:
            self._listening -= listens
            if listens and self._listening == 0:
                self._deafened += 1
                self._fresh = False
                self.store.want_events(False)
            self._leave(client)

    def _admit(self, client: str) -> None:
        c = self.config
        if self._by_client[client] >= c.feed_waiters_per_client:
            raise TooManyRequests(f"this client already has {c.feed_waiters_per_client} long-polls waiting on the "
                                  f"feed (feed_waiters_per_client); retry after one ends",
                                  retry_after_s=c.retry_after_s)
        if self.waiting >= c.feed_waiters_max:
            raise Unavailable(f"{c.feed_waiters_max} long-polls are waiting on the feed (feed_waiters_max); retry "
                              f"later", retry_after_s=c.retry_after_s)
        self._by_client[client] += 1
        self.waiting += 1

    def _leave(self, client: str) -> None:
        self.waiting -= 1
        self._by_client[client] -= 1
        if not self._by_client[client]:
            del self._by_client[client]

    async def _page(self, at: Position | None, limit: int, formats: list[str] | None, tables: list[str] | None,
                    scope: FeedScope) -> EventPage:
        page = await self.store.events.read(at, limit, formats=formats or None, subjects=tables or None, scope=scope)
        if at is not None and at < page.floor:
            raise self._expired()
        if at is not None and at[0] > page.next_xid:
            raise BadRequest("this token is not from this service's feed")
        return page

    def _expired(self) -> EventsExpired:
        return EventsExpired(f"the feed no longer holds the events after this token (retention: "
                             f"{self.config.events_retention_s:g} s, {self.config.events_max} events); start again "
                             f"without `after`")

    @staticmethod
    def _next(at: Position | None, page: EventPage, limit: int) -> Position:
        """Where a reader resumes after `page`: after its last event if it is full (more may follow), else at the
        horizon, up to which everything it may see was read."""
        if len(page.events) == limit:
            return page.events[-1].position
        return max(at or page.floor, (page.horizon, 0))

    @staticmethod
    def _answer(events: list[StoredEvent], at: Position) -> dict[str, Any]:
        return {"events": [cloud_event(e) for e in events], "next": token(at)}
