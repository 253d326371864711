"""How each protocol's real client waits before it retries a commit that lost a race (HTTP 409).

The hot-table figures depend on this more than on anything the server does: 8 writers that retry at once keep
colliding, while writers that back off let one of them commit several times in a row. So the flows wait as the
clients do, and `at-once` (the flows' old behaviour, no wait and no limit) stays available to compare.

* Iceberg, Java client (`org.apache.iceberg.util.Tasks` with the table defaults `commit.retry.num-retries=4`,
  `commit.retry.min-wait-ms=100`, `commit.retry.max-wait-ms=60000`, scale 2): the k-th retry waits
  min(100 * 2^(k-1), 60000) ms plus up to 10% jitter, then refreshes the table and commits again; after 4
  retries the commit fails with CommitFailedException.
* Lance (`commit_transaction` with `SlotBackoff` and `num_retries=20`): the wait is a random slot of 4, then 8,
  16, ... slots, each slot 1.1x as long as the first attempt took; 20 attempts in all.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod

MODES = ("client", "at-once")


class Retry(ABC):
    """One logical commit's retry schedule."""

    def __init__(self, rng: random.Random, started: float):
        self.rng = rng
        self.started = started   # perf_counter() when the commit's first attempt began
        self.attempts = 1        # attempts made so far (the first is under way)

    def next_wait(self, now: float, deadline: float = math.inf) -> float | None:
        """After a failed attempt: seconds to wait before the next one (never past `deadline`, the end of the
        run), or None when the client gives up."""
        delay = self._delay(now)
        return None if delay is None else min(delay, max(deadline - now, 0.0))

    @abstractmethod
    def _delay(self, now: float) -> float | None:
        """The client's own wait before the next attempt, or None once it gives up."""


class AtOnce(Retry):
    def _delay(self, now: float) -> float | None:
        self.attempts += 1
        return 0.0


class IcebergJava(Retry):
    RETRIES, MIN_WAIT_MS, MAX_WAIT_MS, SCALE = 4, 100, 60_000, 2.0

    def _delay(self, now: float) -> float | None:
        if self.attempts > self.RETRIES:
            return None
        delay_ms = int(min(self.MIN_WAIT_MS * self.SCALE ** (self.attempts - 1), self.MAX_WAIT_MS))
        jitter_ms = self.rng.randrange(max(1, int(delay_ms * 0.1)))
        self.attempts += 1
        return (delay_ms + jitter_ms) / 1000


class LanceSlots(Retry):
    ATTEMPTS, FIRST_SLOTS = 20, 4

    def __init__(self, rng: random.Random, started: float):
        super().__init__(rng, started)
        self.unit_s = 0.0

    def _delay(self, now: float) -> float | None:
        if self.attempts >= self.ATTEMPTS:
            return None
        if self.attempts == 1:
            self.unit_s = (now - self.started) * 1.1
        slots = self.FIRST_SLOTS * 2 ** (self.attempts - 1)
        self.attempts += 1
        return self.rng.randrange(slots) * self.unit_s


CLIENT = {"iceberg": IcebergJava, "lance": LanceSlots}


def schedule(protocol: str, mode: str, rng: random.Random, started: float) -> Retry:
    """The retry schedule for one logical commit of `protocol` ("iceberg" or "lance")."""
    if mode == "at-once":
        return AtOnce(rng, started)
    if mode != "client":
        raise ValueError(f"retry mode {mode!r}: choose one of {', '.join(MODES)}")
    return CLIENT[protocol](rng, started)
