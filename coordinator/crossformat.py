"""Commits across formats: Iceberg, Delta and Lance tables changed in one atomic commit.

Each part is planned by its own format's service (`plan_commit`: the name resolved, what the part must read read,
the proposal its table's actor will decide), exactly as that format's own commit is. Then all parts take the one
path every commit spanning tables takes (coordinator/transaction.py): each actor decides its part against its
table's state and holds the table, every row is written in one database transaction, and every actor takes the
outcome. So all parts apply or none does, a crash in between included, and a part's refusal says which part.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import orjson

from .decision import PlannedPart
from .errors import CoordinatorError
from .idempotency import IdempotencyKey


async def commit(registry, planners: list[Callable[[], Awaitable[PlannedPart]]],
                 key: IdempotencyKey | None) -> list[Any]:
    """Plan each part, then commit them all atomically; the parts' answers, in order. A refusal raised for one
    part carries its index (`CoordinatorError.part`). With `key`, the answer is recorded with the commit."""
    planned = []
    for i, plan in enumerate(planners):
        try:
            planned.append(await plan())
        except CoordinatorError as exc:
            exc.part = i
            raise

    results: list[Any] = []

    def receipt(replies: list[Any]):
        """The answer, recorded in the commit's own transaction (the replies are known once every part is decided)."""
        results.extend(p.answer(reply) for p, reply in zip(planned, replies))
        return key.record(200, orjson.dumps({"results": results})) if key is not None else None

    await registry.transact([(p.table_id, p.proposal) for p in planned], idempotency=receipt)
    return results
