"""The service on a Patroni pair under commit load from all three formats (tests/db_outage.py: 4 writers per
format, each commit sent once and its answer checked against the tables afterwards), with the three faults of
tests/ha/patroni.py injected in turn: no acknowledged commit lost, no format goes more than RESUME_WITHIN_S
without an acknowledged commit around any fault, no 500 where the outcome is known (every 503 carries Retry-After and its commit is absent)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from tests.db_outage import OutageRun, run_under_load, writer_events
from tests.ha.patroni import PatroniCluster, patroni_cluster
from tests.support import ServerProcess

RESUME_WITHIN_S = 5.0
FAULTS = ("postmaster SIGKILL", "patronictl switchover", "Patroni stop")


@dataclass
class HaRun:
    run: OutageRun
    events: str
    rounds: int

    def problems(self) -> list[str]:
        out = list(self.run.problems())
        if not self.run.figures.clean:
            out.append(self.run.figures.problems())
        for f in self.run.faults:
            for fmt, gap in f.longest_gap_s.items():
                if gap is None or gap > RESUME_WITHIN_S:
                    out.append(f"{f.name}: {fmt} had no commit for "
                               f"{'the rest of the run' if gap is None else f'{gap:.1f} s'} "
                               f"(limit {RESUME_WITHIN_S:.0f} s)")
        return out

    def table(self) -> str:
        """One row per kind of fault: the longest time a format went without an acknowledged commit (from the
        last before the fault to the first sent after it was over), over every injection and format; and what
        the writers were answered in all."""
        lines = ["| fault | injected | fault over after, max (s) | longest time without a commit, median / max (s)"
                 " |", "|---|---:|---:|---:|"]
        for name in FAULTS:
            seen = [f for f in self.run.faults if f.name == name]
            if not seen:
                continue
            gaps = [g for f in seen for g in f.longest_gap_s.values()]
            over = max(f.done - f.at for f in seen)
            lines.append(f"| {name} | {len(seen)} | {over:.1f} | "
                         + (f"{statistics.median(gaps):.1f} / {max(gaps):.1f} |" if None not in gaps else
                            "never resumed |"))
        counts = self.run.figures.counts
        acked = sum(c["acked"] for c in counts.values())
        lines += ["", "answers by format and status:", self.run.table(), "",
                  f"acknowledged commits: {acked}; lost: {len(self.run.figures.lost)}; {self.events}"]
        return "\n".join(lines)


def faults(cluster: PatroniCluster) -> list[tuple[str, object]]:
    return [(FAULTS[0], cluster.kill_postmaster), (FAULTS[1], cluster.switchover),
            (FAULTS[2], cluster.stop_primary_patroni)]


def ha_run(workdir: Path, rounds: int = 1) -> HaRun:
    """`rounds` times each of the three faults, in turn, under one load on one service."""
    with patroni_cluster() as cluster:
        print(f"Patroni pair up: {cluster.dsn}", flush=True)
        server = ServerProcess(cluster.dsn, workdir / "srv")
        base = server.start()
        run = None
        try:
            run = run_under_load(base, lambda: cluster.dsn, faults(cluster) * rounds, between=cluster.recover,
                                 before_s=2.0, after_s=1.0)
        finally:
            server.stop()
        return HaRun(run, writer_events(server.log_path), rounds)
