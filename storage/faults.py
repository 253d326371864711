"""Crash points for fault-injection tests: the process kills itself at a named point of the commit path.

Off unless `COORDINATOR_CRASH_POINTS` is set when the process starts (`name:probability,...`, e.g.
`after-files:0.05,before-reply:0.01`). Callers check the module constant `ARMED` first, so an unarmed process
pays one attribute test per point. Each kill first appends the point's name (one line) to the file named by
`COORDINATOR_CRASH_LOG`, if set, so that a test can count how often each point was hit.

It lives in `storage/` because the writer's points are here and the coordinator may import storage (not the
reverse)."""

from __future__ import annotations

import os
import random
import signal

# The points, in the order a commit passes them.
POINTS = (
    "after-files",        # the commit's fresh table files are durable; its database transaction has not started
    "cross-table-mid",    # a multi-table commit's transaction has written its first table's row, not the others
    "group-commit-mid",   # a group commit's transaction (three or more tables) has executed its rows, not committed
    "before-publish",     # the transaction committed; Lance's final manifest is not yet in place
    "before-reply",       # the commit is durable (rows and files); nobody has been answered yet
    # The service's own snapshot expiry (coordinator/maintenance):
    "expiry-claimed",     # the claim on what expired snapshots' files may leave is recorded; no expiry committed
    "expiry-committed",   # the expiry is durable; the deletion of what only its snapshots referenced has not begun
    "mid-deletion",       # that deletion deleted the content files, not yet the manifests and manifest lists
)


def _parse(spec: str) -> dict[str, float]:
    armed: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, probability = item.partition(":")
        if name not in POINTS:
            raise SystemExit(f"COORDINATOR_CRASH_POINTS: unknown point {name!r}; known: {', '.join(POINTS)}")
        armed[name] = float(probability or 1)
    return armed


ARMED: dict[str, float] = _parse(os.environ.get("COORDINATOR_CRASH_POINTS", ""))
_LOG = os.environ.get("COORDINATOR_CRASH_LOG")


def hit(name: str) -> None:
    """Kill this process at point `name` with its armed probability (callers check `ARMED` first)."""
    probability = ARMED.get(name)
    if probability is None or random.random() >= probability:
        return
    if _LOG:
        with open(_LOG, "a") as f:   # the page cache survives a process kill: no fsync needed
            f.write(name + "\n")
    os.kill(os.getpid(), signal.SIGKILL)
