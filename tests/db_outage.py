"""Commit load from all three protocols while something happens to the database (a test's `fault`), logging every
answer, then every answer checked against what the tables hold: 2xx present at its version, 503 ("nothing
applied, retry") absent, no other 5xx, and the tables' versions contiguous with nothing lost or duplicated.

Each writer sends each commit ONCE and moves on, whatever the answer, so that every answer is tested on its own;
the chaos test's retrying clients (tests/test_chaos.py) are the other half.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.test_chaos import (TABLES, ClientLog, DeltaWriter, Figures, IcebergWriter, LanceWriter, Outcome, Writer,
                              check, read_state, set_up)
from tests.support import uuid7

WRITERS_PER_FORMAT = len(TABLES)   # writer w commits to TABLES[w]: every table is written and read back
CLIENT_TIMEOUT_S = 60    # longer than the service takes to settle a commit's outcome


@dataclass
class Answer:
    fmt: str
    table: str
    cid: str
    code: int | str        # the HTTP status, or the client error's class when no answer came
    sent: float            # time.monotonic() when the commit was sent
    at: float              # ... and when its answer came
    retry_after: str | None = None


class Answers:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[Answer] = []

    def add(self, a: Answer) -> None:
        with self._lock:
            self.items.append(a)

    def by_status(self) -> Counter:
        with self._lock:
            return Counter(a.code for a in self.items)


class OneAttempt(Writer):
    """A chaos writer that sends each commit once and logs the answer."""

    answers: Answers

    def commit_once(self) -> None:
        cid = uuid.uuid4().hex
        prepared = self.prepare(cid)
        if prepared is None:
            return
        body, version = prepared
        key = uuid7()
        sent = time.monotonic()
        try:
            r = self.post(body, key)
        except httpx.HTTPError as exc:
            code, retry_after, status = type(exc).__name__, None, "unknown"
        else:
            code, retry_after = r.status_code, r.headers.get("Retry-After")
            status = "acked" if code < 300 else "rejected" if code < 500 else "unknown"
        self.answers.add(Answer(self.fmt, self.table, cid, code, sent, time.monotonic(), retry_after))
        self.log.record(Outcome(self.fmt, self.table, cid, status, version, status == "unknown"))
        self.settle(status)
        if status == "unknown":
            time.sleep(0.05)


def _once(cls: type[Writer]) -> type[Writer]:
    return type(cls.__name__ + "Once", (OneAttempt, cls), {})


ONCE = {"iceberg": _once(IcebergWriter), "delta": _once(DeltaWriter), "lance": _once(LanceWriter)}


@dataclass
class FaultSeen:
    """One fault as the writers saw it."""

    name: str
    at: float                                   # time.monotonic() when it struck
    done: float                                 # ... and when the fault's action had returned
    # per format: seconds from the fault to the first 2xx answer to a commit sent after it (None: none came)
    resumed_s: dict[str, float | None] = field(default_factory=dict)
    # per format: the longest time without a 2xx answer, from the last one before the fault struck to the first
    # one to a commit sent after its action returned (None: none came)
    longest_gap_s: dict[str, float | None] = field(default_factory=dict)


@dataclass
class OutageRun:
    answers: list[Answer]
    figures: Figures
    faults: list[FaultSeen]
    found: set[tuple[str, str, str]]   # (format, table, commit id) of every commit the tables hold

    @property
    def fault_at(self) -> float:
        return self.faults[0].at

    @property
    def outage_s(self) -> dict[str, float | None]:
        """Per format, the slowest resumption after any fault (None if commits never resumed after one)."""
        out: dict[str, float | None] = {}
        for fmt in ONCE:
            seen = [f.resumed_s.get(fmt) for f in self.faults]
            out[fmt] = None if any(s is None for s in seen) else max(seen, default=0.0)
        return out

    def by_status(self) -> dict[str, Counter]:
        out: dict[str, Counter] = {}
        for a in self.answers:
            out.setdefault(a.fmt, Counter())[a.code] += 1
        return out

    def problems(self) -> list[str]:
        """Answers that the tables contradict, and answers no client may get."""
        bad = []
        for a in self.answers:
            key = (a.fmt, a.table, a.cid)
            if a.code == 503:
                if not a.retry_after:
                    bad.append(f"{a.fmt} {a.table}: 503 without Retry-After")
                if key in self.found:
                    bad.append(f"{a.fmt} {a.table}: commit {a.cid} answered 503 (nothing applied) is present")
            elif isinstance(a.code, int) and a.code >= 500:
                bad.append(f"{a.fmt} {a.table}: commit {a.cid} answered {a.code}")
        return bad

    def table(self) -> str:
        rows = self.by_status()
        codes = sorted({a.code for a in self.answers}, key=str)
        lines = ["| format | " + " | ".join(str(c) for c in codes) + " | outage seen (s) |",
                 "|---|" + "---|" * len(codes) + "---|"]
        for fmt, counts in sorted(rows.items()):
            seen = self.outage_s.get(fmt)
            lines.append(f"| {fmt} | " + " | ".join(str(counts.get(c, 0)) for c in codes)
                         + f" | {'never recovered' if seen is None else f'{seen:.1f}'} |")
        return "\n".join(lines)


Fault = Callable[[], float | None]


def run_under_load(base: str, database_url: Callable[[], str], fault: Fault | list[tuple[str, Fault]], *,
                   before_s: float = 2.0, after_s: float = 4.0, recover_timeout_s: float = 45.0,
                   between: Callable[[], None] | None = None) -> OutageRun:
    """Load from WRITERS_PER_FORMAT writers per format; after `before_s`, `fault()` runs (it returns once the
    database may serve again, and may return the time.monotonic() it struck at); the load goes on until every format has committed again and `after_s` more.
    `fault` may be a list of named faults, injected in turn under the same load, each once the previous one is
    over and `between()` (the database ready for the next) has returned. `database_url()` is where to read the
    tables' state from afterwards."""
    faults = fault if isinstance(fault, list) else [("fault", fault)]
    tables = set_up(base)
    log, answers, stop, give_up = ClientLog(), Answers(), threading.Event(), threading.Event()
    writers: list[Writer] = []
    for w in range(WRITERS_PER_FORMAT):
        t = TABLES[w]
        for fmt, cls in ONCE.items():
            kw = {"table_info": tables.delta[t]} if fmt == "delta" else {"location": tables.lance[t]} \
                if fmt == "lance" else {}
            writer = cls(base, t, log, stop, give_up, patient=False, **kw)
            writer.http.close()
            writer.http = httpx.Client(base_url=base, timeout=CLIENT_TIMEOUT_S)
            writer.answers = answers
            writers.append(writer)
    threads = [threading.Thread(target=w.run, name=f"{w.fmt}-{w.table}", daemon=True) for w in writers]
    for th in threads:
        th.start()
    seen: list[FaultSeen] = []
    try:
        time.sleep(before_s)
        for i, (name, inject) in enumerate(faults):
            if i and between is not None:
                between()
                time.sleep(before_s)
            at = time.monotonic()
            struck = inject()   # a fault that first looks around returns when it struck
            done = time.monotonic()
            if struck is not None:
                at = struck
            seen.append(FaultSeen(name, at, done))
            deadline = time.monotonic() + recover_timeout_s
            while time.monotonic() < deadline:
                recovered = {a.fmt for a in answers.items if a.sent > done and _ok(a)}
                if recovered >= set(ONCE):
                    break
                time.sleep(0.2)
            time.sleep(after_s)
            print(f"  {name} (over after {done - at:.1f} s): {_resumed(answers.items, at)}", flush=True)
    finally:
        stop.set()
        for th in threads:
            th.join(CLIENT_TIMEOUT_S)
        give_up.set()
        for th in threads:
            th.join(10)
    assert not any(th.is_alive() for th in threads), "a writer is stuck"
    states = read_state(base, database_url(), tables)
    found = {(s.fmt, s.table, cid) for s in states for _, cid in s.entries if cid}
    for f in seen:
        for fmt in ONCE:
            acks = sorted(a.at for a in answers.items if a.fmt == fmt and _ok(a))
            after = [a.at for a in answers.items if a.fmt == fmt and a.sent > f.at and _ok(a)]
            f.resumed_s[fmt] = min(after) - f.at if after else None
            over = [a.at for a in answers.items if a.fmt == fmt and a.sent > f.done and _ok(a)]
            f.longest_gap_s[fmt] = _longest_gap(acks, f.at, min(over)) if over else None
    return OutageRun(list(answers.items), check(log.outcomes, states), seen, found)


def _longest_gap(acks: list[float], at: float, until: float) -> float:
    """The longest time between consecutive acknowledgements (`acks`, sorted) from the last one before `at` to
    `until`."""
    window = [t for t in acks if t <= at][-1:] + [t for t in acks if at < t <= until]
    if len(window) < 2:
        return until - at
    return max(b - a for a, b in zip(window, window[1:]))


def _resumed(answers: list[Answer], at: float) -> str:
    """Progress: how long after the fault each format had its first acknowledgement."""
    out = []
    for fmt in ONCE:
        after = [a.at for a in answers if a.fmt == fmt and a.sent > at and _ok(a)]
        out.append(f"{fmt} {min(after) - at:.1f} s" if after else f"{fmt} not yet")
    return "commits resumed after " + ", ".join(out)


def _ok(a: Answer) -> bool:
    return isinstance(a.code, int) and a.code < 300


def writer_events(server_log: Path) -> str:
    """How often the service's group-commit writer met each kind of failed write (its warnings in the log)."""
    text = server_log.read_text(errors="replace") if server_log.exists() else ""
    return (f"writes refused unsent: {text.count('before the group write was sent')}, "
            f"outcomes read back after a lost connection: {text.count('resolving outcome')}, "
            f"left unknown: {text.count('outcome of an interrupted write is unknown')}")
