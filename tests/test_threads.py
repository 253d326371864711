"""The two ways trio code reaches another thread: the asyncio thread asyncpg runs on (storage/bridge.py) and the
worker threads of the file IO (storage/worker.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import trio

from storage import worker
from storage.bridge import AsyncioThread


@pytest.fixture
def loop_thread():
    thread = AsyncioThread()
    thread.start()
    yield thread
    thread.stop()


async def test_a_call_returns_its_result_or_raises_its_error(loop_thread):
    async def answer():
        return threading.current_thread().name

    async def fail():
        raise ValueError("from the asyncio thread")

    assert await loop_thread.call(answer) == "storage-asyncio"
    with pytest.raises(ValueError, match="from the asyncio thread"):
        await loop_thread.call(fail)


async def test_concurrent_calls_each_get_their_own_result(loop_thread):
    results = {}

    async def call(i: int) -> None:
        async def value():
            await asyncio.sleep(0.001 * (i % 3))
            return i
        results[i] = await loop_thread.call(value)

    async with trio.open_nursery() as nursery:
        for i in range(200):
            nursery.start_soon(call, i)
    assert results == {i: i for i in range(200)}


async def test_cancelling_the_trio_side_cancels_the_asyncio_task(loop_thread):
    started, cancelled = threading.Event(), threading.Event()

    async def slow():
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with trio.move_on_after(0.2) as scope:
        await loop_thread.call(slow)
    assert scope.cancelled_caught and started.is_set()
    await trio.to_thread.run_sync(cancelled.wait, 5)
    assert cancelled.is_set()

    async def after():
        return "still serving"
    assert await loop_thread.call(after) == "still serving"


async def test_a_worker_thread_runs_the_work_and_ends_when_idle(monkeypatch):
    monkeypatch.setattr(worker, "IDLE_S", 0.05)
    files = worker.WorkerThread("test-worker")

    def fail():
        raise OSError("disk full")

    assert await files.run_sync(lambda: threading.current_thread().name) == "test-worker"
    with pytest.raises(OSError, match="disk full"):
        await files.run_sync(fail)
    await trio.sleep(0.3)   # idle: the thread ends ...
    assert "test-worker" not in {t.name for t in threading.enumerate()}
    assert await files.run_sync(lambda: 6 * 7) == 42   # ... and starts again on the next call
