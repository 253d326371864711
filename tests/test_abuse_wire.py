"""Issue 39, row 4: a frame on the cluster channel can only build values of the types registered to cross.

A peer holding the cluster key (a member of another version, or one taken over) sends a real member frames naming
modules and classes of the project that are not wire types: the conversion worker's `coordinator.uniform.__main__`
(importing it would make the member nice 10 and read its stdin on the event loop, for good), the service's own
`Coordinator`, a module outside the project. Each is refused and its connection closed; nothing is imported or
run: the member keeps its priority, answers HTTP at once, commits, and still answers a proper call.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import time

import httpx
import msgpack
import pytest

from coordinator.cluster import wire
from tests.support import ServerProcess, sql

REFUSED = ["coordinator.uniform.__main__:main", "coordinator.uniform.__main__:Job", "coordinator.service:Coordinator",
           "coordinator.cluster.secret:Path", "api.cli:Config", "os:system"]


def _recv(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        data = s.recv(n - len(buf))
        if not data:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += data
    return buf


class Peer:
    """A connection to a member's channel that passed the handshake with `key` (speaking the member's version)."""

    def __init__(self, address: str, key: bytes):
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        first = _recv(self.sock, 16)
        greeting, challenge = first[:4], first[4:] + _recv(self.sock, 4)
        ours = os.urandom(16)
        self.sock.sendall(greeting + ours + hmac.new(key, greeting + b"dialer" + challenge + ours,
                                                     hashlib.sha256).digest())
        _recv(self.sock, 32)   # the member's proof: it accepted ours

    def send(self, message) -> None:
        payload = msgpack.packb(message)
        self.sock.sendall(len(payload).to_bytes(4, "big") + payload)

    def answer(self):
        return msgpack.unpackb(_recv(self.sock, int.from_bytes(_recv(self.sock, 4), "big")))

    def close(self) -> None:
        self.sock.close()


def member_key(secret_file, dsn: str, address: str) -> bytes:
    """The channel key as the member holds it: from the cluster's secret file (or, in releases that derived it from
    the token signing key in the database, from that)."""
    candidates = [hmac.new(secret_file.read_bytes().strip(), b"cluster-channel", hashlib.sha256).digest()]
    rows = sql(dsn, "SELECT secret FROM auth_signing_keys WHERE name = 'tokens'")
    if rows:
        candidates.append(hmac.new(rows[0]["secret"], b"cluster-channel", hashlib.sha256).digest())
    for key in candidates:
        try:
            Peer(address, key).close()
            return key
        except ConnectionError:
            continue
    raise AssertionError("no key passes the member's handshake")


def niceness(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[16])


@pytest.fixture
def member(database_url, tmp_path):
    secret = tmp_path / "cluster.secret"
    secret.write_text(os.urandom(32).hex())
    secret.chmod(0o600)
    server = ServerProcess(database_url, tmp_path / "srv", log_level="info",
                           extra_env={"COORDINATOR_CLUSTER": "true", "COORDINATOR_CLUSTER_SECRET_FILE": str(secret)})
    with server:
        address = sql(database_url, "SELECT address FROM cluster_members")[0]["address"]
        yield server, member_key(secret, database_url, address), address


def test_a_frame_naming_anything_but_a_wire_type_builds_nothing_and_runs_nothing(member):
    server, key, address = member
    nice = niceness(server.proc.pid)
    for name in REFUSED:
        for code, parts in ((wire._OBJECT, [{}]), (wire._ENUM, [1]), (wire._ERROR, [[], {}]), (wire._NAMEDTUPLE, [])):
            peer = Peer(address, key)
            try:
                peer.send([1, "ping", [[msgpack.ExtType(code, name.encode()), *parts]]])
                with pytest.raises(ConnectionError):   # the member closes a connection it cannot read
                    peer.answer()
            finally:
                peer.close()
            # the member is as it was: not niced by an import, its event loop free, answering at once
            assert niceness(server.proc.pid) == nice, name
            started = time.monotonic()
            assert httpx.get(server.base_url + "/healthz", timeout=5).status_code == 200, name
            assert time.monotonic() - started < 2, name
    assert httpx.post(server.base_url + "/v1/namespaces", json={"namespace": ["still_committing"]},
                      timeout=10).status_code == 200
    peer = Peer(address, key)
    try:
        peer.send([2, "ping", []])
        assert peer.answer()[:2] == [2, True]   # and a proper call is still answered
    finally:
        peer.close()
    log = server.log_path.read_text()
    assert "refusing to build 'coordinator.uniform.__main__:main'" in log, log[-3000:]
