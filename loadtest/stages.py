"""Where a commit's CPU goes, by stage: a py-spy recording of the service, each sample put in a stage by the rules
below, and each thread's CPU time (from /proc) shared out over its samples.

    python -m loadtest.commit_bench --flows iceberg --matrix 64x1 --rate 250 --stages   # one run, its stages
    python -m loadtest.bench --only stages                                # every format at 250/s and at peak
    python -m loadtest.stages RAW_FILE                                    # any `py-spy record --threads -f raw` file

How samples become milliseconds. py-spy samples the thread holding the GIL (`--gil`), so a sample is Python (or C
extension) code running on a CPU: their shares within a thread are shares of that thread's user time. What runs
without the GIL is system calls: the event-loop thread's socket reads and writes, epoll and thread wake-ups are
its system time (a row of its own, "kernel"); a worker thread's system time is its writes and fsyncs, shared out
over its samples with its user time. Per thread, from /proc/PID/task/TID/stat over the same window:

    stage ms = sum over threads of (that thread's CPU ms) x (its samples in the stage) / (its samples)

and a thread with no samples, or one that ended within the window, counts to its role's stage (the database
thread's to "database write", any other's to "file writes"). Divided by the commits of the window, the stages add
up to the measured server CPU per commit. Not seen: garbage collection is charged to the code that allocated.

A sample's stage is that of its innermost frame a rule names: the frame's `file:function` (functions as py-spy
names them, `Class.method`), else `file:Class` for a method, else its file, else its directories, longest first.
A rule of None makes a frame transparent: libraries that work for every stage (Quart's request and response
objects, werkzeug's data structures, pydantic, trio's primitives) count to the stage of the code that called them.
A stack no rule names is the event loop's in the main thread (trio's scheduler, epoll, task switches), else its
thread's role.
"""

from __future__ import annotations

import argparse
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from . import pyspy
from .procs import CLK_TCK

HTTP = "HTTP: connection, parse, write (hypercorn, h11)"
QUART = "framework: Quart (or api/direct.py), ASGI adapter, request context, dispatch"
ROUTING = "routing and auth"
BODY = "body parse and validation"
PLANNING = "view and planning (format service up to the actor)"
ACTOR = "the actor (decide, apply, commit path)"
FILES = "file writes (worker threads)"
DB = "database write (asyncpg thread, bridge)"
ANSWER = "the answer (response body and object)"
LOGGING = "logging and metrics"
CLUSTER = "cluster (forwarding, leases)"
LOOP = "event loop (trio scheduler, epoll, task switches)"
KERNEL = "kernel, event-loop thread (socket I/O, epoll, wake-ups)"
OTHER = "other"
STAGES = (HTTP, QUART, ROUTING, BODY, PLANNING, ACTOR, FILES, DB, ANSWER, LOGGING, CLUSTER, LOOP, KERNEL, OTHER)

RULES: dict[str, str | None] = {
    # the HTTP server, its connections and sockets
    "hypercorn/": HTTP, "h11/": HTTP, "trio/_socket.py": HTTP, "trio/_highlevel_socket.py": HTTP,
    "api/transport.py": HTTP, "api/connections.py": HTTP,   # TCPServer, KeepAliveTimer
    # the framework between the server and a view
    "quart/": QUART, "quart_trio/": QUART, "api/transport.py:HTTPConnection": QUART,
    "api/transport.py:LingeringBody": QUART, "api/app.py:App.__call__": QUART,
    "api/app.py:create_app.<locals>._start": QUART,  # the before-request hook's own work (request id, NUL check)
    "api/direct.py": QUART, "api/direct.py:DirectRoutes.route": ROUTING, "api/direct.py:DirectRoutes._checked": None,
    "api/direct.py:DirectRoutes._answer": ANSWER,
    "quart/wrappers/": None, "werkzeug/": None,      # request and response objects: charged to their user
    # which view, and may the caller run it
    "werkzeug/routing/": ROUTING, "quart/routing.py": ROUTING, "quart/app.py:Quart.create_url_adapter": ROUTING,
    "quart/ctx.py:RequestContext.match_request": ROUTING, "api/routing.py": ROUTING, "api/access.py": ROUTING,
    "coordinator/auth.py": ROUTING, "jwt/": ROUTING, "api/protocol.py:Protocols.of": ROUTING,
    # the body: JSON, the duplicate-key pass, pydantic models (pydantic itself is charged to its caller)
    "api/common.py": BODY, "coordinator/iceberg/models.py": BODY, "coordinator/iceberg/changes.py": BODY,
    "coordinator/delta/models.py": BODY, "coordinator/lance/models.py": BODY, "api/lance/routes.py:_body": BODY,
    "api/lance/routes.py:_read_body": BODY, "api/lance/routes.py:_model_of": BODY,
    "api/delta/routes.py:_get_commits_request": BODY, "loadtest/bare.py": BODY,
    "coordinator/iceberg/rules/requirements.py:parse_requirements": BODY,   # (what the view parses, too)
    "coordinator/iceberg/rules/updates.py:parse_updates": BODY,
    "api/lance/routes.py:no_slash_in_the_id": ROUTING, "api/direct.py:quart_request": ROUTING,
    # the view and the format's service, up to the table's mailbox
    "api/": PLANNING, "coordinator/service.py": PLANNING, "coordinator/names.py": PLANNING,
    "coordinator/idempotency.py": PLANNING, "coordinator/iceberg/service.py": PLANNING,
    "coordinator/delta/service.py": PLANNING, "coordinator/lance/service.py": PLANNING,
    "coordinator/lance/namespaces.py": PLANNING, "coordinator/lance/batch.py": PLANNING,
    # the table's actor: mailbox, decision, rules, state, the one commit path
    "coordinator/": ACTOR, "coordinator/errors.py": None,
    # making files durable, on trio's worker threads (and the hops there and back)
    "storage/files.py": FILES, "storage/localfs.py": FILES, "storage/grouped.py": FILES, "storage/worker.py": FILES,
    "storage/warehouses.py": FILES, "trio/_threads.py": FILES, "trio/_core/_thread_cache.py": FILES,
    "loadtest/bare.py:write_file": FILES, "loadtest/bare.py:fsync_dir": FILES,   # (bare.py --durable-file)
    # the database: the group-commit writer, the bridge to its asyncio thread, asyncpg
    "storage/writer.py": DB, "storage/bridge.py": DB, "storage/postgres.py": DB, "storage/connections.py": DB,
    "storage/queries.py": DB, "storage/owner.py": DB, "asyncpg/": DB, "asyncio/": DB, "uvloop/": DB,
    "storage/": None,                                # records, paths, errors: charged to their user
    # the answer: serializing it, the response object
    "api/common.py:json_response": ANSWER, "api/common.py:empty_response": ANSWER, "api/common.py:_parts": ANSWER,
    "api/common.py:framework_error_message": ANSWER, "coordinator/iceberg/models.py:_result_json": ANSWER,
    "coordinator/iceberg/models.py:commit_result": ANSWER, "coordinator/iceberg/models.py:load_result": ANSWER,
    "coordinator/iceberg/models.py:answer_json": ANSWER, "coordinator/lance/state.py:TableVersion.to_spec": ANSWER,
    "api/lance/routes.py:version_response": ANSWER, "api/app.py:create_app.<locals>._error": ANSWER,
    "api/app.py:error_answer": ANSWER,
    "api/iceberg/errors.py": ANSWER, "api/lance/errors.py": ANSWER, "api/delta/errors.py": ANSWER,
    "api/error_map.py": ANSWER,
    "api/commits.py:error_response": ANSWER,
    # one log line and the metrics per request
    "logging/": LOGGING, "api/request_log.py": LOGGING, "api/server.py:JsonFormatter": LOGGING,
    "api/app.py:create_app.<locals>._finish": LOGGING, "api/app.py:create_app.<locals>.finish": LOGGING,
    "prometheus_client/": LOGGING, "coordinator/metrics.py": LOGGING,
    "coordinator/cluster/": CLUSTER, "storage/leases.py": CLUSTER,
    # everything else named is transparent: the entry point, trio's core and primitives, the standard library
    "api/server.py": None, "api/cli.py": None,
}


def _keys(function: str, filename: str):
    yield f"{filename}:{function}"
    if "." in function:
        yield f"{filename}:{function.split('.', 1)[0]}"
    yield filename
    parts = filename.split("/")[:-1]
    for i in range(len(parts), 0, -1):
        yield "/".join(parts[:i]) + "/"


def frame_stage(function: str, filename: str) -> tuple[bool, str | None]:
    """(whether a rule names the frame, its stage: None if transparent)."""
    for key in _keys(function, filename):
        if key in RULES:
            return True, RULES[key]
    return False, None


def stage_of(frames: list[tuple[str, str]], thread: str) -> str:
    """The stage of one sample: its innermost frame with a stage, else its thread's role."""
    for function, filename in reversed(frames):
        named, stage = frame_stage(function, filename)
        if named and stage is not None:
            return stage
    return role_stage(thread)


def role_stage(thread: str) -> str:
    if thread == "MainThread":
        return LOOP
    if thread == "storage-asyncio":   # storage/bridge.py's thread
        return DB
    return FILES


@dataclass
class Samples:
    """A raw `py-spy record --threads` file, by thread id: its name, and its samples by stage and function."""

    names: dict[int, str] = field(default_factory=dict)
    stages: dict[int, Counter] = field(default_factory=lambda: defaultdict(Counter))
    functions: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))   # stage -> own frames

    @classmethod
    def read(cls, path: Path) -> Samples:
        out = cls()
        for line in path.read_text().splitlines():
            stack, _, count_s = line.rpartition(" ")
            if not stack.startswith("thread (") or not count_s.isdigit():
                continue
            head, _, rest = stack.partition(";")
            tid_s, _, name = head.removeprefix("thread (").partition("): ")
            tid = int(tid_s.rstrip(")"))
            out.names[tid] = name.strip() or out.names.get(tid, "")
            frames = [pyspy._frame(f) for f in rest.split(";")] if rest else []
            stage = stage_of(frames, out.names[tid])
            out.stages[tid][stage] += int(count_s)
            leaf = f"{frames[-1][0]} ({frames[-1][1]})" if frames else "(no Python frame)"
            out.functions[stage][leaf] += int(count_s)
        return out


def thread_cpu(pid: int) -> dict[int, tuple[float, float]]:
    """{tid: (user s, system s)} of every live thread of `pid`, and under tid 0 the whole process's."""
    out = {}
    for tid in [0] + [int(t) for t in _listdir(f"/proc/{pid}/task")]:
        where = f"/proc/{pid}/stat" if tid == 0 else f"/proc/{pid}/task/{tid}/stat"
        try:
            with open(where) as f:
                parts = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[tid] = (int(parts[11]) / CLK_TCK, int(parts[12]) / CLK_TCK)
    return out


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


@dataclass
class Breakdown:
    """CPU ms per operation by stage, and the samples behind it."""

    ms: dict[str, float]
    samples: int
    operations: int
    functions: dict[str, Counter]
    threads: dict[str, tuple[float, float]] = field(default_factory=dict)   # name: (user, system) ms per operation

    @property
    def total_ms(self) -> float:
        return sum(self.ms.values())


def breakdown(samples: Samples, before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]],
              pid: int, operations: int) -> Breakdown:
    """Each thread's CPU over the window, shared out over its stages (module docstring), per operation."""
    ms: Counter[str] = Counter()
    threads: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    accounted = 0.0
    for tid, (user, system) in after.items():
        if tid == 0:
            continue
        user0, system0 = before.get(tid, (0.0, 0.0))
        user, system = user - user0, system - system0
        accounted += user + system
        name = samples.names.get(tid, "")
        kind = threads[(name or ("MainThread" if tid == pid else "unnamed")).rstrip("0123456789-").rstrip()]
        kind[0] += user * 1000
        kind[1] += system * 1000
        by_stage = samples.stages.get(tid)
        if tid == pid:   # the event loop's thread: its system time is its own row
            ms[KERNEL] += system * 1000
            spread = user
        else:
            spread = user + system
        if not by_stage:
            ms[role_stage(name or ("MainThread" if tid == pid else ""))] += spread * 1000
            continue
        n = sum(by_stage.values())
        for stage, count in by_stage.items():
            ms[stage] += spread * 1000 * count / n
    # Threads that ended within the window (trio's idle worker threads end after 10 s): the process's total less
    # its live threads'.
    total = sum(after[0]) - sum(before.get(0, (0.0, 0.0)))
    ms[FILES] += max(total - accounted, 0.0) * 1000
    threads["(threads that ended)"][0] += max(total - accounted, 0.0) * 1000
    per = max(operations, 1)
    return Breakdown({s: v / per for s, v in ms.items()}, sum(sum(c.values()) for c in samples.stages.values()),
                     operations, samples.functions, {k: (u / per, y / per) for k, (u, y) in threads.items()})


class Recording:
    """py-spy on the service for one measured window, with its threads' CPU read at both ends."""

    def __init__(self, pid: int, seconds: float, out: Path, rate: int = 200):
        self.pid, self.out = pid, out
        self.before = thread_cpu(pid)
        self.proc = pyspy.record(pid, max(1, round(seconds)), out, rate=rate, threads=True)

    def finish(self, operations: int) -> Breakdown:
        after = thread_cpu(self.pid)   # (py-spy ends at its own deadline, about when the load does)
        output, _ = self.proc.communicate(timeout=60)
        if self.proc.returncode != 0 or not self.out.exists():
            raise RuntimeError(f"py-spy failed ({self.proc.returncode}): {output.decode(errors='replace')[-300:]}")
        return breakdown(Samples.read(self.out), self.before, after, self.pid, operations)


def summed(parts: list[Breakdown]) -> Breakdown:
    """The breakdowns of a cluster's members, each per the same operations, as one: CPU per operation of all."""
    if len(parts) == 1:
        return parts[0]
    ms: Counter[str] = Counter()
    functions: dict[str, Counter] = {}
    threads: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for part in parts:
        ms.update(part.ms)
        for stage, counts in part.functions.items():
            functions.setdefault(stage, Counter()).update(counts)
        for name, (user, system) in part.threads.items():
            threads[name][0] += user
            threads[name][1] += system
    return Breakdown(dict(ms), sum(p.samples for p in parts), parts[0].operations, functions,
                     {k: (u, y) for k, (u, y) in threads.items()})


def table(columns: dict[str, Breakdown]) -> str:
    """Stages as rows, one column per breakdown: CPU ms per operation and its share."""
    head = ["stage"] + list(columns)
    rows = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * len(columns)]
    for stage in STAGES:
        if not any(b.ms.get(stage, 0) >= 0.0005 for b in columns.values()):
            continue
        cells = [f"{b.ms.get(stage, 0):.3f} ({100 * b.ms.get(stage, 0) / max(b.total_ms, 1e-9):.0f}%)"
                 for b in columns.values()]
        rows.append(f"| {stage} | " + " | ".join(cells) + " |")
    rows.append("| **total** | " + " | ".join(f"**{b.total_ms:.3f}**" for b in columns.values()) + " |")
    rows.append("| py-spy samples | " + " | ".join(str(b.samples) for b in columns.values()) + " |")
    return "\n".join(rows)


def thread_table(columns: dict[str, Breakdown]) -> str:
    """Each kind of thread's CPU per operation (threads by name, numbers dropped: `file-reads-0`, `-1` as one),
    user and system: the system time of file threads is their reads, writes and fsyncs."""
    names = sorted({n for b in columns.values() for n in b.threads})
    rows = ["| thread (user + system ms) | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for n in names:
        cells = [f"{u:.3f} + {y:.3f}" for u, y in (b.threads.get(n, (0.0, 0.0)) for b in columns.values())]
        rows.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def top_functions(b: Breakdown, per_stage: int = 3) -> str:
    """What each stage's samples were doing: its functions with the most own samples."""
    lines = []
    for stage in STAGES:
        counts = b.functions.get(stage)
        if not counts:
            continue
        n = sum(counts.values())
        top = ", ".join(f"{key} {100 * c / n:.0f}%" for key, c in counts.most_common(per_stage))
        lines.append(f"* {stage}: {top}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", type=Path, help="a `py-spy record --threads -f raw` file")
    args = ap.parse_args()
    samples = Samples.read(args.raw)
    counts: Counter[str] = Counter()
    for by_stage in samples.stages.values():
        counts.update(by_stage)
    n = max(sum(counts.values()), 1)
    print("| stage | share of samples |\n|---|---:|")
    for stage in STAGES:
        if counts[stage]:
            print(f"| {stage} | {100 * counts[stage] / n:.1f}% |")
    print()
    print(top_functions(Breakdown({}, n, 0, samples.functions)))


if __name__ == "__main__":
    main()
