"""Attacks on a running service, each made as a hostile client would make it, over real sockets.

They serve twice: the tests that prove each hole closed (`tests/test_abuse_*.py`) drive them, and the abuse run
(`python -m loadtest.abuse`) measures a steady writer and `/healthz` with and without each.

Each module here lists its attacks in `ATTACKS`: name -> a function of a `Target` that returns a context manager.
The attack runs while the `with` block does, in threads or processes of its own (never in the caller's event loop,
so a stalled service cannot stall the measurement), and stops when the block ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Target:
    """The service under attack."""

    base_url: str                      # http://127.0.0.1:PORT
    pid: int | None = None             # the service's process (for its RSS and descriptors), when known
    # Clients configured in the service's auth file, by role: "writer" holds every grant, "nogrant" none.
    # Empty when the service runs without authentication.
    clients: dict[str, tuple[str, str]] = field(default_factory=dict)   # role -> (client id, secret)
