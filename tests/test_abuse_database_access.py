"""Issue 39, row 3: no other local OS user enters the embedded database, nor passes for a cluster member.

`coordinator serve` with no --database-url runs its own PostgreSQL. A second OS user on the machine (`nobody`, with
nothing but the system's psql and python3) tries what an intruder would: connect by the socket and by TCP as the
superuser, read the token signing key, read the cluster's secret file, and pass the cluster channel's handshake
(with the key it could derive, and with one derived from a signing key leaked from the database) to call a member.
All of it must fail, while the service's own OS user still connects. A data dir an older release made (trust,
TCP) is brought to the same rules when the service starts, or refused with what to do while others still use it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.embedded import SUPERUSER, EmbeddedPostgres, EmbeddedPostgresError
from tests.support import ServerProcess, sql, write_auth_file

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another OS user (nobody) needs root")

INTRUDER = "nobody"
SYSTEM_PYTHON = "/usr/bin/python3"   # what any user may run: the test's own interpreter may live under /root

# The intruder's script: standard library and the system's psql only. Prints what each attempt got, as JSON.
ATTEMPTS = r'''
import hashlib, hmac, json, os, socket, subprocess, sys
args = json.loads(sys.argv[1])
out = {}

def psql(conninfo):
    """Whether it got in (`ok`), and then the token signing key if there is one (`key`)."""
    def run(query):
        return subprocess.run([args["psql"], conninfo, "-tAc", query], capture_output=True, text=True, timeout=20)
    proc = run("SELECT current_user")
    if proc.returncode != 0:
        return {"ok": False, "detail": proc.stderr.strip()}
    key = run("SELECT encode(secret, 'hex') FROM auth_signing_keys WHERE name = 'tokens'").stdout.strip()
    return {"ok": True, "detail": proc.stdout.strip(), "key": key}

user = "user=%s dbname=coordinator connect_timeout=5" % args["user"]
out["socket"] = psql("host=%s port=%s %s" % (args["socket_dir"], args["port"], user))
out["tcp"] = psql("host=127.0.0.1 port=%s %s" % (args["port"], user))
try:
    with open(args["secret_file"], "rb") as f:
        out["secret_file"] = {"ok": True, "detail": f.read().decode().strip()}
except OSError as exc:
    out["secret_file"] = {"ok": False, "detail": str(exc)}

def recv(s, n):
    buf = b""
    while len(buf) < n:
        data = s.recv(n - len(buf))
        if not data:
            raise ConnectionError("closed after %d bytes" % len(buf))
        buf += data
    return buf

def call_member(signing_key_hex):
    """The channel's handshake as a member dials (speaking the listener's own version), then a `ping` call."""
    key = hmac.new(bytes.fromhex(signing_key_hex), b"cluster-channel", hashlib.sha256).digest()
    host, _, port = args["channel"].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            first = recv(s, 16)
            greeting, challenge = first[:4], first[4:] + recv(s, 4)
            ours = os.urandom(16)
            s.sendall(greeting + ours + hmac.new(key, greeting + b"dialer" + challenge + ours, hashlib.sha256).digest())
            recv(s, 32)
            call = b"\x93\x00\xa4ping\x90"   # msgpack [0, "ping", []]
            s.sendall(len(call).to_bytes(4, "big") + call)
            size = int.from_bytes(recv(s, 4), "big")
            return {"ok": True, "detail": repr(recv(s, size))}
    except (OSError, ConnectionError) as exc:
        return {"ok": False, "detail": repr(exc)}

read = out["socket"].get("key") or out["tcp"].get("key")
if read:
    out["handshake_with_the_key_it_read"] = call_member(read)
out["handshake_with_a_leaked_signing_key"] = call_member(args["leaked_signing_key"])
print(json.dumps(out))
'''


def intrude(**args) -> dict:
    proc = subprocess.run(["runuser", "-u", INTRUDER, "--", SYSTEM_PYTHON, "-c", ATTEMPTS, json.dumps(args)],
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every OS user may enter (as /tmp or a home is): only the service's own modes protect what it
    keeps there."""
    path = Path(tempfile.mkdtemp(prefix="coordinator-abuse-db-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def psql_path() -> str:
    found = shutil.which("psql")
    assert found, "psql is needed"
    return found


def test_another_os_user_cannot_enter_the_embedded_database_nor_call_a_member(shared_dir):
    data = shared_dir / "data"
    auth = write_auth_file(shared_dir / "auth.toml", {"writer": ("writer-secret", [("*", ["admin"])])})
    server = ServerProcess(None, data, extra_env={"COORDINATOR_CLUSTER": "true"},
                           extra_args=["--auth-file", str(auth)])
    pg = EmbeddedPostgres(data / "postgres")
    try:
        server.start(timeout_s=90)
        port = int((pg.root / "port").read_text())
        dsn = f"postgresql://{SUPERUSER}@{'%2F'.join(str(pg.root).split('/'))}:{port}/coordinator"
        # The service's own OS user does connect (the probe below is not refused for some other reason).
        signing_key = sql(dsn, "SELECT secret FROM auth_signing_keys WHERE name = 'tokens'")[0]["secret"]
        channel = sql(dsn, "SELECT address FROM cluster_members")[0]["address"]
        got = intrude(psql=psql_path(), user=SUPERUSER, socket_dir=str(pg.root), port=port, channel=channel,
                      secret_file=str(data / "cluster.key"), leaked_signing_key=signing_key.hex())
        assert not got["socket"]["ok"], got
        assert not got["tcp"]["ok"], got
        assert not got["secret_file"]["ok"], got
        assert "handshake_with_the_key_it_read" not in got, got
        assert not got["handshake_with_a_leaked_signing_key"]["ok"], got   # the channel's key is not the DB's
        # The refusals are the ones meant: no way to the socket, no TCP listener, a private secret file.
        assert "Permission denied" in got["socket"]["detail"], got
        assert sql(dsn, "SHOW listen_addresses")[0]["listen_addresses"] == "", got
        assert "Permission denied" in got["secret_file"]["detail"], got
        log = (data / "server.log").read_text()
        assert "refused a channel connection" in log and "does not hold the cluster key" in log, log[-2000:]
    finally:
        server.stop()
        pg.destroy()


def _older_release_cluster(root: Path) -> EmbeddedPostgres:
    """A cluster as releases before this one made and ran it: trust for everyone, TCP on 127.0.0.1, its socket
    in a directory anyone may enter."""
    pg = EmbeddedPostgres(root)
    pg.root.mkdir(parents=True)
    shutil.chown(pg.root, pg.user)
    pg._run(str(pg.bin / "initdb"), "-D", str(pg.pgdata), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
            "--no-locale")
    pg.port = 5432
    while not _tcp_port_free(pg.port):
        pg.port += 1
    (pg.root / "port").write_text(str(pg.port))
    pg._run(str(pg.bin / "pg_ctl"), "start", "-w", "-D", str(pg.pgdata), "-l", str(pg.root / "postgres.log"),
            "-o", f"-p {pg.port} -k {pg.root} -c listen_addresses=127.0.0.1")
    pg._run(str(pg.bin / "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", SUPERUSER, "-d", "postgres",
            "-c", "CREATE DATABASE coordinator")
    return pg


def _tcp_port_free(port: int) -> bool:
    import socket
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _intruder_reaches(pg: EmbeddedPostgres, port: int) -> dict:
    return intrude(psql=psql_path(), user=SUPERUSER, socket_dir=str(pg.root), port=port, channel="127.0.0.1:1",
                   secret_file="/nonexistent", leaked_signing_key="00")


def test_an_older_releases_data_dir_is_brought_to_the_rules_in_place(shared_dir):
    """Running (trust, TCP), with nobody else using it: restarted with only its private socket. Stopped: started
    so. Either way the intruder gets in before and not after, and the data is still there."""
    old = _older_release_cluster(shared_dir / "running")
    try:
        port = old.port
        before = _intruder_reaches(old, port)
        assert before["tcp"]["ok"] and before["socket"]["ok"], before   # the hole, as an older release left it
        sql(f"postgresql://{SUPERUSER}@127.0.0.1:{port}/coordinator", "CREATE TABLE kept (x int)")
        pg = EmbeddedPostgres(shared_dir / "running")
        dsn = pg.start()
        after = _intruder_reaches(pg, pg.port)
        assert not after["tcp"]["ok"] and not after["socket"]["ok"], after
        assert not _intruder_reaches(pg, port)["tcp"]["ok"]   # nor on the port it listened on before
        assert sql(dsn, "SELECT count(*) AS n FROM kept")[0]["n"] == 0
        pg.stop()
        assert not pg.is_running()
        again = EmbeddedPostgres(shared_dir / "running")   # stopped: started with the rules from the first
        dsn = again.start()
        assert not _intruder_reaches(again, again.port)["socket"]["ok"]
        assert sql(dsn, "SELECT count(*) AS n FROM kept")[0]["n"] == 0
    finally:
        EmbeddedPostgres(shared_dir / "running").destroy()


def test_an_older_releases_database_still_in_use_is_refused_saying_what_to_do(shared_dir):
    old = _older_release_cluster(shared_dir / "busy")
    holder = subprocess.Popen([psql_path(), "-h", "127.0.0.1", "-p", str(old.port), "-U", SUPERUSER, "-d",
                               "coordinator", "-c", "SELECT pg_sleep(60)"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)   # an older service's session
    try:
        deadline = 50
        while deadline and sql(f"postgresql://{SUPERUSER}@127.0.0.1:{old.port}/coordinator",
                               "SELECT count(*) AS n FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'"
                               " AND pid <> pg_backend_pid()")[0]["n"] == 0:
            deadline -= 1
            __import__("time").sleep(0.1)
        with pytest.raises(EmbeddedPostgresError) as err:
            EmbeddedPostgres(shared_dir / "busy").start()
        message = str(err.value)
        assert "older release" in message and "TCP" in message and "pg_ctl stop" in message, message
        assert EmbeddedPostgres(shared_dir / "busy").is_running()   # left running for the session using it
    finally:
        holder.kill()
        holder.wait()
        EmbeddedPostgres(shared_dir / "busy").destroy()
