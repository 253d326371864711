"""The load tests' clients wait after a 409 as the real ones do (loadtest/retry.py), checked against the rules
in the clients' sources: Iceberg's `Tasks.runTaskWithRetry` with the table defaults, lance's `SlotBackoff` in
`commit_transaction`."""

from __future__ import annotations

import random

import pytest

from loadtest.retry import schedule


def waits(retry, now: float = 0.0) -> list[float]:
    out = []
    while (wait := retry.next_wait(now)) is not None:
        out.append(wait)
        assert len(out) < 100, "the schedule never gives up"
    return out


@pytest.mark.parametrize("seed", range(20))
def test_iceberg_waits_100_200_400_800_ms_plus_up_to_10_percent_then_gives_up(seed):
    got = waits(schedule("iceberg", "client", random.Random(seed), 0.0))
    assert len(got) == 4  # commit.retry.num-retries=4: five attempts in all
    for wait, base in zip(got, (0.1, 0.2, 0.4, 0.8)):
        assert base <= wait < base * 1.1


@pytest.mark.parametrize("seed", range(20))
def test_lance_waits_a_random_slot_of_4_8_16_sized_by_the_first_attempt(seed):
    retry = schedule("lance", "client", random.Random(seed), started=10.0)
    unit = 0.02 * 1.1  # the first attempt took 20 ms; lance adds 10%
    first = retry.next_wait(10.02)
    assert first / unit == pytest.approx(round(first / unit)) and 0 <= round(first / unit) < 4
    rest = waits(retry, now=99.0)   # later attempts keep the first attempt's unit
    assert len(rest) == 18          # 20 attempts in all: 19 waits
    for k, wait in enumerate(rest[:6], start=1):
        slot = round(wait / unit)
        assert wait == pytest.approx(slot * unit) and 0 <= slot < 4 * 2 ** k


def test_lance_slots_are_spread_not_fixed():
    firsts = {round(schedule("lance", "client", random.Random(s), 0.0).next_wait(0.01) / 0.011) for s in range(200)}
    assert firsts == {0, 1, 2, 3}


def test_at_once_never_waits_nor_gives_up():
    retry = schedule("iceberg", "at-once", random.Random(0), 0.0)
    assert [retry.next_wait(0.0) for _ in range(50)] == [0.0] * 50


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="client, at-once"):
        schedule("iceberg", "eventually", random.Random(0), 0.0)
