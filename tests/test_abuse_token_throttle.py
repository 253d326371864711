"""Issue 39, row 8: the token throttle cannot be spent by anyone but the client itself, and a flood of refused
token requests slows no one else.

The attacks of loadtest/attacks/token_throttle.py, each from addresses of its own, against `coordinator serve`
over real HTTP, while the clients they would hurt ask for tokens and commit from theirs: wrong secrets for the
writer's id at 50 a second, and 40 requesters naming random unknown ids, each asking again as soon as it is
answered. Every token the clients ask for is given (200), a client at an address it never signed in from is
served too, a writer commits about as often as without the attack, and the attacker's guesses are cut short
(429), each refusal answered no sooner than its Retry-After says (coordinator/throttle.py Tarpit).
"""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest

from loadtest.attacks import Target
from loadtest.attacks.token_throttle import ATTACKS
from tests.support import ServerProcess, commits_in, fetch_token, write_auth_file

CLIENTS = {"writer": ("writer", "writer-secret"), "nogrant": ("nogrant", "nogrant-secret")}
HOME = "127.0.0.1"         # where the clients signed in before
NEW_ADDRESS = "127.0.0.3"  # where a client never signed in from (neither attack sends from it)
WINDOW_S = 3.0
TABLE = "/v1/namespaces/db/tables/t"
SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


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


@pytest.mark.parametrize("attack, addresses", [("wrong-secrets-for-a-client", 1), ("anonymous-random-ids", 40)])
def test_a_token_flood_neither_refuses_clients_nor_slows_a_writer(target, attack, addresses):
    """While the attack runs, every token the clients ask for (from where they signed in before, and from a new
    address) is given, and a writer from its own address commits at least half as often as without it. The
    attacker's refusals come no faster than they tell it to ask again (Retry-After, at least a second), per
    address: answering them as fast as it asked took the event loop from everyone else."""
    writer = fetch_token(target.base_url, *CLIENTS["writer"])
    for role in CLIENTS:
        assert token_status(target, role, HOME) == 200   # they signed in before, as clients do
    with httpx.Client(base_url=target.base_url, timeout=60, headers={"Authorization": f"Bearer {writer}"},
                      transport=httpx.HTTPTransport(local_address=HOME)) as http:
        assert http.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
        assert http.post("/v1/namespaces/db/tables", json={"name": "t", "schema": SCHEMA}).status_code == 200
        alone = commits_in(http, TABLE, WINDOW_S)
        got: Counter = Counter()
        with ATTACKS[attack](target) as tally:
            began = time.monotonic()
            # The attack at full strength: the secret checks it may have (a burst of them) spent.
            checks = min(20 * addresses, 100)
            while tally.statuses[401] < checks and time.monotonic() < began + 20:
                time.sleep(0.1)
            during = commits_in(http, TABLE, WINDOW_S)
            deadline = time.monotonic() + WINDOW_S
            while time.monotonic() < deadline:
                for role in CLIENTS:
                    got[(role, "home", token_status(target, role, HOME))] += 1
                got[("writer", "new address", token_status(target, "writer", NEW_ADDRESS))] += 1
                time.sleep(0.3)   # (the writer stays within its own rate of tokens: 10 a second)
            attacker, lasted_s = Counter(tally.statuses), time.monotonic() - began
    assert {status for (_, _, status) in got} == {200}, got
    assert during >= alone / 2, (alone, during, attacker)
    # Checked guesses are bounded per address (a burst of token_failures_burst, 20, then one every 5 s) and, for
    # unknown ids, together (100, then one a second); every refusal ("later") held until its Retry-After.
    assert attacker[401] <= checks + lasted_s, (attacker, lasted_s)
    assert attacker[429] + attacker[503] <= addresses * (1 + lasted_s), (attacker, lasted_s)
