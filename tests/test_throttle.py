"""The token throttle's rules (coordinator/auth.py Throttle) one by one, with a check that costs nothing: who may
spend what, per address and per id, and the queue's shares. (Over HTTP, as attackers drive it:
tests/test_abuse_token_throttle.py.)"""

from __future__ import annotations

import os
import threading

import pytest
import trio
import trio.testing

from coordinator.throttle import Tarpit, Throttle, source_key
from coordinator.errors import TooManyRequests, Unavailable

RIGHT, WRONG = "right", "wrong"


def throttle(**kwargs) -> Throttle:
    settings = dict(per_s=0.001, burst=100, queue_max=32, failures_per_s=0.001, failures_burst=4)
    return Throttle(**{**settings, **kwargs})


async def ask(t: Throttle, client_id: str | None, source: str, secret: str) -> str:
    try:
        return "ok" if await t.check(client_id, source, lambda s: s == RIGHT, secret) else "401"
    except TooManyRequests:
        return "429"
    except Unavailable:
        return "503"


async def test_an_address_that_fails_runs_out_of_checks_whatever_ids_it_names():
    t = throttle()
    got = [await ask(t, f"c{i}", "10.0.0.9", WRONG) for i in range(6)]
    assert got == ["401"] * 4 + ["429"] * 2
    assert await ask(t, "c0", "10.0.0.1", RIGHT) == "ok"   # another address is not held back


async def test_a_client_that_signed_in_before_is_never_held_back_by_failures_from_elsewhere():
    t = throttle()
    assert await ask(t, "etl", "10.0.0.1", RIGHT) == "ok"
    # wrong secrets for etl from 10 addresses: the id's failures (5 x 4) run out
    got = [await ask(t, "etl", f"10.1.0.{a}", WRONG) for a in range(10) for _ in range(4)]
    assert got.count("401") == 20 and got.count("429") == 20, got
    assert await ask(t, "etl", "10.0.0.1", RIGHT) == "ok"      # where it signed in before: checked
    assert await ask(t, "etl", "10.0.0.2", RIGHT) == "429"     # a new address waits for the id to recover
    # one attacking address alone cannot make the id run out: a new address is checked
    t = throttle()
    assert [await ask(t, "etl", "10.1.0.1", WRONG) for _ in range(8)].count("401") == 4
    assert await ask(t, "etl", "10.0.0.2", RIGHT) == "ok"


async def test_where_a_client_signed_in_only_that_addresss_failures_for_it_count():
    t = throttle()
    assert await ask(t, "etl", "10.0.0.1", RIGHT) == "ok"
    assert [await ask(t, "other", "10.0.0.1", WRONG) for _ in range(5)][-1] == "429"   # the address ran out
    assert await ask(t, "etl", "10.0.0.1", RIGHT) == "ok"    # but not for the client that proved itself there
    got = [await ask(t, "etl", "10.0.0.1", WRONG) for _ in range(5)]   # a guesser behind the same address
    assert got == ["401"] * 4 + ["429"]
    assert await ask(t, "etl", "10.0.0.1", RIGHT) == "429"   # ... shares its failures: indistinguishable


async def test_only_the_right_secret_spends_a_clients_tokens():
    t = throttle(burst=2, failures_burst=100)
    assert [await ask(t, "etl", "10.1.0.1", WRONG) for _ in range(10)] == ["401"] * 10
    assert [await ask(t, "etl", "10.0.0.1", RIGHT) for _ in range(3)] == ["ok", "ok", "429"]


async def test_unknown_ids_share_one_bucket_of_failures():
    t = throttle()
    got = [await ask(t, None, f"10.2.0.{i}", WRONG) for i in range(25)]   # each address fails once
    assert got.count("401") == 20 and got[20:] == ["429"] * 5, got
    assert await ask(t, "etl", "10.2.0.99", RIGHT) == "ok"   # named clients have buckets of their own


@pytest.mark.parametrize("kind,room", [(None, 8), ("etl", 24)], ids=["unknown ids", "addresses not proven"])
async def test_unproven_requests_take_a_share_of_the_queue_and_one_thread(kind, room):
    t = throttle(failures_burst=1000)
    assert await ask(t, "ci", "10.0.0.7", RIGHT) == "ok"   # signed in before
    release = threading.Event()
    refused: list[int] = []

    def stuck(secret: str) -> bool:
        release.wait()
        return secret == RIGHT

    async def flood(i: int) -> None:
        try:
            await t.check(kind, f"10.3.{i}.1", stuck, WRONG)
        except Unavailable:
            refused.append(i)
    async with trio.open_nursery() as nursery:
        for i in range(40):
            nursery.start_soon(flood, i)
        await trio.testing.wait_all_tasks_blocked()
        assert len(refused) == 40 - room
        # the client that signed in before finds a place and the other thread
        with trio.fail_after(5):
            assert await ask(t, "ci", "10.0.0.7", RIGHT) == "ok"
        release.set()


async def test_secrets_are_checked_at_the_lowest_cpu_priority():
    """So that a burst of checks (scrypt, ~50 ms of a core each) takes only the CPU that requests leave."""
    def priority(_: str) -> bool:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 19
    assert await throttle().check("etl", "10.0.0.1", priority, RIGHT)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0   # the event loop's is untouched


async def answered_at(tarpit: Tarpit, source: str, retry_after_s: float) -> float:
    await tarpit.hold(source, retry_after_s)
    return trio.current_time()


async def test_the_tarpit_answers_refusals_no_faster_than_they_say_to_ask_again(autojump_clock):
    tarpit, start = Tarpit(), trio.current_time()
    assert await answered_at(tarpit, "10.0.0.9", 5) == start            # the first refusal: at once
    assert await answered_at(tarpit, "10.0.0.9", 5) == start + 5        # asked again at once: when it was told
    assert await answered_at(tarpit, "10.0.0.1", 5) == start + 5        # another address is not held
    await trio.sleep(5)
    assert await answered_at(tarpit, "10.0.0.9", 5) == start + 10       # it waited as told: not held
    # on many connections at once: one answer per Retry-After, each connection held at most HOLD_MAX_S (10 s)
    answers: list[float] = []

    async def ask_again() -> None:
        answers.append(await answered_at(tarpit, "10.0.0.9", 2) - start - 10)
    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(ask_again)
    assert sorted(answers) == [5, 7, 9] + [Tarpit.HOLD_MAX_S] * 7, answers


def test_failures_are_counted_by_address_and_ipv6_by_its_64():
    assert source_key("192.0.2.7") == "192.0.2.7"
    assert source_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert source_key("2001:db8:1:2:aaaa::1") == source_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert source_key("2001:db8:1:3::1") != source_key("2001:db8:1:2::1")
    assert source_key(None) == "unknown"
