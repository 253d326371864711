"""Attacks on the token endpoint's throttle (coordinator/auth.py `Throttle`), each from addresses of its own.

- "wrong-secrets-for-a-client": wrong secrets for the writer's client id, `RATE_PER_S` a second, from one address.
  If the failures others cause could spend a client's checks, the writer's right secret would be refused (429).
- "anonymous-random-ids": `REQUESTERS` requesters, each from an address of its own, each naming a random id no
  client has, as fast as they are answered. If unknown ids could fill the queue of secret checks, every client
  would hear 503.

On loopback each attack sends from addresses of its own (127.0.0.0/8 is all loopback), as an attacker on another
host would; the client it hurts keeps its own address. The context manager yields the attack's `Tally`: how many
answers of each status it got.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import ssl
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import httpx

from . import Target

RATE_PER_S = 50.0
SENDERS = 64           # threads sharing the rate, so that slow answers (up to SENDERS / RATE_PER_S s) do not slow it
REQUESTERS = 40
WRONG_SECRETS_FROM = "127.0.0.2"
ANONYMOUS_FROM = "127.0.1.{}"   # requester i sends from 127.0.1.(i + 1)


class Tally:
    """The statuses the attack's requests were answered with (0: no answer: a timeout or a refused connection)."""

    def __init__(self) -> None:
        self.statuses: Counter[int] = Counter()
        self._lock = threading.Lock()

    def add(self, status: int) -> None:
        with self._lock:
            self.statuses[status] += 1

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())


@functools.cache
def _tls() -> ssl.SSLContext:
    return ssl.create_default_context()   # one for every client: making one costs ~50 ms


def _client(target: Target, source: str) -> httpx.Client:
    """An HTTP client of the target, sending from `source` when the target is on loopback."""
    host = urlsplit(target.base_url).hostname or ""
    try:
        local = source if ipaddress.ip_address(host).is_loopback else None
    except ValueError:
        local = None
    return httpx.Client(base_url=target.base_url, timeout=30,
                        transport=httpx.HTTPTransport(local_address=local, verify=_tls()))


def _ask(http: httpx.Client, tally: Tally, client_id: str, secret: str) -> None:
    try:
        r = http.post("/v1/oauth/tokens", data={"grant_type": "client_credentials", "client_id": client_id,
                                                "client_secret": secret})
        tally.add(r.status_code)
    except httpx.HTTPError:
        tally.add(0)


@contextlib.contextmanager
def _threads(work: list[Callable[[threading.Event], None]]) -> Iterator[None]:
    stop = threading.Event()
    threads = [threading.Thread(target=w, args=(stop,), daemon=True, name="attack") for w in work]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)


@contextlib.contextmanager
def wrong_secrets_for_a_client(target: Target) -> Iterator[Tally]:
    if "writer" not in target.clients:
        raise ValueError("wrong-secrets-for-a-client needs a service with authentication (Target.clients)")
    client_id = target.clients["writer"][0]
    tally = Tally()

    def send(stop: threading.Event) -> None:
        interval = SENDERS / RATE_PER_S
        with _client(target, WRONG_SECRETS_FROM) as http:
            next_at = time.monotonic()
            while not stop.is_set():
                _ask(http, tally, client_id, f"guess-{uuid.uuid4().hex}")
                next_at = max(next_at + interval, time.monotonic() - interval)   # no burst to catch up
                stop.wait(max(0.0, next_at - time.monotonic()))
    with _threads([send] * SENDERS):
        yield tally


@contextlib.contextmanager
def anonymous_random_ids(target: Target) -> Iterator[Tally]:
    tally = Tally()

    def requester(i: int) -> Callable[[threading.Event], None]:
        def run(stop: threading.Event) -> None:
            with _client(target, ANONYMOUS_FROM.format(i + 1)) as http:
                while not stop.is_set():
                    _ask(http, tally, f"nobody-{uuid.uuid4().hex}", "x")
        return run
    with _threads([requester(i) for i in range(REQUESTERS)]):
        yield tally


ATTACKS = {
    "wrong-secrets-for-a-client": wrong_secrets_for_a_client,
    "anonymous-random-ids": anonymous_random_ids,
}
