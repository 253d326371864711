"""The embedded PostgreSQL as root: when it cannot run as another OS user, it says so and what to do; a stop
that cannot tell whether the server runs says so instead of leaving it running in silence; and a graceful stop
never takes the database from under another process using it."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from storage.embedded import EmbeddedPostgres, EmbeddedPostgresError, free_port

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="as another user PostgreSQL runs as that user")


@pytest.fixture
def root():
    path = Path(tempfile.mkdtemp(prefix="coordinator-embedded-"))
    path.chmod(0o755)  # the postgres OS user must reach it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_an_os_user_that_cannot_be_made_is_a_clear_error(root, monkeypatch):
    monkeypatch.setenv("COORDINATOR_PG_OS_USER", "no such user!")   # useradd refuses the name
    with pytest.raises(EmbeddedPostgresError) as err:
        EmbeddedPostgres(root / "pg")
    message = str(err.value)
    assert "'no such user!'" in message and "COORDINATOR_PG_OS_USER" in message and "--database-url" in message
    assert not (root / "pg").exists()


def test_a_stop_that_cannot_check_the_server_says_so(root, caplog):
    pg = EmbeddedPostgres(root / "pg")
    pg.start()
    user = pg.user
    try:
        pg.user = "coordinator-no-such-user"   # runuser fails, as it did when /etc/passwd went missing
        with caplog.at_level(logging.WARNING, logger="storage.embedded"):
            pg.stop()
        assert any("could not tell whether the embedded PostgreSQL" in r.getMessage() and "pg_ctl stop" in
                   r.getMessage() for r in caplog.records), caplog.text
        pg.user = user
        assert pg.is_running()
        pg.stop()
        assert not pg.is_running()
        pg.stop()   # stopping a stopped cluster is quiet
    finally:
        pg.user = user
        pg.destroy()


def _serve(data_dir: Path, port: int, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "api.cli", "serve", "--port", str(port), "--data-dir",
                             str(data_dir), "--log-level", "info"], stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            cwd=Path(__file__).resolve().parents[1])


def _ready(proc: subprocess.Popen, port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"serve exited with {proc.returncode}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("serve did not become ready")


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=30)


def test_a_second_serve_on_the_same_data_dir_is_refused_and_leaves_the_first_its_database(root):
    """One process serves a data dir's embedded PostgreSQL. A second `serve` there is refused (exit code 2, naming
    the first and --cluster), as is one whose port is taken, and neither stops the database under the first; the
    first one's graceful stop stops it."""
    data, port, other_port = root / "data", free_port(), free_port()
    first = _serve(data, port, root / "first.log")
    procs = [first]
    try:
        _ready(first, port)
        pg = EmbeddedPostgres(data / "postgres")
        base = f"http://127.0.0.1:{port}"
        clash = _serve(data, port, root / "clash.log")   # the port is taken too
        procs.append(clash)
        assert clash.wait(timeout=60) != 0
        second = _serve(data, other_port, root / "second.log")
        procs.append(second)
        assert second.wait(timeout=60) == 2
        refusal = (root / "second.log").read_text()
        assert f"pid {first.pid} on host" in refusal and "--cluster" in refusal, refusal[-2000:]
        assert pg.is_running()
        assert httpx.get(base + "/readyz").status_code == 200
        assert httpx.post(base + "/v1/namespaces", json={"namespace": ["still_here"]}).status_code == 200
        assert _stop(first) == 0
        assert not pg.is_running(), (root / "first.log").read_text()[-2000:]
    finally:
        for proc in procs:
            _stop(proc)
        EmbeddedPostgres(data / "postgres").stop("immediate")
