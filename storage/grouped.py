"""Group commit for the commit path's file work: many trio tasks' calls to one batch operation, one call per moment.

Table files are written (and Lance's staged manifests read and deleted) by worker threads (storage/worker.py).
Each crossing to a worker thread costs a thread wake-up and a GIL hand-off, and with one crossing per commit those,
not the file work itself, were what a commit's CPU went to. `GroupedCall` makes the crossings per moment instead:
while one batch is in flight, new callers queue; when it ends, the first of them to wake takes the whole queue into
the next batch. A lone caller goes at once, so an idle service adds no latency; under load the batches grow on
their own, as PostgreSQL's group commit does. (The database side needs none of this: the asyncio writer in
storage/writer.py already takes every pending write into one transaction. Grouping its crossings as well was
measured: no clear CPU gain, and a follower then waits for the trio loop between batches.)
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import trio

_PENDING = object()


class GroupedCall:
    """`await grouped(item)` returns `item`'s own result from `run_batch(items)`, which gets every waiting caller's
    item in order and returns one outcome per item: a result, or an exception that is that caller's alone. A batch
    in flight is shielded from cancellation: other callers' outcomes depend on it. If it fails as a whole, every
    caller in it gets that exception; if its task is interrupted, each gets `interrupted()` instead of waiting
    forever."""

    def __init__(self, run_batch: Callable[[list[Any]], Awaitable[list[Any]]],
                 interrupted: Callable[[], Exception]):
        self.run_batch = run_batch
        self.interrupted = interrupted
        self._queue: list[list] = []   # [item, outcome]; outcome stays _PENDING until its batch ended
        self._busy = False
        self._batch_ended = trio.Event()

    async def __call__(self, item: Any) -> Any:
        slot = [item, _PENDING]
        self._queue.append(slot)
        while slot[1] is _PENDING:
            if self._busy:
                await self._batch_ended.wait()
                continue
            await self._run_queue()
        if isinstance(slot[1], BaseException):
            raise slot[1]
        return slot[1]

    async def _run_queue(self) -> None:
        self._busy = True
        batch, self._queue = self._queue, []
        outcomes: list | None = None
        try:
            with trio.CancelScope(shield=True):
                try:
                    outcomes = await self.run_batch([slot[0] for slot in batch])
                except Exception as exc:
                    outcomes = [exc] * len(batch)
        finally:
            if outcomes is None:
                outcomes = [self.interrupted() for _ in batch]
            for slot, outcome in zip(batch, outcomes):
                slot[1] = outcome
            self._busy = False
            self._batch_ended.set()
            self._batch_ended = trio.Event()
