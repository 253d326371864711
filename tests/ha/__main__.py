"""`python -m tests.ha --rounds 5`: each of the three Patroni faults ROUNDS times under 4 writers per format
(tests/ha/failover.py); prints the figures and exits 1 if an acknowledged commit was lost, commits took longer
than 5 s to resume, or a client was answered 500 where the outcome was known."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.ha.failover import ha_run
from tests.ha.patroni import missing_tools


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.ha", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="how many times each fault is injected (5)")
    args = parser.parse_args(argv)
    if (why := missing_tools()) is not None:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="coordinator-ha-") as d:
        result = ha_run(Path(d), rounds=args.rounds)
    print(f"\n{args.rounds} x each fault under 4 writers per format ({time.monotonic() - started:.0f} s in all):")
    print(result.table())
    problems = result.problems()
    print("\n".join(problems[:20]) if problems else
          "no acknowledged commit lost, commits resumed within 5 s of every fault, no 500")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
