"""Crash points for the chaos test: the service kills itself at named points of its commit path
(`storage/faults.py`), armed per start with only the points hit fewer than the target so far."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

from tests.support import ServerProcess

# Crash points (storage/faults.py) and the probability each is armed with: the rarer a point's path (a group
# commit of several tables, a cross-table transaction), the likelier a kill once there.
CRASH_POINTS = {"after-files": 0.03, "cross-table-mid": 0.3, "group-commit-mid": 0.5, "before-publish": 0.03,
                "before-reply": 0.01}
CRASH_WAIT_S = 60     # a cycle without any armed point hit in this long ends the run (reported as missed)


class AimedCrashes:
    """Arms the service's crash points for each start, only those hit fewer than `target` times so far, and counts
    the hits from the file each dying process appends its point's name to."""

    def __init__(self, workdir: Path, target: int):
        self.log, self.target = workdir / "crash-points.log", target

    def hits(self) -> Counter[str]:
        lines = self.log.read_text().split() if self.log.exists() else []
        return Counter({p: lines.count(p) for p in CRASH_POINTS})

    def missing(self) -> list[str]:
        hits = self.hits()
        return [p for p in CRASH_POINTS if hits[p] < self.target]

    def env(self, points: list[str]) -> dict[str, str]:
        return {"COORDINATOR_CRASH_POINTS": ",".join(f"{p}:{CRASH_POINTS[p]}" for p in points),
                "COORDINATOR_CRASH_LOG": str(self.log)}



def start_armed(server: ServerProcess, attempts: int = 5, timeout_s: float = 120) -> None:
    """Start a server that may kill itself at a crash point before it is ready (a restore on start-up may
    commit): start again."""
    for attempt in range(attempts):
        try:
            server.start(timeout_s)
            return
        except RuntimeError:
            if server.proc is None or server.proc.poll() != -signal.SIGKILL or attempt == attempts - 1:
                raise


def wait_for_death(server: ServerProcess, timeout_s: float) -> float:
    """Seconds until the server died by itself (or `timeout_s`, it still running)."""
    t0 = time.monotonic()
    while server.proc.poll() is None and time.monotonic() - t0 < timeout_s:
        time.sleep(0.05)
    return time.monotonic() - t0
