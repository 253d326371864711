"""Tables waiting for background work (UniForm's conversions, Delta publishing), each taken by one task at a time.

A table wanted however many times while it waits is queued once. A table wanted while a task works on it is
queued again when that work ends: what it was wanted for may have come after the work read the table.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator

import trio


class TableQueue:
    def __init__(self) -> None:
        self.queued: set[uuid.UUID] = set()
        self.running: set[uuid.UUID] = set()
        self.again: set[uuid.UUID] = set()
        self._send, self._receive = trio.open_memory_channel[uuid.UUID](math.inf)

    def want(self, table_id: uuid.UUID) -> None:
        """Never waits (the registry's watch hooks call it in an actor's task)."""
        if table_id in self.running:
            self.again.add(table_id)
        elif table_id not in self.queued:
            self.queued.add(table_id)
            self._send.send_nowait(table_id)

    async def __aiter__(self) -> AsyncIterator[uuid.UUID]:
        """The next table to work on; several tasks may take from one queue. A task ends each table's work with
        `done` (in a `finally`)."""
        async for table_id in self._receive:
            self.queued.discard(table_id)
            self.running.add(table_id)
            yield table_id

    def done(self, table_id: uuid.UUID) -> bool:
        """The task's work on the table ended; True if it was wanted meanwhile (the caller queues it again, with
        `want`, unless it has a reason to wait)."""
        self.running.discard(table_id)
        if table_id in self.again:
            self.again.discard(table_id)
            return True
        return False
