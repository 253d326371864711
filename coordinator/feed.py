"""The commit feed for readers: pages after a token, and long-polls that answer as soon as a commit lands.

Events are final and in order below the database's horizon (storage/events.py); a page's `next` token is the
position up to which the reader has seen everything, so it resumes exactly, on any member, after any restart.

A waiting reader costs nothing per commit but a wake-up: the store calls `on_events` after each flush that applied
something (and, with several members, when another member's commit NOTIFYs), and only while someone waits does
that reach the trio thread, which wakes every waiting reader to read once more.
"""

from __future__ import annotations

from typing import Any, Callable

import trio

from storage.interface import Store
from storage.records import StoredEvent

from .config import Config
from .errors import BadRequest, EventsExpired
from .events import cloud_event, position, token

MAX_LIMIT = 1000
MAX_WAIT_S = 60.0
PRUNE_EVERY_S = 60.0   # how often retention runs (coordinator/service.py)
# An event committed behind a transaction that is still open becomes readable once that one ends: a waiting reader
# looks again after this long, doubling up to RECHECK_MAX_S (no wake-up comes for it).
RECHECK_S = 0.002
RECHECK_MAX_S = 0.1


class Feed:
    def __init__(self, store: Store, config: Config, formats: tuple[str, ...]):
        self.store = store
        self.config = config
        self.formats = formats   # the names of the formats served: what the `format` filter may name
        self.waiting = 0    # readers in a long-poll: read by the store's thread to decide whether to wake us
        self._changed = trio.Event()

    def attach(self) -> None:
        """Take the store's wake-ups (from the trio thread that serves readers)."""
        trio_token = trio.lowlevel.current_trio_token()

        def on_events() -> None:   # on the store's thread
            if self.waiting:
                trio_token.run_sync_soon(self._wake)
        self.store.on_events = on_events

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def read(self, after: str | None, *, limit: int = 100, wait_s: float = 0.0,
                   formats: list[str] | None = None, tables: list[str] | None = None,
                   visible: Callable[[StoredEvent], bool] = lambda e: True) -> dict[str, Any]:
        """`{"events": [...], "next": token}`: the events after `after` (None: the oldest kept) that pass the
        filters and `visible`. With `wait_s`, an empty answer waits up to that long for one."""
        if not limit >= 1:
            raise BadRequest(f"limit must be at least 1, got {limit}")
        if not wait_s >= 0:
            raise BadRequest(f"wait must be 0 or more seconds, got {wait_s:g}")
        limit, wait_s = min(limit, MAX_LIMIT), min(wait_s, MAX_WAIT_S)   # more is served at the cap, as pages are
        for fmt in formats or ():
            if fmt not in self.formats:
                raise BadRequest(f"format must be one of {', '.join(self.formats)}, got {fmt!r}")
        at = position(after) if after is not None else None
        deadline = trio.current_time() + wait_s
        recheck = RECHECK_S
        self.waiting += wait_s > 0   # from before the first read: a commit landing during it still wakes us
        if wait_s > 0 and self.waiting == 1:
            self.store.want_events(True)   # (another member's commit before it listens: it wakes us once it does)
        try:
            while True:
                changed = self._changed
                page = await self.store.events.read(at, limit, formats=formats or None, subjects=tables or None)
                if at is not None and at < page.floor:
                    raise EventsExpired(f"the feed no longer holds the events after this token (retention: "
                                        f"{self.config.events_retention_s:g} s, {self.config.events_max} events); "
                                        f"start again without `after`")
                if at is not None and at[0] > page.next_xid:
                    raise BadRequest("this token is not from this service's feed")
                events = [cloud_event(e) for e in page.events if visible(e)]
                if len(page.events) == limit:
                    at = page.events[-1].position
                else:   # everything up to the horizon was read
                    at = max(at or page.floor, (page.horizon, 0))
                now = trio.current_time()
                if events or now >= deadline:
                    return {"events": events, "next": token(at)}
                if len(page.events) == limit:
                    continue   # a full page of events this reader may not see: read on
                with trio.move_on_at(min(deadline, now + recheck) if page.pending else deadline):
                    await changed.wait()
                recheck = min(recheck * 2, RECHECK_MAX_S)
        finally:
            self.waiting -= wait_s > 0
            if wait_s > 0 and self.waiting == 0:
                self.store.want_events(False)
