"""Rolling restarts of a cluster under commit load (loadtest/rolling_bench.py, short): each of 3 members in turn
taken out of rotation, stopped with SIGTERM and started again while writers commit through the others. A stopping
member answers what it accepted and hands its tables over; a member whose forwarded request the stopping owner
did not apply sends it to the next owner. Clients see latency only: every commit answered 200, none lost.
(`python -m loadtest.rolling_bench` is the full run: 64 writers.)"""

from __future__ import annotations

import pytest

from loadtest import rolling_bench

pytestmark = pytest.mark.crash

WRITERS = 12


def test_a_rolling_restart_fails_and_loses_no_commit():
    result = rolling_bench.run(3, WRITERS, upgrade=False, steady_s=1.0, deregister_s=0.5, settle_s=0.5)
    print(result.table)
    assert result.acknowledged > 0
    assert not result.failed, result.table
    assert not result.lost, result.lost[:10]
