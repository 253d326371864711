"""What travels through a table actor's mailbox (coordinator/actor.py): a request and the reply its requester
awaits, and a part of a commit that spans several tables with the verdict its actor waits for."""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from .decision import Proposal
from .errors import CoordinatorError

# The commit the current request's task was last told applied: (format, table name, version). Set by `Reply.wait`
# in the requester's task, so the HTTP layer can log what a request committed.
COMMITTED: contextvars.ContextVar[tuple[str, str, int] | None] = contextvars.ContextVar("committed", default=None)


class Reply:
    """A one-shot answer slot the requester awaits."""

    __slots__ = ("_event", "value", "error", "committed")

    def __init__(self) -> None:
        self._event = trio.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.committed: tuple[str, str, int] | None = None  # set with the value of an applied commit

    def set(self, value: Any) -> None:
        if not self._event.is_set():
            self.value = value
            self._event.set()

    def fail(self, error: BaseException) -> None:
        if not self._event.is_set():
            # The requester raises it afresh; the actor's frames in its traceback would only be kept alive.
            self.error = error.with_traceback(None)
            self._event.set()

    async def wait(self) -> Any:
        await self._event.wait()
        error = self.error
        if error is None:
            if self.committed is not None:
                COMMITTED.set(self.committed)
            return self.value
        # Raised once, then let go: an error kept here (or in this frame) would tie a reference cycle through
        # its traceback, and every rejected commit (409s come by the thousand) would wait for the cyclic GC.
        self.error = None
        try:
            raise error
        finally:
            del error


@dataclass
class Request:
    proposal: Proposal
    reply: Reply = field(default_factory=Reply)
    arrived: float = field(default_factory=time.perf_counter)  # for the commit-latency histogram


class Verdict:
    """The transaction's outcome as seen by one participant: applied, or not (with the error to raise). Applied
    with an Unpublished error: its published files are not written yet."""

    def __init__(self) -> None:
        self.event = trio.Event()
        self.applied = False
        self.error: CoordinatorError | None = None

    def decide(self, applied: bool, error: CoordinatorError | None = None) -> None:
        if not self.event.is_set():
            self.applied, self.error = applied, error
            self.event.set()


@dataclass
class Participant:
    """Sent to an actor's mailbox. The actor answers its reply with (the proposal's reply, its commit `Part`) once
    its part is decided, then waits for `verdict` before serving anything else."""

    proposal: Proposal
    verdict: Verdict = field(default_factory=Verdict)
