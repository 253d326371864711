"""The abuse run: what each attack of `loadtest/attacks/` costs the clients that are not attacking.

    python -m loadtest.abuse                          # every attack, ~10 minutes
    python -m loadtest.abuse --attacks h2-body-no-length,feed-long-poll-flood --window 20

One PostgreSQL and the service as a real process, with authentication on (a `writer` client granted everything, a
`nogrant` client granted nothing) and a descriptor limit of 1,024 (the common default). A steady writer commits
to an Iceberg table at `--rate` commits/s on a connection it opened first (open loop: a commit's latency runs from
the moment it was due, so a stall counts in full), and a probe asks `/healthz` every 100 ms on a new connection.
On a machine of two or more cores the service runs on core 0 and everything else (PostgreSQL, the writer, the
probe, the attack) on the others, as an attacker on another host would. For each attack: a window without it,
then a window with it running (after `--warmup` seconds for it to build up; the attack runs in a process of its
own). One table is printed: healthz p99, the writer's commit p50/p99 and commits/s, the service's peak RSS, with
and without the attack, and whether the commit p99 stayed within 2x of its value without the attack.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import multiprocessing
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

from storage.embedded import EmbeddedPostgres, free_port

from . import procs
from .attacks import Target
from .flows import iceberg_commit_body, iceberg_state

ATTACK_MODULES = ("front_door", "token_throttle", "feed", "uniform")
CLIENTS = {"writer": ("writer", "writer-secret"), "nogrant": ("nogrant", "nogrant-secret")}
SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
DESCRIPTOR_LIMIT = 1024
P99_BOUND = 2.0
# How hard each attack pushes, where its own default is not the probe: the long-poll flood's refused polls
# are not asked again (asked again at once, they are a plain request flood, which no per-reader bound is about).
OPTIONS = {"feed-long-poll-flood": {"polls": 1000, "wait_s": 60.0, "retry_refused": False}}


def all_attacks() -> dict:
    attacks = {}
    for name in ATTACK_MODULES:
        attacks.update(importlib.import_module(f"loadtest.attacks.{name}").ATTACKS)
    return attacks


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def write_auth_file(path: Path) -> Path:
    from coordinator.auth import hash_secret
    writer_id, writer_secret = CLIENTS["writer"]
    nogrant_id, nogrant_secret = CLIENTS["nogrant"]
    path.write_text("\n".join([
        "token_ttl_s = 7200",
        "[[clients]]", f'id = "{writer_id}"', f'secret = "{hash_secret(writer_secret)}"', 'roles = ["writer"]',
        "[[clients]]", f'id = "{nogrant_id}"', f'secret = "{hash_secret(nogrant_secret)}"', 'roles = ["nogrant"]',
        "[roles.writer]", 'grants = [{ on = "*", privileges = ["admin"] }]',
        "[roles.nogrant]", "grants = []", ""]))
    return path


@dataclass
class Window:
    """What the steady writer and the health probe saw during one window."""

    commits: list[float] = field(default_factory=list)     # latency of each commit, from when it was due
    failed: int = 0
    healthz: list[float] = field(default_factory=list)
    healthz_failed: int = 0
    rss_peak_mib: float = 0.0
    seconds: float = 0.0


class Steady:
    """The clients that are not attacking: a writer committing at a fixed rate, a health probe, an RSS sampler.
    Each runs on a thread of its own; `window()` collects what they see while its block runs."""

    def __init__(self, base_url: str, pid: int, token: str, rate: float):
        self.base_url, self.pid, self.rate = base_url, pid, rate
        self.http = httpx.Client(base_url=base_url, timeout=60, headers={"Authorization": f"Bearer {token}"},
                                 limits=httpx.Limits(max_connections=1))
        self.current: Window | None = None
        self.stop = threading.Event()
        self.path = "/v1/namespaces/abuse/tables/steady"
        assert self.http.post("/v1/namespaces", json={"namespace": ["abuse"]}).status_code == 200
        r = self.http.post("/v1/namespaces/abuse/tables", json={"name": "steady", "schema": SCHEMA})
        assert r.status_code == 200, r.text
        self.parent, self.seq = iceberg_state(r.content)
        self.next_id = 1
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._write, self._probe, self._sample)]
        for t in self.threads:
            t.start()

    def _write(self) -> None:
        due = time.monotonic()
        while not self.stop.is_set():
            self.stop.wait(max(0.0, due - time.monotonic()))
            window = self.current
            body = iceberg_commit_body(self.parent, self.next_id, self.seq + 1)
            try:
                r = self.http.post(self.path, content=orjson.dumps(body),
                                   headers={"Content-Type": "application/json"})
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                self.parent, self.seq = iceberg_state(r.content)
                self.next_id += 1
            else:   # reload: the writer goes on from what the table holds
                try:
                    self.parent, self.seq = iceberg_state(self.http.get(self.path).content)
                except (httpx.HTTPError, KeyError, orjson.JSONDecodeError):
                    pass
            if window is not None and window is self.current:
                if ok:
                    window.commits.append(time.monotonic() - due)
                else:
                    window.failed += 1
            due = max(due + 1 / self.rate, time.monotonic() - 1.0)   # a stall's backlog is not replayed for ever

    def _probe(self) -> None:
        while not self.stop.wait(0.1):
            window, started = self.current, time.monotonic()
            try:
                ok = httpx.get(f"{self.base_url}/healthz", timeout=30).status_code == 200
            except httpx.HTTPError:
                ok = False
            if window is not None and window is self.current:
                window.healthz.append(time.monotonic() - started)
                window.healthz_failed += not ok

    def _sample(self) -> None:
        while not self.stop.wait(0.05):
            window = self.current
            if window is not None:
                with contextlib.suppress(OSError):
                    window.rss_peak_mib = max(window.rss_peak_mib, procs.rss_bytes(self.pid) / (1 << 20))

    @contextlib.contextmanager
    def window(self) -> Iterator[Window]:
        window = Window()
        started = time.monotonic()
        self.current = window
        try:
            yield window
        finally:
            self.current = None
            window.seconds = time.monotonic() - started

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        self.http.close()


def row(name: str, w: Window) -> dict:
    return {"attack": name, "healthz_p99_ms": pct(w.healthz, 0.99) * 1000, "healthz_failed": w.healthz_failed,
            "commit_p50_ms": pct(w.commits, 0.5) * 1000, "commit_p99_ms": pct(w.commits, 0.99) * 1000,
            "commits_per_s": len(w.commits) / w.seconds if w.seconds else 0.0, "commit_failed": w.failed,
            "rss_peak_mib": w.rss_peak_mib}


def what_it_got(tally) -> str:
    """The attack's own tally, in a few words (each attack module keeps its own kind)."""
    for attr in ("answers", "statuses", "answered"):
        counts = getattr(tally, attr, None)
        if counts:
            return " ".join(f"{k}:{v}" for k, v in sorted(counts.items(), key=lambda kv: str(kv[0])))
    commits = getattr(tally, "commits", None)
    return f"{commits} commits" if commits is not None else ""


def _attack_process(name: str, target: Target, running, stop, report) -> None:
    """An attack in a process of its own, so that its threads never take the measuring process's interpreter
    lock from the steady writer and the probe."""
    with all_attacks()[name](target, **OPTIONS.get(name, {})) as tally:
        running.set()
        stop.wait()
        report.put(what_it_got(tally))


@contextlib.contextmanager
def attacking(name: str, target: Target) -> Iterator[dict]:
    """Runs attack `name` while the block does; the dict the block gets holds the attack's answers once it ends."""
    context = multiprocessing.get_context("spawn")
    running, stop, report = context.Event(), context.Event(), context.Queue()
    process = context.Process(target=_attack_process, args=(name, target, running, stop, report), daemon=True)
    process.start()
    outcome = {"got": ""}
    try:
        if not running.wait(120):
            raise RuntimeError(f"attack {name} did not start within 120 s")
        yield outcome
    finally:
        stop.set()
        with contextlib.suppress(queue.Empty):
            outcome["got"] = report.get(timeout=120)
        process.join(timeout=60)
        if process.is_alive():
            process.kill()


def print_table(rows: list[dict]) -> None:
    head = ("attack", "window", "healthz p99 ms", "commit p50 ms", "commit p99 ms", "commits/s", "failed",
            "RSS MiB", "p99 x", "<= 2x", "the attack's answers")
    lines = [head]
    for r in rows:
        for label, w in (("without", r["without"]), ("with", r["with"])):
            ratio = w["commit_p99_ms"] / r["without"]["commit_p99_ms"] if label == "with" else 1.0
            lines.append((r["attack"] if label == "without" else "", label, f"{w['healthz_p99_ms']:.1f}",
                          f"{w['commit_p50_ms']:.1f}", f"{w['commit_p99_ms']:.1f}", f"{w['commits_per_s']:.1f}",
                          str(w["commit_failed"] + w["healthz_failed"]), f"{w['rss_peak_mib']:.0f}",
                          f"{ratio:.2f}", ("yes" if ratio <= P99_BOUND else "NO") if label == "with" else "",
                          r["got"] if label == "with" else ""))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    for i, line in enumerate(lines):
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * width for width in widths))


def main(argv: list[str] | None = None) -> int:
    attacks = all_attacks()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attacks", default=",".join(attacks), help=f"comma-separated: {','.join(attacks)}")
    ap.add_argument("--window", type=float, default=20.0, help="seconds measured without, and with, each attack")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds an attack runs before its window starts")
    ap.add_argument("--rate", type=float, default=10.0, help="the steady writer's commits/s")
    ap.add_argument("--no-pin", action="store_true", help="leave the service on every core, beside the attacks")
    ap.add_argument("--code", type=Path, help="run the service from this checkout instead (e.g. an older main, to "
                    "see what each attack did to it); the load generator and the attacks stay this checkout's")
    ap.add_argument("--json", type=Path, help="also write the rows to this file")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (the service's log)")
    args = ap.parse_args(argv)
    chosen = [a for a in args.attacks.split(",") if a]
    unknown = [a for a in chosen if a not in attacks]
    if unknown:
        ap.error(f"unknown attack(s) {', '.join(unknown)}; choose from {', '.join(attacks)}")
    if not shutil.which("prlimit"):
        ap.error("prlimit (util-linux) is needed to run the service under a 1,024-descriptor limit")

    cores = sorted(os.sched_getaffinity(0))
    pinned = len(cores) >= 2 and not args.no_pin
    if pinned:   # PostgreSQL and the attacks inherit this process's cores; the service gets the first alone
        os.sched_setaffinity(0, cores[1:])
    tmp = Path(tempfile.mkdtemp(prefix="abuse-"))
    tmp.chmod(0o755)   # PostgreSQL runs as its own OS user, and keeps its data here
    pg = EmbeddedPostgres(tmp / "pg")
    service = None
    rows: list[dict] = []
    try:
        print("starting PostgreSQL ...", flush=True)
        pg.start()
        pg._psql("-c", "CREATE DATABASE abuse")
        port = free_port()
        service = procs.service(port, pg.dsn_for("abuse"), tmp / "service", tmp / "service.log",
                                extra_args=["--auth-file", str(write_auth_file(tmp / "auth.toml"))],
                                **({"code": args.code, "env": {"PYTHONPATH": str(args.code)}} if args.code else {}))
        service.argv = ["prlimit", f"--nofile={DESCRIPTOR_LIMIT}:{DESCRIPTOR_LIMIT}", "--",
                        *(["taskset", "-c", str(cores[0])] if pinned else []), *service.argv]
        base = f"http://127.0.0.1:{port}"
        print(f"starting the service{f' from {args.code}' if args.code else ''} ...", flush=True)
        service.start(base + "/readyz")
        target = Target(base, service.pid, CLIENTS)
        client_id, secret = CLIENTS["writer"]
        token = httpx.post(f"{base}/v1/oauth/tokens", timeout=30, data={
            "grant_type": "client_credentials", "client_id": client_id, "client_secret": secret,
            "scope": "catalog"}).json()["access_token"]
        steady = Steady(base, service.pid, token, args.rate)
        try:
            time.sleep(2)   # the writer's first commits warm the table's actor
            for n, name in enumerate(chosen, 1):
                print(f"[{n}/{len(chosen)}] {name}: {args.window:.0f} s without ...", flush=True)
                with steady.window() as without:
                    time.sleep(args.window)
                print(f"[{n}/{len(chosen)}] {name}: {args.warmup:.0f} s to build up, {args.window:.0f} s with ...",
                      flush=True)
                with attacking(name, target) as outcome:
                    time.sleep(args.warmup)
                    with steady.window() as during:
                        time.sleep(args.window)
                rows.append({"attack": name, "without": row(name, without), "with": row(name, during),
                             "got": outcome["got"]})
                time.sleep(2)   # what the attack left behind (closing connections) settles before the next
        finally:
            steady.close()
    finally:
        procs.tear_down([service] if service is not None else [], pg, tmp, args.keep)
    print()
    print(f"the service: {args.code or 'this checkout'}; steady writer at {args.rate:g} commits/s (Iceberg, one "
          f"table, its own connection); windows of "
          f"{args.window:g} s; the service under a {DESCRIPTOR_LIMIT}-descriptor limit, authentication on"
          + (f", alone on core {cores[0]}" if pinned else ""))
    print_table(rows)
    if args.json:
        args.json.write_text(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode())
    return 0 if all(r["with"]["commit_p99_ms"] <= P99_BOUND * r["without"]["commit_p99_ms"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
