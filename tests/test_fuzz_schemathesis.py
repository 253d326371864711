"""Schemathesis against all three protocols over real HTTP: no 5xx, and every error in the protocol's own format.

Issue 7, "Hostile and broken input": "run schemathesis against all three ... zero 5xx, every error in the
protocol's format". Each protocol's OpenAPI document is read from the running service (`GET /openapi/<name>.yaml`)
and narrowed to what the service serves: for Iceberg the endpoints `/v1/config` advertises; for Lance the routes
of api/lance/routes.py (an unserved Lance operation answers 406 "Unsupported" by design, which is not what is tested
here); for Unity Catalog the whole document, which lists only served routes.

Some state is created first (a namespace, a table, a view; a catalog, a schema, a managed table) so that requests
get past "no such namespace" into the commit rules. Each operation gets a sample of Schemathesis's coverage cases
(boundary values, then each constraint broken in turn; every other one aimed at the seeded state) and random
cases aimed at the seeded state, valid and invalid (positive and negative modes). Generation is derandomized,
so a CI failure reproduces; every failure is collected (with a curl command) and reported together. A dropped
connection or a timeout counts as a failure: like a 5xx, it leaves the client not knowing what happened.

Each protocol is fuzzed twice: with authentication off (whatever credential a case carries is not looked at), and
with it on, every case carrying a valid token: an admin's on most cases, on every third a client that may only
read and write part of the seeded state, so that the authorization paths are fuzzed too. The run counts, per
operation, how many cases reached their handler (not stopped at the door with a 401/403, nor by a route that does
not exist), and fails if an operation never did.

Sized for CI's 2-core machine (about a minute for the three): `COORDINATOR_FUZZ_COVERAGE_CASES` (30) coverage
cases and `COORDINATOR_FUZZ_EXAMPLES` (5) random cases per mode for each operation; raise them for a deeper run,
e.g. `COORDINATOR_FUZZ_EXAMPLES=200 python -m pytest -n 0 -s tests/test_fuzz_schemathesis.py`.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup

from api.server import EmbeddedService
from tests.support import fetch_token, write_auth_file

from .delta.conftest import COLUMNS, FIRST, first_commit, table_properties, write_log_file

DELTA_V1_SPEC = Path(__file__).parent / "delta" / "unity-catalog-delta-open-api.yaml"
EXAMPLES = int(os.environ.get("COORDINATOR_FUZZ_EXAMPLES", "5"))
COVERAGE_CASES = int(os.environ.get("COORDINATOR_FUZZ_COVERAGE_CASES", "30"))
UC = "/api/2.1/unity-catalog"


# -- the protocols' error formats (custom checks) ----------------------------------------------------------------


def _error_body(response, case) -> dict | None:
    """The JSON error body to check, or None when there is nothing to check (a success, or HEAD: no body)."""
    if response.status_code < 400 or case.method.upper() == "HEAD":
        return None
    content_type = (response.headers.get("content-type") or [""])[0]   # lower-case keys, list values
    assert content_type.startswith("application/json"), f"error with Content-Type {content_type!r}, not JSON"
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"error body is not JSON: {response.text[:200]!r}") from None
    assert isinstance(body, dict), f"error body is not a JSON object: {response.text[:200]!r}"
    return body


def iceberg_error_format(ctx, response, case) -> None:
    """Iceberg REST `IcebergErrorResponse`: `{"error": {"message", "type", "code"}}`, code = the HTTP status."""
    body = _error_body(response, case)
    if body is None:
        return
    err = body.get("error")
    assert set(body) == {"error"} and isinstance(err, dict), f"not an IcebergErrorResponse: {body}"
    assert isinstance(err.get("message"), str) and isinstance(err.get("type"), str), f"ErrorModel: {err}"
    assert err.get("code") == response.status_code, f"ErrorModel.code {err.get('code')} != {response.status_code}"


# Lance spec, "Error Code to HTTP Status Mapping".
LANCE_STATUS = {0: 406, 1: 404, 2: 409, 3: 409, 4: 404, 5: 409, 6: 404, 7: 409, 8: 404, 9: 409, 10: 404, 11: 404,
                12: 404, 13: 400, 14: 409, 15: 403, 16: 401, 17: 503, 18: 500, 19: 409, 20: 400, 21: 429, 22: 404,
                23: 409}


def lance_error_format(ctx, response, case) -> None:
    """Lance `ErrorResponse`: `{"error", "code", "detail", "instance"}`, with the status the spec maps `code` to."""
    body = _error_body(response, case)
    if body is None:
        return
    assert {"error", "code", "detail", "instance"} <= set(body), f"not a Lance ErrorResponse: {body}"
    assert isinstance(body["error"], str) and isinstance(body["code"], int), f"ErrorResponse types: {body}"
    assert LANCE_STATUS.get(body["code"]) == response.status_code, (
        f"code {body['code']} maps to {LANCE_STATUS.get(body['code'])}, answered {response.status_code}")


# delta.yaml's `DeltaErrorType`.
DELTA_V1_TYPES = frozenset(yaml.safe_load(DELTA_V1_SPEC.read_text())["components"]["schemas"]["DeltaErrorType"]["enum"])


def delta_v1_error_format(ctx, response, case) -> None:
    """Unity Catalog's Delta API v1.0 `DeltaErrorResponse`: `{"error": {"type", "code", "message"}}`, the type one
    of `DeltaErrorType`, the code the HTTP status."""
    iceberg_error_format(ctx, response, case)   # the same envelope as Iceberg's
    body = _error_body(response, case)
    if body is not None:
        assert body["error"]["type"] in DELTA_V1_TYPES, f"not a DeltaErrorType: {body['error']['type']}"


def uc_error_format(ctx, response, case) -> None:
    """Unity Catalog: `{"error_code", "message"}` (with `details`)."""
    body = _error_body(response, case)
    if body is None:
        return
    assert isinstance(body.get("error_code"), str) and isinstance(body.get("message"), str), (
        f"not a Unity Catalog error: {body}")


# -- what each protocol serves, and the state the fuzzer aims at ----------------------------------------------------


# api/lance/routes.py's routes (method, spec path). The spec's other operations answer 406 Unsupported by design.
LANCE_SERVED = {
    ("POST", "/v1/namespace/{id}/create"), ("GET", "/v1/namespace/{id}/list"),
    ("POST", "/v1/namespace/{id}/describe"), ("POST", "/v1/namespace/{id}/exists"),
    ("POST", "/v1/namespace/{id}/drop"), ("GET", "/v1/namespace/{id}/table/list"), ("GET", "/v1/table"),
    ("POST", "/v1/table/{id}/declare"), ("POST", "/v1/table/{id}/describe"), ("POST", "/v1/table/{id}/exists"),
    ("POST", "/v1/table/{id}/register"), ("POST", "/v1/table/{id}/deregister"), ("POST", "/v1/table/{id}/drop"),
    ("POST", "/v1/table/{id}/version/create"), ("POST", "/v1/table/{id}/version/describe"),
    ("POST", "/v1/table/{id}/version/list"), ("POST", "/v1/table/{id}/version/delete"),
    ("POST", "/v1/table/version/batch-create"), ("POST", "/v1/table/batch-commit"),
    ("POST", "/v1/transaction/{id}/describe"), ("POST", "/v1/transaction/{id}/alter"),
}

ICEBERG_PREFIX = "fuzz"
SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


def seed_iceberg(http: httpx.Client) -> dict[str, str]:
    base = f"/v1/{ICEBERG_PREFIX}/namespaces"
    _ok(http.post(base, json={"namespace": ["fuzz_ns"]}))
    _ok(http.post(f"{base}/fuzz_ns/tables", json={"name": "fuzz_t", "schema": SCHEMA}))
    _ok(http.post(f"{base}/fuzz_ns/views", json={
        "name": "fuzz_v", "schema": SCHEMA, "properties": {},
        "view-version": {"version-id": 1, "timestamp-ms": int(time.time() * 1000), "schema-id": 0, "summary": {},
                         "default-namespace": ["fuzz_ns"],
                         "representations": [{"type": "sql", "sql": "select 1 as id", "dialect": "spark"}]}}))
    return {"prefix": ICEBERG_PREFIX, "namespace": "fuzz_ns", "table": "fuzz_t", "view": "fuzz_v"}


def seed_lance(http: httpx.Client) -> dict[str, str]:
    _ok(http.post("/v1/namespace/fuzz_ns/create", json={}))
    _ok(http.post("/v1/table/fuzz_ns$fuzz_t/declare", json={}))
    return {"id": "fuzz_ns$fuzz_t"}


def seed_delta(http: httpx.Client) -> dict[str, str]:
    _ok(http.post(f"{UC}/catalogs", json={"name": "fuzzcat"}))
    _ok(http.post(f"{UC}/schemas", json={"name": "fuzzschema", "catalog_name": "fuzzcat"}))
    staging = _ok(http.post(f"{UC}/staging-tables", json={"name": "fuzztable", "catalog_name": "fuzzcat",
                                                           "schema_name": "fuzzschema"}))
    write_log_file(staging["staging_location"], FIRST, first_commit(staging["id"]))
    _ok(http.post(f"{UC}/tables", json={
        "name": "fuzztable", "catalog_name": "fuzzcat", "schema_name": "fuzzschema", "table_type": "MANAGED",
        "data_source_format": "DELTA", "columns": COLUMNS, "storage_location": staging["staging_location"],
        "properties": table_properties(staging["id"])}))
    return {"name": "fuzzcat", "full_name": "fuzzcat.fuzzschema.fuzztable"}


def seed_delta_v1(http: httpx.Client) -> dict[str, str]:
    """A managed table created through the Delta API v1.0, and a staging table (its credentials' path)."""
    seed_delta(http)
    v1 = f"{UC}/delta/v1/catalogs/fuzzcat/schemas/fuzzschema"
    st = _ok(http.post(f"{v1}/staging-tables", json={"name": "fuzzv1"}))
    write_log_file(st["location"], FIRST, first_commit(st["table-id"]))
    _ok(http.post(f"{v1}/tables", json={
        "name": "fuzzv1", "location": st["location"], "table-type": "MANAGED", "protocol": st["required-protocol"],
        "columns": {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]},
        "properties": st["required-properties"], "last-commit-timestamp-ms": int(time.time() * 1000)}))
    staging = _ok(http.post(f"{v1}/staging-tables", json={"name": "fuzzstaged"}))
    return {"catalog": "fuzzcat", "schema": "fuzzschema", "table": "fuzzv1", "table_id": staging["table-id"]}


def _ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


@dataclass
class Protocol:
    name: str
    base_path: str
    check: Callable
    seed: Callable[[httpx.Client], dict[str, str]]
    serves: Callable[[str, str, httpx.Client], bool]
    fixed: dict[str, str] = field(default_factory=dict)   # path parameters every case uses
    aimed_headers: dict[str, str] = field(default_factory=dict)   # headers of the cases aimed at the seed
    spec: Path | None = None   # its OpenAPI document, when the service does not serve it (/openapi/<name>.yaml)


def _iceberg_serves(method: str, path: str, http: httpx.Client) -> bool:
    advertised = set(http.get("/v1/config").json()["endpoints"]) | {"GET /v1/config"}
    return f"{method} {path}" in advertised


PROTOCOLS = {
    "iceberg": Protocol("iceberg", "", iceberg_error_format, seed_iceberg, _iceberg_serves,
                        fixed={"prefix": ICEBERG_PREFIX}),
    # Lance declares `Authorization` and `x-api-key` parameters; a malformed one is refused with 401, so the aimed
    # cases carry a well-formed one to get past that.
    "lance": Protocol("lance", "", lance_error_format, seed_lance,
                      lambda method, path, http: (method, path) in LANCE_SERVED,
                      aimed_headers={"Authorization": "Bearer fuzz", "x-api-key": "fuzz"}),
    "delta": Protocol("delta", UC, uc_error_format, seed_delta, lambda method, path, http: True),
    # Unity Catalog's Delta API v1.0: the spec's delta.yaml, all of it served.
    "delta-v1": Protocol("delta-v1", UC, delta_v1_error_format, seed_delta_v1, lambda method, path, http: True,
                         spec=DELTA_V1_SPEC),
}


# -- the run ----------------------------------------------------------------------------------------------------


@dataclass
class Tally:
    operations: int = 0
    cases: int = 0
    unsendable: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    failures: dict[tuple[str, str], str] = field(default_factory=dict)   # (operation, first line) -> report
    unbreakable: list[str] = field(default_factory=list)
    reached: dict[str, list[int]] = field(default_factory=dict)   # operation -> [cases, cases that reached it]


def _reached_handler(response) -> bool:
    """Whether a case got past the door: not refused by authentication or authorization, nor answered by the
    framework for a route or method that does not exist (framework_error_message: "Not Found: GET /path")."""
    if response.status_code in (401, 403):
        return False
    return not (response.status_code in (404, 405)
                and ('"Not Found: ' in response.text or '"Method Not Allowed: ' in response.text))


def _order(op) -> tuple[int, str]:
    # Destructive operations last, so the seeded state serves the others first.
    destructive = op.method.upper() == "DELETE" or op.path.endswith(("/drop", "/deregister", "/version/delete"))
    return (1 if destructive else 0, op.label)


def fuzz(protocol: Protocol, base_url: str, http: httpx.Client, seeded: dict[str, str],
         tokens: list[str] | None = None, share: float = 1.0) -> Tally:
    """`share`: the part of COVERAGE_CASES and EXAMPLES to run for each operation."""
    document = protocol.spec.read_text() if protocol.spec else http.get(f"/openapi/{protocol.name}.yaml").text
    schema = schemathesis.openapi.from_dict(yaml.safe_load(document))
    operations = sorted((r.ok() for r in schema.get_all_operations()), key=_order)
    operations = [op for op in operations if protocol.serves(op.method.upper(), op.path, http)]
    tally = Tally(operations=len(operations))
    session = requests.Session()
    if tokens:
        session.auth = _Tokens(tokens)
    target = base_url + protocol.base_path
    for op in operations:
        names = {p.name for p in op.path_parameters}
        fixed = {k: v for k, v in protocol.fixed.items() if k in names}
        aimed = {**fixed, **{k: v for k, v in seeded.items() if k in names}}
        # Schemathesis's coverage phase: boundary values and each constraint broken in turn, a sample of them.
        for i, case in enumerate(_coverage_sample(schema, op, max(1, int(COVERAGE_CASES * share)))):
            case.path_parameters = {**(case.path_parameters or {}), **(aimed if i % 2 else fixed)}
            if i % 2 and protocol.aimed_headers:
                case.headers = {**(case.headers or {}), **protocol.aimed_headers}
            _send(case, op, protocol, target, session, tally)
        # Then random cases, valid and invalid, aimed at the seeded state (the coverage cases above that are not
        # aimed already try paths that name nothing).
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz(op, mode, aimed, protocol.aimed_headers, protocol, target, session, tally,
                  max(1, int(EXAMPLES * share)))
    return tally


class _Tokens(requests.auth.AuthBase):
    """Puts a valid token on every request (replacing whatever Authorization a case generated): the admin's on
    most, a partly granted client's on every third."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.sent = tokens, 0

    def __call__(self, r):
        self.sent += 1
        r.headers["Authorization"] = f"Bearer {self.tokens[1 if self.sent % 3 == 0 else 0]}"
        return r


def _coverage_sample(schema, op, count: int) -> list:
    """Every k-th coverage case, so the sample spans all parameters (the phase yields them parameter by
    parameter); generation stops at 10x the sample, which bounds its cost for the biggest bodies."""
    generated = schema.iter_coverage_cases(op, generation_modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                           generation_config=schema.config.generation_for(operation=op))
    cases = list(itertools.islice(generated, 10 * count))
    step = max(1.0, len(cases) / count)
    return [cases[int(i * step)] for i in range(min(count, len(cases)))]


def _fuzz(op, mode, path_parameters, headers, protocol, target, session, tally, examples: int) -> None:
    @given(case=op.as_strategy(generation_mode=mode, path_parameters=path_parameters or None,
                               headers=headers or None))
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), print_blob=False)
    def one(case) -> None:
        _send(case, op, protocol, target, session, tally)

    try:
        one()
    except Unsatisfiable:
        # Nothing to break: every input of the operation is fixed (e.g. its only parameter aims at the seed).
        tally.unbreakable.append(f"{op.label} {mode.value} {sorted(path_parameters)}")


def _send(case, op, protocol, target, session, tally) -> None:
    try:
        response = case.call(base_url=target, session=session, timeout=30)
    except (requests.ConnectionError, requests.Timeout) as exc:
        # The server dropped the connection or never answered: the client cannot know what happened, as for a 5xx.
        tally.cases += 1
        tally.failures.setdefault((op.label, type(exc).__name__), f"{exc}\n{case.as_curl_command()}")
        return
    except (requests.RequestException, ValueError, UnicodeError):
        tally.unsendable += 1   # a header or URL no HTTP client can put on the wire
        return
    tally.cases += 1
    tally.statuses[response.status_code] = tally.statuses.get(response.status_code, 0) + 1
    counts = tally.reached.setdefault(op.label, [0, 0])
    counts[0] += 1
    counts[1] += _reached_handler(response)
    try:
        case.validate_response(response, checks=[not_a_server_error, protocol.check])
    except FailureGroup as exc:
        report = str(exc)
        first = next((line for line in report.splitlines() if line.strip()), report)
        tally.failures.setdefault((op.label, f"{response.status_code} {first}"), report)


# With authentication on: an admin, and a client that may read and write only part of the seeded state.
CLIENTS = {"admin": ("admin-secret", [("*", ["admin"])]),
           "part": ("part-secret", [(f"iceberg/{ICEBERG_PREFIX}/fuzz_ns", ["read", "write"]),
                                    ("delta/fuzzcat/fuzzschema", ["read"]), ("lance/fuzz_ns", ["read", "write"])])}


@pytest.mark.parametrize("auth", ["auth-off", "auth-on"])
@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_fuzz(config, tmp_path, name, auth):
    protocol = PROTOCOLS[name]
    if auth == "auth-on":
        config.auth_file = write_auth_file(tmp_path / "auth.toml", CLIENTS)
    with EmbeddedService(config) as service:
        tokens = [fetch_token(service, cid, secret) for cid, (secret, _) in CLIENTS.items()] \
            if auth == "auth-on" else None
        headers = {"Authorization": f"Bearer {tokens[0]}"} if tokens else {}
        with httpx.Client(base_url=service, timeout=30, headers=headers) as http:
            seeded = protocol.seed(http)
            started = time.monotonic()
            # With authentication on, half as many cases: the handlers were fuzzed in full without it.
            tally = fuzz(protocol, service, http, seeded, tokens, share=0.5 if tokens else 1.0)
    elapsed = time.monotonic() - started
    reached = sum(r for _, r in tally.reached.values())
    print(f"\n{name} ({auth}): {tally.operations} operations, {tally.cases} cases ({tally.unsendable} unsendable) "
          f"in {elapsed:.1f}s, {reached} reached a handler, statuses {dict(sorted(tally.statuses.items()))}, "
          f"failures {len(tally.failures)}")
    for label, (cases, got_in) in sorted(tally.reached.items()):
        print(f"  {label:<60} {cases:>5} cases {got_in:>5} reached")
    assert tally.operations > 0 and tally.cases > 0
    assert not tally.failures, "\n\n".join(f"== {op}: {first}\n{report[:3000]}"
                                           for (op, first), report in tally.failures.items())
    assert not any(status >= 500 for status in tally.statuses), tally.statuses
    never = [label for label, (_, got_in) in tally.reached.items() if not got_in]
    assert not never, f"operations no case reached: {never}"
    if auth == "auth-off":   # nothing is refused at the door when there is no door
        assert not tally.statuses.get(401) and not tally.statuses.get(403), tally.statuses
