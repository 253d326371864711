"""Takeover after a crash: `python -m loadtest.takeover_bench [--kills 10] [--lease-ttl 3]`.

Starts a throwaway PostgreSQL and `--members` cluster members, creates `--tables` Iceberg tables and has one
writer per table commit through member 0 (never killed) without pause. Then, `--kills` times: SIGKILL another
member (taking turns), and measure, for the tables whose shards it owned, the time from the SIGKILL to the first
commit another member applied (acknowledged to a commit sent after the kill) — for its first table and for the
last of them — then start it again and wait until the shards are balanced. Prints p50/p99 over the kills beside
the bound the settings give: a dead member's leases expire `lease_ttl_s` after its last renewal, which was at most
`lease_renew_s` before the kill, and the others look for expired leases every `lease_renew_s`, so its tables are
served again within lease_ttl_s + 2 x lease_renew_s of the kill, plus the time to load a table and commit.
Exits 1 if an acknowledged commit was lost or a takeover took longer than that bound plus `--slack`.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from . import cluster_load
from .cluster_load import Cluster, Log, Workdir, Writer, percentile

RENEW_S = 0.5   # Config.lease_renew_s, left at its default


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.takeover_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--tables", type=int, default=24)
    parser.add_argument("--lease-ttl", type=float, default=3.0, help="COORDINATOR_LEASE_TTL_S (default 3)")
    parser.add_argument("--slack", type=float, default=2.0,
                        help="what a takeover may take beyond lease_ttl_s + 2 x lease_renew_s (s)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the members' logs (with LOADTEST_MEMBER_LOG_LEVEL=info: their leases' moves)")
    args = parser.parse_args(argv)
    env = {"COORDINATOR_LEASE_TTL_S": str(args.lease_ttl)}
    bound = args.lease_ttl + 2 * RENEW_S
    with Workdir(args.keep, "coordinator-takeover-") as root:
        cluster = Cluster(args.members, root)
        try:
            print(f"starting PostgreSQL and {args.members} members (lease_ttl_s {args.lease_ttl})", flush=True)
            cluster.start(env)
            survivor = cluster.members[0]
            shards = cluster_load.create_tables(survivor.base, [f"t{i}" for i in range(args.tables)])
            log, stop = Log(), threading.Event()
            writers = [Writer(cluster, t, log, stop, via=survivor) for t in shards]
            for w in writers:
                w.start()
            rows = []
            for k in range(args.kills):
                victim = cluster.members[1 + k % (args.members - 1)]
                cluster.wait_balanced()
                time.sleep(1.0)
                owners = cluster.owners()
                theirs = sorted(t for t, s in shards.items() if owners[s] == victim.address)
                if not theirs:
                    print(f"  kill {k + 1}: member {victim.index} owns none of the tables; skipped", flush=True)
                    continue
                at = victim.kill()
                first = _first_acks(log, theirs, at, timeout_s=bound + 30)
                rows.append((min(first.values()), max(first.values()), len(theirs)))
                print(f"  kill {k + 1}: member {victim.index} ({len(theirs)} tables): first commit by another "
                      f"member {rows[-1][0]:.2f} s after the SIGKILL, all its tables {rows[-1][1]:.2f} s",
                      flush=True)
                victim.start(env)
            stop.set()
            for w in writers:
                w.join(60)
            missing = cluster_load.lost(survivor.base, log)
        finally:
            cluster.stop()
    firsts, lasts = [r[0] for r in rows], [r[1] for r in rows]
    acked = sum(1 for c in log.snapshot() if c.code == 200)
    print(f"\n{len(rows)} SIGKILLs of a member, {args.members} members, {args.tables} tables with a writer each "
          f"through a surviving member; lease_ttl_s {args.lease_ttl}, lease_renew_s {RENEW_S}")
    print("| from the SIGKILL to | p50 (s) | p99 (s) | max (s) | bound: lease_ttl_s + 2 x lease_renew_s (s) |")
    print("|---|---:|---:|---:|---:|")
    for name, values in (("the first commit on its tables", firsts), ("a commit on every one of its tables", lasts)):
        print(f"| {name} | {percentile(values, 0.5):.2f} | {percentile(values, 0.99):.2f} | {max(values):.2f} | "
              f"{bound:.1f} |")
    print(f"acknowledged commits: {acked}; lost: {len(missing)}")
    problems = missing[:10] + [f"a takeover took {v:.2f} s, over {bound:.1f} + {args.slack:.1f} s"
                               for v in lasts if v > bound + args.slack]
    print("\n".join(problems) or "nothing lost; every takeover within the bound")
    return 1 if problems else 0


def _first_acks(log: Log, tables: list[str], at: float, timeout_s: float) -> dict[str, float]:
    """Per table, seconds from `at` to the first acknowledgement of a commit sent after it."""
    deadline = time.monotonic() + timeout_s
    while True:
        first: dict[str, float] = {}
        for c in log.snapshot():
            if c.table in tables and c.sent > at and c.code == 200:
                first[c.table] = min(first.get(c.table, c.at - at), c.at - at)
        if len(first) == len(tables):
            return first
        if time.monotonic() > deadline:
            raise SystemExit(f"tables {sorted(set(tables) - set(first))} had no commit within {timeout_s:.0f} s "
                             f"of the SIGKILL")
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
