"""A dedicated asyncio (uvloop) thread that trio code awaits.

asyncpg only runs on asyncio. Measured here, trio-asyncio costs ~4x per call; running asyncpg on its own
uvloop thread and waking the awaiting trio task once per call keeps ~4k round trips/s. Everything that touches the
database runs on this thread.

A call crosses twice. Into the loop: the job goes on a queue and the loop is woken through an eventfd that it
watches, written with `os.eventfd_write`, which lets go of the GIL for the system call. (uvloop's
`call_soon_threadsafe` holds the GIL while it wakes the loop's thread; that thread then wakes only to wait for the
GIL, and the caller, often descheduled in favour of it on a busy machine, holds up every other thread meanwhile: a
fifth of the trio thread's time in a profile at 250 commits/s.) Back: the awaiting trio task is rescheduled from
trio's own entry queue (`TrioToken.run_sync_soon`), no Event in between, and reads the asyncio future's result.
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
from typing import Any, Awaitable, Callable, TypeVar

import trio

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency; stay usable without it
    uvloop = None

T = TypeVar("T")


class AsyncioThread:
    def __init__(self, name: str = "storage-asyncio"):
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._wake_fd = -1

    def start(self) -> None:
        ready = threading.Event()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

        def main() -> None:
            loop = uvloop.new_event_loop() if uvloop else asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.add_reader(self._wake_fd, self._run_jobs)
            self.loop = loop
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.remove_reader(self._wake_fd)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=main, name=self.name, daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self) -> None:
        if self.loop and self._thread:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        self.loop = self._thread = None
        if self._wake_fd >= 0:
            os.close(self._wake_fd)
            self._wake_fd = -1

    def run_blocking(self, factory: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        """From a plain thread (start-up, shutdown, tests)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(factory(), self.loop).result(timeout)

    def _run_jobs(self) -> None:
        """On the loop: every job queued since the last wake-up (one wake-up may stand for several)."""
        try:
            os.eventfd_read(self._wake_fd)
        except BlockingIOError:
            pass
        jobs = self._jobs
        while jobs:
            jobs.popleft()()

    def _submit(self, job: Callable[[], None]) -> None:
        self._jobs.append(job)
        if len(self._jobs) == 1:   # else the loop has not run the earlier ones yet, and will run this one too
            os.eventfd_write(self._wake_fd, 1)

    async def call(self, factory: Callable[[], Awaitable[T]]) -> T:
        """Run `factory()` on the asyncio thread and await its result from trio.

        Cancelling the trio side cancels the asyncio task; callers whose write must not be abandoned
        half-way (the storage writer's callers) shield themselves.
        """
        assert self.loop is not None, "storage thread not started"
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()
        started: list[asyncio.Future] = []
        abandoned = False

        def deliver() -> None:   # on the trio thread
            if not abandoned:
                trio.lowlevel.reschedule(task)

        def on_done(fut: asyncio.Future) -> None:
            token.run_sync_soon(deliver)

        def begin() -> None:
            fut = asyncio.ensure_future(factory())
            started.append(fut)
            fut.add_done_callback(on_done)

        def abort(_: Any) -> trio.lowlevel.Abort:
            nonlocal abandoned
            abandoned = True
            if self.loop is not None:
                self._submit(lambda: started and started[0].cancel())   # (queued after `begin`: runs after it)
            return trio.lowlevel.Abort.SUCCEEDED

        self._submit(begin)
        await trio.lowlevel.wait_task_rescheduled(abort)
        return started[0].result()   # (done: read once its callback ran)
