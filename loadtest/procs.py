"""Processes the benchmark starts and measures: the service, the bare app, baseline servers; CPU and RSS from /proc.

CPU is read from `/proc/<pid>/stat` (utime + stime of every thread of the process), so a figure such as "server
CPU ms per request" covers the HTTP loop, the actors and the asyncpg thread together. PostgreSQL's CPU is the sum
over the postmaster's children, read the same way.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int, reaped_children: bool = False) -> float:
    """User + system CPU seconds of one process (all its threads); 0.0 once it is gone. `reaped_children` adds
    the CPU of its children that have exited (cutime + cstime)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    ticks = int(parts[11]) + int(parts[12])
    if reaped_children:
        ticks += int(parts[13]) + int(parts[14])
    return ticks / CLK_TCK


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(entry))
    return out


def tree_cpu_s(pid: int) -> float:
    """CPU of a process and its direct children, live or exited (PostgreSQL: postmaster, backends, walwriter...;
    the postmaster reaps its backends, so their CPU stays counted after they exit)."""
    return proc_cpu_s(pid, reaped_children=True) + sum(proc_cpu_s(c) for c in children(pid))


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def postmaster_pid(pgdata: Path) -> int | None:
    try:
        return int((Path(pgdata) / "postmaster.pid").read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError, PermissionError):
        return None


@dataclass
class CpuWindow:
    """CPU seconds spent by the server, PostgreSQL and this process (the load generator) over one window."""

    server_s: float = 0.0
    workers_s: float = 0.0   # the service's own child processes (its UniForm conversion workers)
    pg_s: float = 0.0
    loadgen_s: float = 0.0
    wall_s: float = 0.0


class CpuMeter:
    def __init__(self, server_pid: int | None, pg_pid: int | None):
        self.server_pid, self.pg_pid = server_pid, pg_pid
        self._start: tuple[float, float, float, float, float] | None = None

    def _read(self) -> tuple[float, float, float, float, float]:
        pids = self.server_pid if isinstance(self.server_pid, list) else [self.server_pid] if self.server_pid else []
        own = sum(proc_cpu_s(p) for p in pids)
        return (own, sum(tree_cpu_s(p) for p in pids) - own,
                tree_cpu_s(self.pg_pid) if self.pg_pid else 0.0, self_cpu_s(), time.perf_counter())

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> CpuWindow:
        end = self._read()
        s = self._start or end
        return CpuWindow(*(e - b for e, b in zip(end, s)))


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_ready(url: str, proc: subprocess.Popen | None, what: str, log: Path | None, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise SystemExit(f"{what} exited with code {proc.returncode} before it was ready; its log ({log}) "
                             f"ends with:\n{tail}")
        try:
            if http_get(url, timeout=1)[0] < 500:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} did not answer {url} within {timeout_s:.0f} s; see {log}")


class Child:
    """A server subprocess with its output in a log file; `stop()` interrupts it, then kills after a grace."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None,
                 stop_signal: int = signal.SIGINT, cwd: Path = ROOT):
        self.name, self.argv, self.log, self.stop_signal, self.cwd = name, argv, log, stop_signal, cwd
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def launch(self) -> Child:
        """Start without waiting (its imports can overlap other work); `start` or `wait_ready` later."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd, env=self.env)
        return self

    def start(self, ready_url: str, timeout_s: float = 60) -> Child:
        if self.proc is None:
            self.launch()
        wait_ready(ready_url, self.proc, self.name, self.log, timeout_s)
        return self

    def stop(self, grace_s: float = 15) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(self.stop_signal)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def tear_down(children: list[Child], pg, tmp: Path, keep: bool) -> None:
    """A run's end, however it ended: its servers stopped, then its PostgreSQL (`EmbeddedPostgres`, or None if it
    never started) with its data, then the temp dir removed unless `keep`."""
    for child in children:
        child.stop()
    if pg is not None:
        pg.destroy()
    if keep:
        print(f"kept {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


def service(port: int, database_url: str, data_dir: Path, log: Path, *, cluster: bool = False,
            warehouse: Path | str | None = None, env: dict[str, str] | None = None,
            extra_args: list[str] | None = None, code: Path = ROOT) -> Child:
    """`coordinator serve` as a real OS process, against the benchmark's PostgreSQL (`cluster`: as a member of a
    cluster sharing it; `extra_args`: more flags, such as the S3 settings of an s3:// warehouse; `code`: the
    checkout whose code it runs, this one by default)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    if cluster:   # the members' data dirs differ: they share the channel's secret from a file beside them
        from coordinator.cluster.secret import make_secret_file
        secret = make_secret_file(data_dir.parent / "cluster.secret")
        env = {**(env or {}), "COORDINATOR_CLUSTER_SECRET_FILE": str(secret)}
    argv = [sys.executable, "-m", "api.cli", "serve", "--port", str(port), "--database-url", database_url,
            "--data-dir", str(data_dir), "--warehouse", str(warehouse or data_dir / "warehouse"),
            "--log-level", "warning"] + (["--cluster"] if cluster else []) + (extra_args or [])
    # SIGTERM: the service's graceful stop (it handles SIGINT and SIGTERM alike); `Child.stop` kills it after a
    # grace period, which would lose nothing either: every answered commit is durable.
    return Child("the coordinator service", argv, log, env=env, stop_signal=signal.SIGTERM, cwd=code)


def bare_app(port: int, log: Path, durable_dir: Path | None = None) -> Child:
    """The bare quart-trio app (loadtest/bare.py): the HTTP stack's own limit, for comparison in the same run;
    with `durable_dir`, each commit request also makes a new file durable there (`--durable-file`)."""
    durable = [] if durable_dir is None else ["--durable-file", "--dir", str(durable_dir)]
    return Child("the bare quart-trio app", [sys.executable, "-m", "loadtest.bare", "--port", str(port), *durable],
                 log, stop_signal=signal.SIGTERM)
