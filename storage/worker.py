"""One long-lived thread for one kind of blocking work (the commit path's file writes, say), awaited from trio.

`trio.to_thread.run_sync` hands each call to a cached thread through a capacity limiter, a fresh lock and a
result callback: ~65 us of CPU per call here, paid once per group of file writes, so about once per commit at
moderate load. A thread that only ever does one kind of work needs none of that: a queue in, and the awaiting task
rescheduled with the outcome: ~38 us. The thread starts on first use and ends after `IDLE_S` without work.

Work whose outcome only its caller waits for (reads) may be abandoned (`abandon_on_cancel`): a cancelled caller
stops waiting at once, and the thread, perhaps stuck in a file system that does not answer, is left to finish on
its own while later calls go to a new one, so that one stuck call holds up no other. At most `MAX_ABANDONED` are
left so at a time; beyond that a cancelled caller waits for its outcome, as any caller of work that cannot be
abandoned does (a write: what it did must be known).
"""

from __future__ import annotations

import functools
import queue
import threading
from typing import Any, Callable, TypeVar

import trio

T = TypeVar("T")

IDLE_S = 10.0
MAX_ABANDONED = 8

# A job: [fn, args, outcome ([value], or [None, error]), trio token, task, state]
_WAITING, _DELIVERED, _ABANDONED = "waiting", "delivered", "abandoned"


class WorkerThread:
    def __init__(self, name: str, abandon_on_cancel: bool = False):
        self.name = name
        self.abandon_on_cancel = abandon_on_cancel
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue | None = None   # the current thread's; None: no thread runs
        self._abandoned = 0   # threads left to a call whose caller stopped waiting, not yet returned

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on this thread. Not cancellable, like `trio.to_thread.run_sync` (a thread cannot be
        interrupted, so the caller waits for the outcome), unless `abandon_on_cancel`."""
        job = [fn, args, [], trio.lowlevel.current_trio_token(), trio.lowlevel.current_task(), _WAITING]
        with self._lock:
            if self._jobs is None:
                self._start()
            self._jobs.put(job)
        await trio.lowlevel.wait_task_rescheduled(functools.partial(self._abort, job))
        outcome = job[2]
        if len(outcome) == 2:
            error = outcome.pop()
            try:
                raise error
            finally:
                del error   # (no reference cycle through the traceback)
        return outcome[0]

    def _start(self) -> None:
        self._jobs = queue.SimpleQueue()
        threading.Thread(target=self._work, args=(self._jobs,), name=self.name, daemon=True).start()

    def _abort(self, job: list, _raise_cancel: Any) -> trio.lowlevel.Abort:
        """A cancelled caller: its job is abandoned if it may be, and the thread that has it (busy with it, or
        about to be) is left to it; the calls queued behind it go to a new thread."""
        with self._lock:
            if not self.abandon_on_cancel or job[5] is _DELIVERED or self._abandoned >= MAX_ABANDONED:
                return trio.lowlevel.Abort.FAILED   # (the outcome comes, or is on its way)
            job[5] = _ABANDONED
            self._abandoned += 1
            old = self._jobs
            self._start()
            while True:   # (the old thread may take some of them meanwhile: each runs once, on one thread)
                try:
                    self._jobs.put(old.get_nowait())
                except queue.Empty:
                    break
        return trio.lowlevel.Abort.SUCCEEDED

    def _work(self, jobs: queue.SimpleQueue) -> None:
        while True:
            try:
                job = jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:   # (a caller queues under the lock: it sees us running, or starts anew)
                    if jobs.empty():
                        if self._jobs is jobs:
                            self._jobs = None
                        return
                continue
            fn, args, outcome, token, task, _ = job
            if job[5] is not _ABANDONED:
                try:
                    outcome.append(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - raised in the caller's task
                    outcome += [None, exc]
            with self._lock:
                if job[5] is _ABANDONED:   # nobody waits for it any more
                    self._abandoned -= 1
                    continue
                job[5] = _DELIVERED
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, task)
            except trio.RunFinishedError:
                pass   # its trio run ended while this ran: nobody is waiting
