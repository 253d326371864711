"""The service on a Patroni pair (synchronous mode) under 4 writers per format, through a postmaster SIGKILL, a
`patronictl switchover` and a stop of the primary's Patroni, one of each (`python -m tests.ha --rounds 5` runs
each five times): nothing acknowledged lost, no format more than 5 s without an acknowledged commit, every other
answer a 503 with Retry-After whose commit is absent, never a 500."""

from __future__ import annotations

import time

import pytest

from tests.ha.failover import ha_run
from tests.ha.patroni import missing_tools

pytestmark = [pytest.mark.crash, pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))]


def test_patroni_failover_switchover_and_stop_under_load_lose_nothing(tmp_path):
    started = time.monotonic()
    result = ha_run(tmp_path, rounds=1)
    print(f"one of each fault under 4 writers per format ({time.monotonic() - started:.0f} s):\n{result.table()}")
    assert not result.problems(), result.problems()[:10]
    assert len(result.run.faults) == 3
