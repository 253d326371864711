"""The front door holds against what a client can send before the service knows who it is or what it may do (issue
39, rows 1, 2 and 7). Each attack is loadtest/attacks/front_door.py's, driven over real HTTP against the service
as a real process (the abuse run measures the same attacks):

- a body of one object with 20,000 keys and one repeated (165 KB), without a credential or with no grant, is
  refused at once, and the service goes on answering others meanwhile (finding the repeated key once took
  seconds of the only core the service runs on);
- an HTTP/2 body of no announced length is not read at all without a credential, and with one is refused at the
  limit, not at its end: what the service holds stays small (it once kept all of it, and a request answered
  before its body ended stopped the whole service);
- a flood of idle connections beyond the connection maximum leaves health checks answered and a connection
  already open committing (past the descriptor limit the service once could not accept, open a file or reach
  its database); those that send nothing never reach the service, and a flood from one host that sends a request
  on each makes room with its own connections, not other hosts'.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from api.app import MAX_BODY_BYTES
from loadtest.attacks import Target
from loadtest.attacks.front_door import ATTACKS, h2_bodies, idle_connections, threads, token
from tests.conftest import fresh_database
from tests.support import ServerProcess, commits_in, write_auth_file

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
EVERYTHING = ["read", "write", "create", "drop"]
CLIENTS = {"writer": ("writer", "writer-secret"), "nogrant": ("nogrant", "nogrant-secret")}
MiB = 1 << 20


@pytest.fixture(scope="module")
def secured(pg_admin_dsn, tmp_path_factory) -> Iterator[Target]:
    """The service with authentication (one for the module: every attack leaves it as it was): `writer` may do
    anything, `nogrant` nothing."""
    root = tmp_path_factory.mktemp("secured")
    auth = write_auth_file(root / "auth.toml", {
        "writer": ("writer-secret", [(fmt, EVERYTHING) for fmt in ("iceberg", "delta", "lance")]),
        "nogrant": ("nogrant-secret", [])})
    with fresh_database(pg_admin_dsn) as database_url, \
            ServerProcess(database_url, root / "service", extra_args=["--auth-file", str(auth)]) as server:
        yield Target(server.base_url, server.proc.pid, CLIENTS)


class Probe:
    """Times requests to /healthz, each on a new connection, every 50 ms while the block runs."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.failures: list[str] = []


@contextmanager
def healthz_probe(base_url: str) -> Iterator[Probe]:
    probe = Probe()

    def run(stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                status = httpx.get(f"{base_url}/healthz", timeout=30).status_code
                if status != 200:
                    probe.failures.append(str(status))
            except httpx.HTTPError as exc:
                probe.failures.append(repr(exc))
            probe.seconds.append(time.monotonic() - started)
            stop.wait(0.05)
    with threads(run, 1):
        yield probe


@contextmanager
def peak_rss(pid: int) -> Iterator[dict[str, float]]:
    """The process's resident memory, in MiB, before the block and at its highest during it (sampled every 20 ms)."""
    figures = {"before": _rss_mib(pid)}
    figures["peak"] = figures["before"]

    def sample(stop: threading.Event) -> None:
        while not stop.wait(0.02):
            figures["peak"] = max(figures["peak"], _rss_mib(pid))
    with threads(sample, 1):
        yield figures
    figures["peak"] = max(figures["peak"], _rss_mib(pid))


def _rss_mib(pid: int) -> float:
    line = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def wait_for(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)


def assert_answered_meanwhile(probe: Probe, seconds: float) -> None:
    """Every /healthz answered, none slower than `seconds` (a loaded 2-core machine answers some in 0.5 s)."""
    assert probe.seconds and not probe.failures, probe.failures[:5]
    assert max(probe.seconds) < seconds, f"/healthz took up to {max(probe.seconds):.1f} s during the attack"


# -- row 1: repeated keys -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attack, refusals", [("duplicate-keys-no-credential", {"401"}),
                                              ("duplicate-keys-no-grant", {"403"})])
def test_a_repeated_key_body_is_refused_at_once(secured, attack, refusals):
    """Without a credential the body is not read (401); a client granted nothing gets 403 before
    its body is parsed, also from routes whose policy reads the body (a commit's table): it may do nothing there,
    whatever the body names."""
    with healthz_probe(secured.base_url) as probe, ATTACKS[attack](secured) as tally:
        wait_for(lambda: tally.requests >= 40, 20)
        time.sleep(0.5)
    assert tally.requests >= 40, tally
    assert set(tally.answers) <= refusals, tally
    assert tally.slowest() < 2.0, tally   # (a few ms of work each: the rest is waiting for the other worker's)
    assert_answered_meanwhile(probe, seconds=2.0)


def test_a_flood_of_refused_bodies_leaves_a_writer_committing(secured):
    """While a client granted nothing posts repeated-key bodies to commit routes as fast as it is answered (403),
    a writer on a connection of its own commits at least half as often as without it: the refusals of a client
    that holds no grant at all come ten a second at most (answering them as fast as it asked took the CPU the
    writer needed), and each costs a fraction of a request (answered before the body, on the commit routes below
    Quart's machinery)."""
    writer = {"Authorization": f"Bearer {token(secured, 'writer')}"}
    with httpx.Client(base_url=secured.base_url, timeout=60, headers=writer) as http:
        assert http.post("/v1/namespaces", json={"namespace": ["flood"]}).status_code == 200
        assert http.post("/v1/namespaces/flood/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
        alone = commits_in(http, "/v1/namespaces/flood/tables/t", 3.0)
        with ATTACKS["duplicate-keys-no-grant"](secured) as tally:
            wait_for(lambda: tally.requests >= 10, 20)
            during = commits_in(http, "/v1/namespaces/flood/tables/t", 3.0)
            answers = dict(tally.answers)
    assert set(answers) <= {"403"}, answers
    assert during >= alone / 2, (alone, during, answers)


# -- row 2: HTTP/2 bodies of no announced length -------------------------------------------------------------------


def test_an_http2_body_without_a_credential_is_not_read(secured):
    """Each request would send 256 MiB: the 401 comes after at most a flow-control window or two of it (to the
    commit route served directly and to a route served by Quart), and the service holds none of it."""
    with peak_rss(secured.pid) as rss, healthz_probe(secured.base_url) as probe, \
            ATTACKS["h2-body-no-length"](secured) as tally:
        wait_for(lambda: tally.requests >= 6, 30)
    assert tally.requests >= 6 and set(tally.answers) == {"401"}, tally
    assert tally.notes["bytes sent"] / tally.requests < 1 * MiB, tally
    assert rss["peak"] - rss["before"] < 8, rss
    assert_answered_meanwhile(probe, seconds=2.0)


def test_an_http2_body_over_the_limit_is_refused_at_the_limit(secured):
    """With a credential, a body with no Content-Length is counted as it arrives, and refused at the limit (413)
    with the stream reset, not read on to its end; the service holds at most the limit's worth meanwhile."""
    size = MAX_BODY_BYTES + 64 * MiB
    writer = token(secured, "writer")
    with peak_rss(secured.pid) as rss, h2_bodies(secured, writer, size=size) as tally:
        wait_for(lambda: tally.requests >= 2, 60)
    assert tally.requests >= 2 and set(tally.answers) == {"413"}, tally
    assert tally.notes["bytes sent"] / tally.requests < MAX_BODY_BYTES + 4 * MiB, tally
    assert rss["peak"] - rss["before"] < MAX_BODY_BYTES / MiB + 32, rss
    assert httpx.get(f"{secured.base_url}/healthz", timeout=10).status_code == 200


# -- row 7: connections ---------------------------------------------------------------------------------------------


def test_a_flood_of_idle_connections_leaves_health_checks_and_open_connections_working(database_url, tmp_path):
    """1,100 connections that send nothing, against a maximum of 50, in a process limited to 512 descriptors: the
    kernel keeps them to itself (they never send the first bytes it waits for), so the service holds none of them
    and has none to close, which the flood's client would only open again at once; health checks on new
    connections are answered, and a writer's connection, open before the flood, commits."""
    server = ServerProcess(database_url, tmp_path / "service", descriptor_limit=512,
                           extra_env={"COORDINATOR_HTTP_MAX_CONNECTIONS": "50"})
    with server, httpx.Client(base_url=server.base_url, timeout=30, limits=httpx.Limits(max_connections=1)) as writer:
        assert writer.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
        assert writer.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
        target = Target(server.base_url, server.proc.pid)
        descriptors = len(list(Path(f"/proc/{server.proc.pid}/fd").iterdir()))
        with ATTACKS["idle-connection-flood"](target) as flood:
            wait_for(lambda: flood.notes["opened"] >= 1100, 30)
            with healthz_probe(server.base_url) as probe:
                time.sleep(2)
            commits = [writer.post("/v1/namespaces/db/tables/t", json={
                "requirements": [], "updates": [{"action": "set-properties", "updates": {"during": str(n)}}]})
                for n in range(10)]
            held = len(list(Path(f"/proc/{server.proc.pid}/fd").iterdir())) - descriptors
        assert flood.notes["opened"] >= 1100 and flood.notes["closed by the service"] == 0, flood
        assert held <= 5, held   # (the probe's, the writer's)
        assert [c.status_code for c in commits] == [200] * 10, commits[-1].text
        assert_answered_meanwhile(probe, seconds=2.0)
        assert 'coordinator_http_connections_closed_at_limit_total 0.0' in httpx.get(
            f"{server.base_url}/metrics", timeout=10).text


def test_a_flood_from_one_host_makes_room_with_its_own_connections(database_url, tmp_path):
    """300 connections from one host (127.0.0.2) that each send one request and then stay idle, against a
    maximum of 50: that host holds more than half of the connections, so past the maximum its own idle ones make
    room, for its own new connections and for everyone else's. A client on another host (127.0.0.1) keeps its
    keep-alive connection, idle longer than any of the flood's (the one idle longest used to go first, whoever held
    it): after the flood has been turned away a thousand times, the same connection answers; and health checks
    from that host, each on a new connection, are answered meanwhile. The limit shows in the log and metrics."""
    server = ServerProcess(database_url, tmp_path / "service", descriptor_limit=512,
                           extra_env={"COORDINATOR_HTTP_MAX_CONNECTIONS": "50"})
    with server, socket.create_connection(("127.0.0.1", server.port), timeout=30) as kept:
        assert health_check(kept).startswith(b"HTTP/1.1 200")
        with idle_connections(Target(server.base_url, server.proc.pid), 300, one_request=True) as flood:
            wait_for(lambda: flood.notes["closed by the service"] >= 1000, 60)
            answers = Counter()
            for _ in range(10):
                try:
                    answers[httpx.get(f"{server.base_url}/healthz", timeout=30).status_code] += 1
                except httpx.HTTPError as exc:
                    answers[type(exc).__name__] += 1
            closed = flood.notes["closed by the service"]
        assert closed >= 1000, flood
        assert answers == {200: 10}, answers
        assert health_check(kept).startswith(b"HTTP/1.1 200"), "the other host's idle connection was closed"
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
        counted = next(line for line in metrics.splitlines()
                       if line.startswith("coordinator_http_connections_closed_at_limit_total "))
        assert float(counted.split()[1]) >= 1000, counted
        assert "coordinator_http_connections_max 50.0" in metrics
    assert "connections open, the most allowed" in server.log_path.read_text()


def health_check(sock: socket.socket) -> bytes:
    """GET /healthz on `sock`, its answer (b"" if the service had closed the connection)."""
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b'"ok"}' not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    except OSError:   # (reset: closed)
        return b""
    return answer


def test_the_connection_maximum_stays_below_the_descriptor_limit(config, monkeypatch):
    import resource

    from api.server import DEFAULT_MAX_CONNECTIONS, max_connections
    from coordinator.config import ConfigError

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1024 * 1024))
    assert max_connections(config) == 1024 - 128 - config.db_pool_size
    config.http_max_connections = 500
    assert max_connections(config) == 500
    config.http_max_connections = 1000
    with pytest.raises(ConfigError, match="ulimit -n"):
        max_connections(config)
    config.http_max_connections = 0
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1 << 20, 1 << 20))
    assert max_connections(config) == DEFAULT_MAX_CONNECTIONS


@pytest.mark.parametrize("escape", [False, True])
def test_a_repeated_key_in_a_large_body_is_refused_unnamed(escape):
    """Past NAME_REPEATED_KEY_UP_TO the repeated key is found by counting alone, also where an escape may spell a
    colon in a string (then the colons outside strings are counted), and refused without its name."""
    from api.common import NAME_REPEATED_KEY_UP_TO, parse_json
    from coordinator.errors import BadRequest
    from loadtest.attacks.front_door import repeated_key_body
    body = repeated_key_body(200_000)
    if escape:
        body = body.replace(b'"k1":0', b'"k1":"\\u003a"')
    assert len(body) > NAME_REPEATED_KEY_UP_TO
    with pytest.raises(BadRequest, match="a key twice in one object"):
        parse_json(body)
    unique = body[:-len(b',"k0":1}')] + b"}"
    assert len(parse_json(unique)) == 200_000
