"""The commit feed under attack by clients that may read little or nothing (issue 39 rows 5 and 6), driven as the
attacker would (loadtest/attacks/feed.py) over real HTTP against the service as a process, authentication on:
what a reader is answered tells it nothing of a table it may not read, and a flood of long-polls neither slows a
steady writer nor grows past its bounds."""

from __future__ import annotations

import statistics
import time

import httpx
import pytest

from loadtest.attacks import Target
from loadtest.attacks.feed import ATTACKS, COMMITS, token
from loadtest.procs import proc_cpu_s
from tests.support import ServerProcess, write_auth_file

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
CLIENTS = {
    "writer": ("writer-secret", [("*", ["admin"])]),
    "nogrant": ("nogrant-secret", []),
    # may read one namespace of its own: its reads go through the grants in the store's query
    "partial": ("partial-secret", [("iceberg//mine", ["read"]), {"table": "delta/main/default/t", "privileges": ["read"]}]),
}
PER_CLIENT, IN_ALL = 300, 350   # the waiting readers' bounds the flood meets


@pytest.fixture
def target(database_url, tmp_path):
    auth = write_auth_file(tmp_path / "auth.toml", CLIENTS)
    env = {"COORDINATOR_FEED_WAITERS_PER_CLIENT": str(PER_CLIENT), "COORDINATOR_FEED_WAITERS_MAX": str(IN_ALL)}
    with ServerProcess(database_url, tmp_path / "service", extra_args=["--auth-file", str(auth)],
                       extra_env=env) as server:
        yield Target(server.base_url, server.proc.pid, {role: (role, secret) for role, (secret, _) in CLIENTS.items()})


def test_a_reader_that_may_not_read_a_table_cannot_tell_it_from_a_missing_one(target):
    """Every page a prober gets for the table (created and committed to 6 times) is the page it gets for a name no
    table has, at the same moment: the same events (none), the same `next`, the same status, from the start of the
    feed and from a token from before the table existed, whether it may read nothing or something else."""
    with ATTACKS["feed-probe-hidden-table"](target) as probe:
        probe.wait_rounds(2)
    assert probe.writer_sees == COMMITS + 1, "the table's creation and its commits are in the feed"
    assert not probe.errors, probe.errors[:3]
    assert {(r.prober, r.start) for r in probe.stable_rounds()} == {(p, s) for p in ("nogrant", "partial")
                                                                   for s in ("oldest", "before")}
    leak = next(iter(probe.leaks()), None)
    assert leak is None, (f"{leak.prober} from {leak.start}: {len(leak.table)} pages for {probe.table}, "
                          f"{len(leak.missing)} for {probe.missing}: {leak.table} vs {leak.missing}")


def _writer(target: Target):
    http = httpx.Client(base_url=target.base_url, timeout=60,
                        headers={"Authorization": f"Bearer {token(target, 'writer')}"})
    for namespace in ("steady", "made"):
        assert http.post("/v1/namespaces", json={"namespace": [namespace]}).status_code == 200
    assert http.post("/v1/namespaces/steady/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
    made = iter(range(10**6))

    def window(duration_s: float) -> tuple[list[float], list[float]]:
        commits, lists = [], []
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            for _ in range(4):
                started = time.monotonic()
                r = http.post("/v1/namespaces/steady/tables/t", json={"requirements": [], "updates": [
                    {"action": "set-properties", "updates": {"n": str(next(made))}}]})
                assert r.status_code == 200, r.text
                commits.append(time.monotonic() - started)
            started = time.monotonic()
            assert http.get("/v1/namespaces/steady/tables").status_code == 200
            r = http.post("/v1/namespaces/made/tables", json={"name": f"t{next(made)}", "schema": SCHEMA})
            assert r.status_code == 200, r.text
            lists.append(time.monotonic() - started)
        return commits, lists

    def measure(windows: int = 4, window_s: float = 0.5) -> dict[str, float]:
        """A steady writer's commits (one after the other) and, between them, a listing and a table's creation:
        their medians in the quietest of a few short windows (the machine's other load only ever adds), and the
        service's CPU per request over all of them (which that load moves much less)."""
        cpu, requests, medians = proc_cpu_s(target.pid), 0, []
        for _ in range(windows):
            commits, lists = window(window_s)
            requests += len(commits) + 2 * len(lists)
            medians.append((statistics.median(commits), statistics.median(lists)))
        return {"commit": min(m[0] for m in medians), "list+create": min(m[1] for m in medians),
                "cpu/request": (proc_cpu_s(target.pid) - cpu) / requests}
    return measure


def test_a_long_poll_flood_slows_no_writer_and_what_is_beyond_its_bounds_is_refused(target):
    """A client that may read nothing opens 800 long-polls: the first PER_CLIENT wait (each costs the service a
    sleeping task, no read per commit) and the rest get 429 at once, with Retry-After; another client's long-polls
    past IN_ALL in all get 503. Meanwhile a steady writer's commits, and a listing with a create, take about what
    they took before."""
    measure = _writer(target)
    measure(2, 0.5)   # warm
    before = measure()
    flood = ATTACKS["feed-long-poll-flood"]
    with flood(target, polls=800, wait_s=30, retry_refused=False) as mine:
        mine.settle()
        with flood(target, polls=100, wait_s=30, role="partial", retry_refused=False) as theirs:
            theirs.settle()
            time.sleep(1.0)   # (the waiting readers' own first reads done)
            during = measure()
            held = (mine.outstanding, theirs.outstanding)
    slower = {k: during[k] / before[k] for k in ("commit", "list+create", "cpu/request")}
    # The service's CPU per request is the steady figure; latencies move with whatever else the two cores run (the
    # suite runs another test file beside this one), so they get a looser bound: a wake-up per waiter per commit
    # made them 100-200x.
    assert slower["cpu/request"] < 2 and slower["commit"] < 5 and slower["list+create"] < 5, (
        f"with {sum(held)} long-polls waiting: {during} against {before} before")
    assert held == (PER_CLIENT, IN_ALL - PER_CLIENT)
    assert mine.answered == {429: 800 - PER_CLIENT} and theirs.answered == {503: 100 - (IN_ALL - PER_CLIENT)}
    assert set(mine.retry_after) == set(theirs.retry_after) == {"1"}
    assert max(mine.refused_s + theirs.refused_s) < 5, "a refusal comes at once, not after the wait"
