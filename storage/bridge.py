"""A dedicated asyncio (uvloop) thread that trio code awaits.

asyncpg only runs on asyncio. Measured here, trio-asyncio costs ~4x per call; running asyncpg on its own
uvloop thread and waking the awaiting trio task once per call (`TrioToken.run_sync_soon`) keeps ~4k round
trips/s. Everything that touches the database runs on this thread.
"""

from __future__ import annotations

import asyncio
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

    def start(self) -> None:
        ready = threading.Event()

        def main() -> None:
            loop = uvloop.new_event_loop() if uvloop else asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self.loop = loop
            ready.set()
            try:
                loop.run_forever()
            finally:
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

    def run_blocking(self, factory: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
        """From a plain thread (start-up, shutdown, tests)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(factory(), self.loop).result(timeout)

    async def call(self, factory: Callable[[], Awaitable[T]]) -> T:
        """Run `factory()` on the asyncio thread and await its result from trio.

        Cancelling the trio side cancels the asyncio task; callers whose write must not be abandoned
        half-way (the storage writer's callers) shield themselves.
        """
        assert self.loop is not None, "storage thread not started"
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        box: list[Any] = []

        def on_done(fut: asyncio.Future) -> None:
            box.append(fut)
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:
                pass   # the caller was cancelled and its trio run has ended since (a shutdown): nobody waits

        def begin() -> None:
            task = asyncio.ensure_future(factory())
            box.append(task)
            task.add_done_callback(on_done)

        self.loop.call_soon_threadsafe(begin)
        try:
            await done.wait()
        except trio.Cancelled:
            loop = self.loop
            if box and loop is not None:
                loop.call_soon_threadsafe(box[0].cancel)
            raise
        return box[-1].result()
