"""`coordinator serve --workers N`: N member processes of one cluster serving one port on this machine.

One trio process uses one core, so a machine with more cores runs several. The supervisor (this module) starts
the embedded PostgreSQL once (unless a database URL is given), opens the listening socket once and lets every
worker inherit it (`fd://` in hypercorn): the kernel hands each new connection to whichever worker accepts it.
Each worker is an ordinary cluster member with its own internal-channel port on loopback; any worker answers any
request and forwards it to the table's owner. A worker that dies is started again; its shards are taken over by
the others meanwhile.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from coordinator.config import Config
from storage.embedded import EmbeddedPostgres

log = logging.getLogger(__name__)


def _listen(host: str, port: int) -> socket.socket:
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr)
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def serve_workers(config: Config) -> None:
    """Blocking: run `config.workers` member processes until SIGINT/SIGTERM, then stop them gracefully."""
    config.check_exposure()  # before opening the port, not only in each worker
    embedded = None
    dsn = config.database_url
    if not dsn:
        embedded = EmbeddedPostgres(config.data_dir / "postgres")
        dsn = embedded.start()
    sock = _listen(config.host, config.port)
    port = sock.getsockname()[1]
    stopping = False

    def spawn(index: int) -> subprocess.Popen:
        argv = [sys.executable, "-m", "api.cli", "serve", "--cluster", "--http-fd", str(sock.fileno()),
                "--host", config.host, "--port", str(port), "--database-url", dsn,
                "--data-dir", str(config.data_dir), "--warehouse", config.warehouse_uri,
                "--log-level", config.log_level, "--cluster-host", config.cluster_host]
        if config.auth_file is not None:
            argv += ["--auth-file", str(Path(config.auth_file).resolve())]
        if config.insecure:
            argv += ["--insecure"]
        if config.cluster_secret_file is not None:
            argv += ["--cluster-secret-file", str(Path(config.cluster_secret_file).resolve())]
        # The workers run this very code, wherever the supervisor was started from.
        root = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "COORDINATOR_WORKERS": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        proc = subprocess.Popen(argv, pass_fds=[sock.fileno()], env=env)
        log.info("worker %d started (pid %d)", index, proc.pid)
        return proc

    def on_signal(signum, _frame) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    workers = [spawn(i) for i in range(config.workers)]
    log.info("coordinator serving on http://%s:%d with %d worker processes", config.host, port, config.workers)
    try:
        while not stopping:
            time.sleep(0.2)
            for i, proc in enumerate(workers):
                if proc.poll() is not None and not stopping:
                    log.warning("worker %d (pid %d) exited with %s; starting it again", i, proc.pid, proc.returncode)
                    workers[i] = spawn(i)
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + config.shutdown_grace_s + 10
        for proc in workers:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
        sock.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
        if embedded is not None:
            embedded.stop()
