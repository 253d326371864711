"""The throttle of the public token endpoints' secret checks (api/oauth.py, Authority.client_credentials): who may
spend a check, how many wait, and on which hashing thread; and the tarpit that answers its refusals no faster than
they say to ask again."""

from __future__ import annotations

import ipaddress
import math
import os
import threading
import time
from typing import Any, Callable

import trio

from storage.worker import WorkerThread

from .errors import TooManyRequests, Unavailable


class Throttle:
    """The secret checks of the public token endpoints (scrypt: ~50 ms of a core each, on purpose), bounded so that
    nobody can queue unbounded work or guess fast, and so that only a client itself can spend what it may do.

    Who asks is a client id (every id the auth file does not name counts as one, "anonymous") and the address the
    request came from (`source_key`). Failed checks are counted per address and per id (token buckets), successful
    ones per id. Before a check runs, it is refused at once (TooManyRequests, with when to retry) if:

    - its id's right secret was proven more than `burst` times at once, then `per_s` a second (only the right
      secret spends this);
    - its address has not proven this id's secret in the last PROVEN_S and either the address failed more than
      `failures_burst` times at once, then `failures_per_s` a second, or the id failed ID_FAILURES_SCALE times as
      often (more than one address alone can make it fail);
    - its address has proven this id's secret in the last PROVEN_S, and failed for it as often as one address may:
      for a client that signed in from an address before, only failures from that very address count.

    At most `queue_max` checks wait for the two hashing threads (HashingThreads, at the lowest CPU priority) or
    run; requests from addresses that have not proven the id they name take at most three quarters of those
    places, and unknown ids one quarter, and they hash on one of the two threads at a time, so that clients signing
    in again from where they did before always find room and a free thread. Beyond that: Unavailable.

    Unknown ids are checked against a dummy hash (Authority.client_credentials), so a check takes as long whether
    or not the id exists. (Client ids are not secret: while many unknown ids are refused, a configured one still
    answers 401 to a wrong secret.) Buckets are kept for the BUCKETS_MAX addresses and pairs used last: memory is
    bounded, and cycling through that many addresses to refill one takes as many failures."""

    THREADS = 2
    BUCKETS_MAX = 4096
    PROVEN_S = 24 * 3600.0
    # An id may fail this many times more often than an address: a single address cannot make its id's
    # failures run out (and so keep a client from signing in from a new address).
    ID_FAILURES_SCALE = 5

    def __init__(self, per_s: float, burst: int, queue_max: int, failures_per_s: float = 0.2,
                 failures_burst: int = 20):
        self.queue_max = queue_max
        self._successes = _Buckets(per_s, burst)                     # by configured client id
        self._source_failures = _Buckets(failures_per_s, failures_burst)  # by address
        self._id_failures = _Buckets(failures_per_s * self.ID_FAILURES_SCALE,
                                     failures_burst * self.ID_FAILURES_SCALE)  # by id (None: every unknown one)
        self._pair_failures = _Buckets(failures_per_s, failures_burst)    # by (id, address) that proved it
        self._proven: dict[tuple[str, str], float] = {}   # (id, address) -> when it last proved the id's secret
        self._hashing = HashingThreads(self.THREADS)
        # Checks from addresses that have not proven the id they name hash on one thread at a time: the other
        # stays free for clients signing in again, however many of those wait.
        self._unproven_hashing = trio.CapacityLimiter(1)
        self._checking = {"anonymous": 0, "unproven": 0, "proven": 0}   # checks waiting or running, by kind
        self.tarpit = Tarpit()

    async def check(self, client_id: str | None, source: str, verify: Callable[..., bool], *args: Any) -> bool:
        """`verify(*args)` on a hashing thread, if the rules admit it; `client_id` None for an id the auth file does
        not name. Returns what `verify` said, and counts it for `client_id` and `source`."""
        now = time.monotonic()
        pair = (client_id or "", source)
        proven = client_id is not None and now - self._proven.get(pair, -math.inf) < self.PROVEN_S
        if client_id is not None:
            _refuse_if_empty(self._successes, client_id, now, "too many tokens for this client")
        if proven:
            _refuse_if_empty(self._pair_failures, pair, now, "too many failed attempts for this client from this "
                                                             "address")
        else:
            _refuse_if_empty(self._source_failures, source, now, "too many failed attempts from this address")
            _refuse_if_empty(self._id_failures, client_id, now, "too many failed attempts for this client id")
        kind = "proven" if proven else "unproven" if client_id is not None else "anonymous"
        if not self._room(kind):
            raise Unavailable("too many token requests are waiting for their secret to be checked: retry shortly")
        # Each check is counted as failed until it succeeds, so that checks running at once cannot fail more
        # often than the buckets allow.
        failures = [(self._source_failures, source), (self._id_failures, client_id)] + \
            ([(self._pair_failures, pair)] if proven else [])
        for buckets, key in failures:
            buckets.take(key, now)
        self._checking[kind] += 1
        try:
            if proven:
                ok = await self._hashing.run(verify, *args)
            else:
                async with self._unproven_hashing:
                    ok = await self._hashing.run(verify, *args)
        finally:
            self._checking[kind] -= 1
        if ok and client_id is not None:
            now = time.monotonic()
            for buckets, key in failures:
                buckets.give_back(key, now)
            self._successes.take(client_id, now)
            self._proven.pop(pair, None)
            self._proven[pair] = now   # the most recently proven: last
            if len(self._proven) > self.BUCKETS_MAX:
                del self._proven[next(iter(self._proven))]
        return ok

    def _room(self, kind: str) -> bool:
        c, q = self._checking, self.queue_max
        if sum(c.values()) >= q:
            return False
        if kind != "proven" and c["anonymous"] + c["unproven"] >= max(1, q * 3 // 4):
            return False
        return kind != "anonymous" or c["anonymous"] < max(1, q // 4)


class HashingThreads:
    """The secret checks' threads (storage/worker.py's), `count` of them, each check at the lowest CPU priority
    (nice 19): a check takes the CPU that the event loop and the service's other threads leave, so that a burst of
    checks (each ~50 ms of a core, on purpose) does not slow the requests served meanwhile; on a busy machine the
    checks wait instead."""

    def __init__(self, count: int) -> None:
        self._places = trio.CapacityLimiter(count)
        self._free = [WorkerThread(f"secret-check-{i}") for i in range(count)]

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on a free thread, once one is free; not cancelled once begun."""
        async with self._places:
            thread = self._free.pop()
            try:
                return await thread.run_sync(_at_lowest_priority, fn, *args)
            finally:
                self._free.append(thread)


def _at_lowest_priority(fn: Callable[..., Any], *args: Any) -> Any:
    # Linux keeps a nice value per thread: this thread's only, which does nothing but checks.
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    return fn(*args)


class Tarpit:
    """Answers the throttle's refusals ("later": 429 or 503, with Retry-After) to who asks (Authority: a client id
    at an address, every unknown id one) no faster than they tell it to ask again. A refusal to one that asks again
    before the Retry-After it was last given is held until then; each refusal moves its next one on by its own
    Retry-After, however many connections it asks on.

    A refused request costs the service a whole request's work (connection, parsing, routing, the answer): an
    attacker that asks again the moment it is answered, on many connections, from many addresses, would keep the
    event loop busy answering refusals, and every other client's requests would wait behind them. Held, it costs
    nothing (a sleeping task) and asks again only when it is answered. A client that waits as it is told is never
    held, and neither is anyone at another address. At most HOLD_MAX_S: beyond that the address's line does not
    grow, so that its connections are each answered at least that often."""

    HOLD_MAX_S = 10.0

    def __init__(self) -> None:
        self._next: dict[Any, float] = {}   # who asks -> when its next refusal may be answered (trio's clock)

    async def hold(self, source: Any, retry_after_s: float) -> None:
        """Wait until the refusal of a request from `source`, saying Retry-After `retry_after_s`, may be answered."""
        now = trio.current_time()
        due = max(now, self._next.pop(source, now))
        wait = due - now
        self._next[source] = due + retry_after_s if wait < self.HOLD_MAX_S else due   # the most recent: last
        if len(self._next) > Throttle.BUCKETS_MAX:
            del self._next[next(iter(self._next))]
        if wait > 0:
            await trio.sleep(min(wait, self.HOLD_MAX_S))


class _Buckets:
    """Token buckets by key (`burst` tokens, refilled at `per_s`); those used least recently beyond
    Throttle.BUCKETS_MAX are forgotten (full again)."""

    def __init__(self, per_s: float, burst: float):
        self.per_s, self.burst = per_s, float(burst)
        self._tokens: dict[Any, tuple[float, float]] = {}   # key -> (tokens, when counted), oldest first

    def wait_s(self, key: Any, now: float) -> float:
        """0 while `key` has a token, else how long until it has one again."""
        tokens, at = self._tokens.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.per_s)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.per_s

    def take(self, key: Any, now: float, tokens_taken: float = 1.0) -> None:
        tokens, at = self._tokens.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.per_s)
        self._tokens[key] = (min(self.burst, tokens - tokens_taken), now)   # now the most recently used: last
        if len(self._tokens) > Throttle.BUCKETS_MAX:
            del self._tokens[next(iter(self._tokens))]

    def give_back(self, key: Any, now: float) -> None:
        self.take(key, now, -1.0)


def _refuse_if_empty(buckets: _Buckets, key: Any, now: float, what: str) -> None:
    wait = buckets.wait_s(key, now)
    if wait:
        raise TooManyRequests(f"{what}: retry in {math.ceil(wait)} s", retry_after_s=math.ceil(wait))


def source_key(address: str | None) -> str:
    """What failures are counted by for a request from `address`: the address itself, or for IPv6 its /64 (one
    host's usual share; an IPv4 address mapped into IPv6 counts as itself)."""
    try:
        ip = ipaddress.ip_address((address or "").strip("[]"))
    except ValueError:
        return address or "unknown"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
