"""The clean-ups a proposal may carry to a table's owner in a cluster, and nothing else that runs.

A proposal sometimes holds what to do once its commit is durable (delete a dropped table's files, a Lance writer's
published staging manifest), as a `functools.partial`. Between cluster members (coordinator/cluster/wire.py) such
a partial crosses by name, and a receiving member rebuilds it only from this list: functions registered with
`crossable`, or the methods in CROSSABLE_METHODS of its own process-local objects (its file IO).
"""

from __future__ import annotations

from typing import Any, Callable

CROSSABLE: dict[str, Callable[..., Any]] = {}
CROSSABLE_METHODS = frozenset({"delete"})   # FileIO.delete(uri, within=...)


def crossable(fn):
    """Let partials of `fn` (a module-level function of the project) cross between members, by name."""
    CROSSABLE[f"{fn.__module__}:{fn.__qualname__}"] = fn
    return fn
