"""A rolling restart that upgrades the cluster channel, under commit load (loadtest/rolling_bench.py, short):
every member starts forced to the channel version before this release's (`cluster_channel_version`); each in turn
is taken out of rotation, stopped with SIGTERM and started again on this release's version while writers commit
through the others. A stopping member answers what it accepted and hands its tables over; a member whose
forwarded request the stopping owner did not apply sends it to the next owner; members of both versions talk on
the older one meanwhile. Clients see latency only: every commit answered 200, none lost.
(`python -m loadtest.rolling_bench [--upgrade]` is the full run: 3 members under 64 writers.)"""

from __future__ import annotations

import pytest

from loadtest import rolling_bench

pytestmark = pytest.mark.crash

WRITERS = 8
MEMBERS = 2


def test_a_rolling_restart_onto_the_next_channel_version_fails_and_loses_no_commit():
    result = rolling_bench.run(MEMBERS, WRITERS, upgrade=True, steady_s=1.0, deregister_s=0.5, settle_s=0.5)
    print(result.table)
    assert result.acknowledged > 0
    assert not result.failed, result.table
    assert not result.lost, result.lost[:10]
    assert result.older_links[0] > 0, result.older_links    # one member upgraded, the other not yet: the older version
    assert result.older_links[-1] == 0, result.older_links  # all upgraded: every connection on this version
