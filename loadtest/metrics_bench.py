"""Cost of one metrics observation on the commit path: `python -m loadtest.metrics_bench [calls]`.

Each commit counts its outcome and observes its latency (and each group-commit flush and file batch one
histogram observation), through prometheus_client. Prints ns per call, best of 5 runs.
"""

from __future__ import annotations

import sys
import time

from coordinator.metrics import Metrics


def best_ns_per_call(fn, calls: int, runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - started) / calls)
    return best


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    metrics = Metrics()
    cases = {
        "Histogram.observe (db write)": lambda: metrics.db_write.observe(0.003),
        "Metrics.observe_commit (counter + histogram)": lambda: metrics.observe_commit("iceberg", "applied", 0.004),
        "empty call (loop and lambda overhead)": lambda: None,
    }
    print(f"{calls:,} calls per run, best of 5")
    print(f"{'operation':<48} {'ns/call':>8}")
    for name, fn in cases.items():
        print(f"{name:<48} {best_ns_per_call(fn, calls):>8.0f}")


if __name__ == "__main__":
    main()
