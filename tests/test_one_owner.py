"""One owner per database: a second `coordinator serve` on a database that another process serves is refused with a
message naming that process and --cluster (exit code 2), and a process killed without cleaning up does not block
its restart. (The same data directory's embedded database: tests/test_embedded.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import httpx

from storage.embedded import free_port
from storage.owner import OWNER_LOCK
from tests.support import ServerProcess
from tests.tcp_proxy import TcpProxy

ROOT = Path(__file__).resolve().parents[1]


def serve(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """`coordinator serve` that is expected to exit by itself (refused)."""
    return subprocess.run([sys.executable, "-m", "api.cli", "serve", "--port", str(free_port()), *args],
                          capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)


def test_a_second_process_on_the_same_database_is_refused_and_a_killed_one_restarts(database_url, tmp_path):
    first = ServerProcess(database_url, tmp_path / "first")
    first.start()
    try:
        second = serve("--database-url", database_url, "--data-dir", str(tmp_path / "second"))
        assert second.returncode == 2, second.stderr
        message = second.stderr.strip().splitlines()[-1]
        assert f"pid {first.proc.pid} on host " in message and "--cluster" in message, message
        assert "since " in message, message
        print(message)
        member = serve("--cluster", "--database-url", database_url, "--data-dir", str(tmp_path / "member"))
        assert member.returncode == 2, member.stderr
        assert "restart it with --cluster" in member.stderr, member.stderr

        first.kill()   # SIGKILL: nothing released by the process itself
        started = time.monotonic()
        first.start(timeout_s=60)
        print(f"restarted {time.monotonic() - started:.1f} s after SIGKILL")
        with httpx.Client(base_url=first.base_url) as http:
            assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
    finally:
        first.stop()


def test_an_owner_whose_claim_another_process_took_stops(database_url, tmp_path):
    """The owner's claim ends with its database session (a restart, a failover); if another process claims the
    database before the owner can claim it again, the owner stops rather than serve beside it."""
    proxy, proxied_url = TcpProxy.for_database(database_url)
    server = ServerProcess(proxied_url, tmp_path / "srv")
    server.start()

    async def take_the_claim() -> None:
        con = await asyncpg.connect(database_url)
        try:
            proxy.refuse = True   # the owner cannot reach the database for now
            await con.execute("SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                              " AND objid = $1 AND granted", OWNER_LOCK)
            while not await con.fetchval("SELECT pg_try_advisory_lock($1)", OWNER_LOCK):
                await asyncio.sleep(0.05)
            proxy.refuse = False
            deadline = time.monotonic() + 30
            while server.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            await con.close()
    try:
        asyncio.run(take_the_claim())
        assert server.proc.poll() == 3, "the owner went on serving beside another claimant"
        assert "another coordinator already serves this database" in server.log_path.read_text()
    finally:
        server.stop()
        proxy.close()
