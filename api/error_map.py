"""How a protocol words the coordinator's errors: one table per protocol, of the same shape in every protocol.

The coordinator raises one class per outcome a client can tell apart (coordinator/errors.py); each protocol's
`errors.py` says, in an `ErrorMap`, which status and which of its own error types or codes each class gets (Iceberg's
`NoSuchTableException`, Unity Catalog's `TABLE_DOES_NOT_EXIST`, Lance's code 4), and writes its error body from that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from coordinator.errors import CoordinatorError

K = TypeVar("K")   # the protocol's error type (a name) or code (a name or a number)


@dataclass(frozen=True)
class ErrorMap(Generic[K]):
    """`rows`: (class, status, type), the most specific class first: the first class an error is an instance of
    gives its status and type; a status of None keeps the error's own (`CoordinatorError.status`). An error no row
    names is `fault`'s if its status says the server failed (5xx: whether anything applied may be unknown, so never
    worded as the client's bad input), else `otherwise`'s."""

    rows: tuple[tuple[type[CoordinatorError], int | None, K], ...]
    fault: tuple[int | None, K]
    otherwise: tuple[int | None, K]

    def __call__(self, exc: CoordinatorError) -> tuple[int, K]:
        """The status and the protocol's type or code for `exc`."""
        for cls, status, kind in self.rows:
            if isinstance(exc, cls):
                break
        else:
            status, kind = self.fault if exc.status >= 500 else self.otherwise
        return (exc.status if status is None else status), kind
