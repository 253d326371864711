"""One owner per database: a second `coordinator serve` on a database that another process serves is refused with a
message naming that process and --cluster (exit code 2), and a process killed without cleaning up does not block
its restart. (The same data directory's embedded database: tests/test_embedded.py.)"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx

from storage.embedded import free_port
from tests.support import ServerProcess

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
