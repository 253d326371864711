"""One long-lived thread for one kind of blocking work (the commit path's file writes, say), awaited from trio.

`trio.to_thread.run_sync` hands each call to a cached thread through a capacity limiter, a fresh lock and a
result callback: ~65 us of CPU per call here, paid once per group of file writes, so about once per commit at
moderate load. A thread that only ever does one kind of work needs none of that: a queue in, and the awaiting task
rescheduled with the outcome: ~38 us. The thread starts on first use and ends after `IDLE_S` without work.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, TypeVar

import trio

T = TypeVar("T")

IDLE_S = 10.0


class WorkerThread:
    def __init__(self, name: str):
        self.name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running = False

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on this thread. Not cancellable, like `trio.to_thread.run_sync`: a thread cannot be
        interrupted, so the caller waits for the outcome."""
        outcome: list = []   # [value], or [None, error]
        self._jobs.put((fn, args, outcome, trio.lowlevel.current_trio_token(), trio.lowlevel.current_task()))
        with self._lock:
            if not self._running:
                self._running = True
                threading.Thread(target=self._work, name=self.name, daemon=True).start()
        await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        if len(outcome) == 2:
            error = outcome.pop()
            try:
                raise error
            finally:
                del error   # (no reference cycle through the traceback)
        return outcome[0]

    def _work(self) -> None:
        while True:
            try:
                fn, args, outcome, token, task = self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:   # (a caller queues first, then looks here: it sees us running or starts anew)
                    if self._jobs.empty():
                        self._running = False
                        return
                continue
            try:
                outcome.append(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's task
                outcome += [None, exc]
            try:
                token.run_sync_soon(trio.lowlevel.reschedule, task)
            except trio.RunFinishedError:
                pass   # its trio run ended while this ran: nobody is waiting
