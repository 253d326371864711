"""Attacks on the commit feed (`GET /api/coordinator/v1/events`, docs/events.md) by clients that may read little
or nothing (issue 39, rows 5 and 6).

- `feed-probe-hidden-table`: the "writer" client creates a table and commits to it 6 times; every other client
  of the target (those that may not read it: "nogrant", and any other role) then asks the feed about it by name
  (`table=`) and about a name that does not exist, following `next` page by page (`limit=1`) from the start of the
  feed and from a token taken before the table existed, over and over. Any difference between the two answers
  (events, `next`, status) tells the prober the table exists and how many commits it has.
- `feed-long-poll-flood`: one client ("nogrant" by default) holds as many long-polls (`wait`) open as it can,
  each on a connection of its own, each asking again as soon as it is answered (after Retry-After if refused).

Each yields a report that fills in while the block runs (see `ProbeReport`, `FloodReport`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator
from urllib.parse import urlencode

import httpx
import orjson
import trio

from ..http import HttpConnection
from . import Target

EVENTS = "/api/coordinator/v1/events"
SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
COMMITS = 6
CHAIN_MAX = 50   # pages a probe follows before it gives up on `next` settling


def token(target: Target, role: str) -> str | None:
    """A bearer token for the target's client of `role` (None without authentication)."""
    if role not in target.clients:
        return None
    client_id, secret = target.clients[role]
    r = httpx.post(f"{target.base_url}/v1/oauth/tokens", timeout=30, data={
        "grant_type": "client_credentials", "client_id": client_id, "client_secret": secret, "scope": "catalog"})
    r.raise_for_status()
    return r.json()["access_token"]


def _headers(bearer: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {bearer}"} if bearer else {}


# -- feed-probe-hidden-table ---------------------------------------------------------------------------------------

Answer = tuple[int, tuple[str, ...], str | None]   # status, the events' sequences, `next` (or the error's type)


@dataclass
class ProbeRound:
    """One round of one prober from one start: the pages it got for the table and for the missing name. `stable`:
    it asked about the table again after the missing name and got what it got the first time (nothing moved the
    feed meanwhile), so the two answers were given at the same moment and must be alike."""

    prober: str
    start: str          # "oldest" (no `after`) or "before" (a token from before the table existed)
    table: list[Answer]
    missing: list[Answer]
    stable: bool

    @property
    def leaks(self) -> bool:
        return self.stable and self.table != self.missing


@dataclass
class ProbeReport:
    table: str = ""                 # the hidden table's name as `subject` spells it
    missing: str = ""               # a name no table has
    writer_sees: int = 0            # the table's events as a client that may read it sees them
    rounds: list[ProbeRound] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def stable_rounds(self) -> list[ProbeRound]:
        return [r for r in self.rounds if r.stable]

    def leaks(self) -> list[ProbeRound]:
        return [r for r in self.rounds if r.leaks]

    def wait_rounds(self, n: int, timeout_s: float = 30.0) -> None:
        """Until `n` stable rounds of every prober and start were made."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            kinds = Counter((r.prober, r.start) for r in self.stable_rounds())
            if kinds and len(kinds) == len(set((r.prober, r.start) for r in self.rounds)) and min(kinds.values()) >= n:
                return
            time.sleep(0.05)
        raise TimeoutError(f"{len(self.stable_rounds())} stable probe rounds in {timeout_s:g} s; errors: "
                           f"{self.errors[:3]}")


def _follow(http: httpx.Client, name: str, after: str | None) -> list[Answer]:
    """The pages of the feed filtered to table `name`, one event each, following `next` until it settles."""
    chain: list[Answer] = []
    for _ in range(CHAIN_MAX):
        r = http.get(EVENTS, params={"table": name, "limit": 1, **({"after": after} if after else {})})
        if r.status_code != 200:
            chain.append((r.status_code, (), r.json().get("error", {}).get("type")))
            return chain
        page = r.json()
        chain.append((200, tuple(e["sequence"] for e in page["events"]), page["next"]))
        if page["next"] == after:
            return chain
        after = page["next"]
    return chain


@contextmanager
def probe_hidden_table(target: Target, *, interval_s: float = 0.05) -> Iterator[ProbeReport]:
    report = ProbeReport()
    probers = {role: token(target, role) for role in target.clients if role != "writer"} or {"anonymous": None}
    writer = httpx.Client(base_url=target.base_url, timeout=30, headers=_headers(token(target, "writer")))
    clients = {role: httpx.Client(base_url=target.base_url, timeout=30, headers=_headers(bearer))
               for role, bearer in probers.items()}
    # Tokens from before the table existed: each prober follows the feed from there too.
    before = {role: http.get(EVENTS).json()["next"] for role, http in clients.items()}
    namespace = f"feedprobe_{uuid.uuid4().hex[:8]}"
    report.table, report.missing = f"{namespace}.hidden", f"{namespace}.missing"
    _ok(writer.post("/v1/namespaces", json={"namespace": [namespace]}))
    _ok(writer.post(f"/v1/namespaces/{namespace}/tables", json={"name": "hidden", "schema": SCHEMA}))
    for i in range(COMMITS):
        _ok(writer.post(f"/v1/namespaces/{namespace}/tables/hidden", json={"requirements": [], "updates": [
            {"action": "set-properties", "updates": {"probe": str(i)}}]}))
    report.writer_sees = len(writer.get(EVENTS, params={"table": report.table, "limit": 1000}).json()["events"])
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            for role, http in clients.items():
                for start, after in (("oldest", None), ("before", before[role])):
                    try:
                        table = _follow(http, report.table, after)
                        missing = _follow(http, report.missing, after)
                        again = _follow(http, report.table, after)
                    except (httpx.HTTPError, ValueError) as exc:
                        report.errors.append(f"{role}: {exc!r}")
                        continue
                    report.rounds.append(ProbeRound(role, start, table, missing, stable=again == table))
            stop.wait(interval_s)

    thread = threading.Thread(target=run, name="feed-probe-hidden-table", daemon=True)
    thread.start()
    try:
        yield report
    finally:
        stop.set()
        thread.join(60)
        for http in (writer, *clients.values()):
            http.close()


def _ok(r: httpx.Response) -> None:
    if r.status_code != 200:
        raise RuntimeError(f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:300]}")


# -- feed-long-poll-flood ------------------------------------------------------------------------------------------


@dataclass
class FloodReport:
    polls: int = 0
    sent: int = 0                    # requests sent so far
    answered: Counter = field(default_factory=Counter)   # status -> how many
    retry_after: Counter = field(default_factory=Counter)   # of the refusals (429, 503): their Retry-After values
    errors: Counter = field(default_factory=Counter)     # connection errors by kind
    refused_s: list[float] = field(default_factory=list)   # how long each refusal took to come

    @property
    def outstanding(self) -> int:
        """Requests sent and not answered: the long-polls the service holds."""
        return self.sent - sum(self.answered.values()) - sum(self.errors.values())

    def settle(self, quiet_s: float = 0.5, timeout_s: float = 30.0) -> None:
        """Until every poll was sent and nothing was answered for `quiet_s`: those the service holds are waiting."""
        deadline, last, quiet_since = time.monotonic() + timeout_s, None, time.monotonic()
        while time.monotonic() < deadline:
            now, seen = time.monotonic(), (self.sent, sum(self.answered.values()), sum(self.errors.values()))
            if seen != last:
                last, quiet_since = seen, now
            elif self.sent >= self.polls and now - quiet_since >= quiet_s:
                return
            time.sleep(0.05)
        raise TimeoutError(f"flood not settled in {timeout_s:g} s: {self.sent} sent, {self.outstanding} waiting, "
                           f"answers {dict(self.answered)}, errors {dict(self.errors)}")


@contextmanager
def long_poll_flood(target: Target, *, polls: int = 1000, wait_s: float = 60.0, role: str = "nogrant",
                    retry_refused: bool = True) -> Iterator[FloodReport]:
    """`polls` long-polls of `wait_s`, each on its own connection, asked again at once when answered; a refused
    one (429, 503) asks again after its Retry-After if `retry_refused`, else is given up."""
    report = FloodReport(polls=polls)
    bearer = token(target, role)
    headers = _headers(bearer)
    started = threading.Event()
    handle: dict = {}

    async def poll(connection: HttpConnection, connects: trio.Semaphore) -> None:
        try:
            await _poll(connection, connects)
        finally:
            with trio.CancelScope(shield=True):
                await connection.close()

    async def _poll(connection: HttpConnection, connects: trio.Semaphore) -> None:
        after = None
        while True:
            path = EVENTS + "?" + urlencode({"wait": wait_s, **({"after": after} if after else {})})
            try:
                if connection.stream is None:
                    async with connects:
                        await connection.connect()
                sent = time.monotonic()
                report.sent += 1
                status, body = await connection.request("GET", path, headers=headers)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                report.errors[type(exc).__name__] += 1
                await trio.sleep(0.5)
                continue
            report.answered[status] += 1
            if status == 200:
                after = orjson.loads(body)["next"]
            elif status in (429, 503):
                report.refused_s.append(time.monotonic() - sent)
                retry = connection.headers.get("retry-after")
                report.retry_after[retry] += 1
                if not retry_refused:
                    return
                await trio.sleep(float(retry or 1))
            else:
                await trio.sleep(0.5)

    async def main() -> None:
        connects = trio.Semaphore(64)   # connections being opened at once
        async with trio.open_nursery() as nursery:
            handle["cancel"] = nursery.cancel_scope.cancel
            handle["token"] = trio.lowlevel.current_trio_token()
            started.set()
            for _ in range(polls):
                nursery.start_soon(poll, HttpConnection(target.base_url), connects)

    thread = threading.Thread(target=trio.run, args=(main,), name="feed-long-poll-flood", daemon=True)
    thread.start()
    started.wait(30)
    try:
        yield report
    finally:
        trio.from_thread.run_sync(handle["cancel"], trio_token=handle["token"])
        thread.join(60)


ATTACKS = {"feed-probe-hidden-table": probe_hidden_table, "feed-long-poll-flood": long_poll_flood}
