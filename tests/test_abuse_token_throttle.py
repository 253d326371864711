"""Issue 39, row 8: the token throttle cannot be spent by anyone but the client itself.

The attacks of loadtest/attacks/token_throttle.py, each from addresses of its own, against `coordinator serve`
over real HTTP, while the clients they would hurt ask for tokens from theirs: wrong secrets for the writer's id
at 50 a second, and 40 requesters naming random unknown ids. Every token the clients ask for is given (200), the
attacker's guesses are cut short (429), and a client at an address it never signed in from is served too.
"""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest

from loadtest.attacks import Target
from loadtest.attacks.token_throttle import ATTACKS
from tests.support import ServerProcess, write_auth_file

CLIENTS = {"writer": ("writer", "writer-secret"), "nogrant": ("nogrant", "nogrant-secret")}
HOME = "127.0.0.1"         # where the clients signed in before
NEW_ADDRESS = "127.0.0.3"  # where a client never signed in from (neither attack sends from it)
ATTACK_S = 3.0


@pytest.fixture
def target(database_url, tmp_path):
    auth = write_auth_file(tmp_path / "auth.toml", {"writer": ("writer-secret", [("*", ["admin"])]),
                                                    "nogrant": ("nogrant-secret", [])})
    with ServerProcess(database_url, tmp_path / "srv", extra_args=["--auth-file", str(auth)]) as server:
        yield Target(server.base_url, server.proc.pid, CLIENTS)


def token_status(target: Target, role: str, source: str) -> int:
    client_id, secret = target.clients[role]
    with httpx.Client(base_url=target.base_url, timeout=30,
                      transport=httpx.HTTPTransport(local_address=source)) as http:
        return http.post("/v1/oauth/tokens", data={"grant_type": "client_credentials", "client_id": client_id,
                                                   "client_secret": secret}).status_code


def clients_during(target: Target, attack: str) -> tuple[Counter, Counter, float]:
    """What the clients' token requests got while `attack` ran, what the attack's own requests got, and how long
    it ran."""
    for role in CLIENTS:
        assert token_status(target, role, HOME) == 200   # they signed in before, as clients do
    got: Counter = Counter()
    began = time.monotonic()
    with ATTACKS[attack](target) as tally:
        time.sleep(0.5)   # the attack at full strength
        deadline = time.monotonic() + ATTACK_S
        while time.monotonic() < deadline:
            for role in CLIENTS:
                got[(role, "home", token_status(target, role, HOME))] += 1
            got[("writer", "new address", token_status(target, "writer", NEW_ADDRESS))] += 1
            time.sleep(0.3)   # (the writer stays within its own rate of tokens: 10 a second)
    return got, tally.statuses, time.monotonic() - began


def test_wrong_secrets_for_a_client_never_refuse_its_right_secret(target):
    got, attacker, lasted_s = clients_during(target, "wrong-secrets-for-a-client")
    assert {status for (_, _, status) in got} == {200}, got
    # Its guesses are limited by its address: a burst of checks (token_failures_burst, 20) and then one every
    # 5 s (token_failures_per_s); the rest refused unchecked.
    assert attacker[401] <= 20 + lasted_s / 5 and attacker[429] > attacker[401], (attacker, lasted_s)


def test_anonymous_random_ids_never_starve_named_clients(target):
    got, attacker, lasted_s = clients_during(target, "anonymous-random-ids")
    assert {status for (_, _, status) in got} == {200}, got
    # Unknown ids share one bucket of failures (five times an address's: 100, then one a second) and at most a
    # quarter of the checks waiting: the rest is refused unchecked.
    assert attacker[401] <= 100 + lasted_s and attacker[429] + attacker[503] > attacker[401], (attacker, lasted_s)
