"""A rolling restart (or upgrade) under load: `python -m loadtest.rolling_bench [--writers 64] [--upgrade]`.

Starts a throwaway PostgreSQL and `--members` cluster members, creates one Iceberg table per writer, and has
`--writers` writers commit without pause, each commit sent once through the next member in rotation (a
round-robin load balancer). After `--steady` seconds, each member in turn is taken out of rotation, given
`--deregister` seconds (a balancer's deregistration delay: requests already sent to it still finish), stopped
with SIGTERM, started again and put back once the shards are balanced. Every answer is logged; at the end every
table is read back. Prints one table: commits and their latency before and during the restarts (p50/p99/max),
failed commits (any answer but 200, or none) and lost ones (acknowledged but not on the table's main branch).

`--upgrade` starts every member speaking the previous cluster channel version (COORDINATOR_CLUSTER_CHANNEL_VERSION,
docs/cluster.md) and restarts each on the current one: members of both versions serve side by side meanwhile.
`--from-checkout DIR` starts every member from another checkout instead (a `git worktree` of the previous
release: `git worktree add /tmp/previous <commit>`), run with this checkout's Python environment, and restarts each
on this one. After each restart the members' connections still on the older channel version are counted
(`coordinator_cluster_channel_connections_older`, on members that report it).

Exits 1 if any commit failed or was lost.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from coordinator.cluster.channel import VERSION

from . import cluster_load, procs
from .cluster_load import Cluster, Commit, Log, Workdir, Writer, percentile

OLDER_CHANNEL = {"COORDINATOR_CLUSTER_CHANNEL_VERSION": str(VERSION - 1)}


@dataclass
class Rolling:
    table: str                # what main prints
    failed: list[Commit]      # answered anything but 200, or not at all
    lost: list[str]           # acknowledged, not on the table's main branch
    acknowledged: int
    older_links: list[float]  # after each restart: connections on the older channel version, all members summed


def run(members: int, writers: int, *, upgrade: bool = False, old_code: Path | None = None, steady_s: float,
        deregister_s: float, settle_s: float, keep: bool = False) -> Rolling:
    """`upgrade`: start on the older channel version (forced); `old_code`: start from that checkout."""
    first_env = OLDER_CHANNEL if upgrade else None
    first_code = old_code or procs.ROOT
    what = (f"rolling upgrade from channel version {VERSION - 1} (forced) to {VERSION}" if upgrade else
            f"rolling upgrade from the checkout {old_code} to this one" if old_code else "rolling restart")
    older_links: list[float] = []
    with Workdir(keep, "coordinator-rolling-") as root:
        cluster = Cluster(members, root)
        log, stop = Log(), threading.Event()
        threads: list[Writer] = []
        restarts: list[tuple[float, float, float]] = []   # (out of rotation, back in, SIGTERM to exit)
        try:
            print(f"starting PostgreSQL and {members} members"
                  + (f" on channel version {VERSION - 1}" if upgrade else f" from {old_code}" if old_code else ""),
                  flush=True)
            cluster.start(first_env, first_code)
            tables = cluster_load.create_tables(cluster.members[0].base, [f"t{i}" for i in range(writers)])
            threads = [Writer(cluster, t, log, stop) for t in tables]
            for w in threads:
                w.start()
            warm = _warm_up(log, set(tables))
            time.sleep(steady_s)
            for m in cluster.members:
                out = time.monotonic()
                m.in_rotation = False
                time.sleep(deregister_s)
                exit_s = m.stop()
                m.start(None)
                cluster.wait_balanced()
                time.sleep(settle_s)
                back = time.monotonic()
                restarts.append((out, back, exit_s))
                failed = sum(1 for c in log.snapshot() if c.code != 200)
                gauges = [m.gauge("coordinator_cluster_channel_connections_older") for m in cluster.members]
                older_links.append(sum(g for g in gauges if g is not None))
                print(f"  member {m.index} restarted{' on this version' if upgrade or old_code else ''}: exited "
                      f"{exit_s:.1f} s after SIGTERM, back in rotation after {back - out:.1f} s; failed commits "
                      f"so far: {failed}; connections on the older channel version: {older_links[-1]:.0f}",
                      flush=True)
            time.sleep(settle_s)
        finally:
            stop.set()
            for w in threads:
                w.join(cluster_load.CLIENT_TIMEOUT_S)
            missing = cluster_load.lost(cluster.members[0].base, log) if threads else []
            cluster.stop()
    commits = log.snapshot()
    start, end = restarts[0][0], restarts[-1][1]
    before = [c for c in commits if warm <= c.sent < start]
    during = [c for c in commits if start <= c.sent <= end]
    failed = [c for c in commits if c.code != 200]
    out = [f"\n{what}: {members} members one at a time, {writers} writers (one table each), "
          f"{deregister_s:.1f} s deregistration delay",
           "| commits sent | count | per s | p50 (ms) | p99 (ms) | max (ms) | failed |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for name, rows, span in (("before the restarts", before, start - warm),
                             ("during the restarts", during, end - start)):
        lat = [(c.at - c.sent) * 1000 for c in rows]
        out.append(f"| {name} | {len(rows)} | {len(rows) / span:.0f} | {percentile(lat, 0.5):.0f} | "
                   f"{percentile(lat, 0.99):.0f} | {max(lat, default=0):.0f} | "
                   f"{sum(1 for c in rows if c.code != 200)} |")
    acked = sum(1 for c in commits if c.code == 200)
    out.append(f"acknowledged: {acked}; failed: {len(failed)} {dict(Counter(str(c.code) for c in failed))}; "
          f"lost: {len(missing)}; connections refused by a member that had just stopped (sent on to the next, as "
          f"a balancer does): {log.refused}")
    out += [f"  failed: {c.table} via member {c.member}: {c.code} {c.text}" for c in failed[:10]] + missing[:10]
    return Rolling("\n".join(out), failed, missing, acked, older_links)


def _warm_up(log: Log, tables: set[str], timeout_s: float = 120) -> float:
    """Until every writer has had a commit acknowledged (each loads its table first); returns that moment."""
    deadline = time.monotonic() + timeout_s
    while {c.table for c in log.snapshot() if c.code == 200} < tables:
        if time.monotonic() > deadline:
            raise SystemExit(f"writers had no commit acknowledged within {timeout_s:.0f} s")
        time.sleep(0.1)
    return time.monotonic()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.rolling_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--writers", type=int, default=64)
    parser.add_argument("--upgrade", action="store_true",
                        help=f"start on channel version {VERSION - 1}, restart each member on {VERSION}")
    parser.add_argument("--from-checkout", type=Path, metavar="DIR",
                        help="start every member from this checkout (the previous release), restart each on this one")
    parser.add_argument("--steady", type=float, default=5.0, help="seconds of load before the first restart")
    parser.add_argument("--deregister", type=float, default=0.5,
                        help="seconds between taking a member out of rotation and stopping it")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds of load after each member is back")
    parser.add_argument("--keep", action="store_true",
                        help="keep the members' logs (with LOADTEST_MEMBER_LOG_LEVEL=info: their leases' moves)")
    args = parser.parse_args(argv)
    result = run(args.members, args.writers, upgrade=args.upgrade, old_code=args.from_checkout, steady_s=args.steady,
                 deregister_s=args.deregister, settle_s=args.settle, keep=args.keep)
    print(result.table)
    return 1 if result.failed or result.lost else 0


if __name__ == "__main__":
    sys.exit(main())
