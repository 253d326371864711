"""What the three locustfiles share: the options (tables, writers per table, duration), a load shape that runs
tables x writers users for the duration and stops, the table each user writes to, and the summary.

Options (each also an environment variable):

    --tables N              LOCUST_TABLES              tables to write to (default 4)
    --writers-per-table W   LOCUST_WRITERS_PER_TABLE   concurrent writers on each table (default 2)
    --duration S            LOCUST_DURATION            seconds of load, then locust stops (default 60)
    --namespace NAME        LOCUST_NAMESPACE           namespace / UC schema for the tables (default "locust");
                                                       existing tables of that name are reused
    --retry MODE            LOCUST_RETRY               after a 409: "client" waits as the real client does
                                                       (default), "at-once" does not (loadtest/retry.py)

Users = tables x writers; user k writes to table k // writers. Each locust task is one logical commit, retries
included, reported as request type COMMIT (its latency is what the client waits for). Every HTTP request is
reported under its own name too; a 409 is reported as a failure named "... (409 conflict)" because it is what a
client under contention sees, then the flow waits, reloads and retries as real clients do. A commit the client
gives up on after its last retry is a failed COMMIT.

Headless with `--csv PREFIX`, locust writes its CSV files and we add `PREFIX_summary.txt` (also printed).
"""

from __future__ import annotations

import itertools
import random
import time
from pathlib import Path

from locust import FastHttpUser, LoadTestShape, events

from loadtest.retry import MODES, Retry, schedule

COMMIT = "COMMIT"
_counter = itertools.count()


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    group = parser.add_argument_group("coordinator load test")
    group.add_argument("--tables", type=int, default=4, env_var="LOCUST_TABLES", help="tables to write to")
    group.add_argument("--writers-per-table", type=int, default=2, env_var="LOCUST_WRITERS_PER_TABLE",
                       help="concurrent writers per table")
    group.add_argument("--duration", type=float, default=60, env_var="LOCUST_DURATION",
                       help="seconds of load; then the run stops")
    group.add_argument("--namespace", default="locust", env_var="LOCUST_NAMESPACE",
                       help="namespace (Iceberg, Lance) or UC schema (Delta) holding the tables")
    group.add_argument("--retry", choices=MODES, default="client", env_var="LOCUST_RETRY",
                       help="after a 409: wait as the real client does, or retry at once")


class FixedShape(LoadTestShape):
    """All tables x writers users at once, for --duration seconds."""

    def tick(self):
        opts = self.runner.environment.parsed_options
        if self.get_run_time() >= opts.duration:
            return None
        users = opts.tables * opts.writers_per_table
        return users, users


class WriterUser(FastHttpUser):
    """A client bound to one table. Subclasses implement `setup_table()` (create it if needed, idempotently)
    and `commit()` (one logical commit with its retries)."""

    abstract = True
    protocol = "?"

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        runner = self.environment.runner
        workers = max(getattr(opts, "expect_workers", 1) or 1, 1) if runner.__class__.__name__ == "WorkerRunner" else 1
        index = getattr(runner, "worker_index", 0) + next(_counter) * workers
        self.table_index = (index // opts.writers_per_table) % opts.tables
        self.namespace = opts.namespace
        self.rng = random.Random()
        self.setup_table()

    def timed_commit(self) -> None:
        started = time.perf_counter()
        exc = None
        try:
            self.commit()
        except Exception as e:  # noqa: BLE001 - reported to locust, the user carries on
            exc = e
        events.request.fire(request_type=COMMIT, name=f"{self.protocol} commit (retries included)",
                            response_time=(time.perf_counter() - started) * 1000, response_length=0,
                            exception=exc, context={})

    def retry_schedule(self) -> Retry:
        """The retry schedule for one logical commit, started now."""
        return schedule(self.protocol, self.environment.parsed_options.retry, self.rng, time.perf_counter())

    def wait_to_retry(self, retry: Retry) -> None:
        """After a 409: wait as the client would, or give up (raise) after its last retry."""
        wait = retry.next_wait(time.perf_counter())
        if wait is None:
            raise RuntimeError(f"gave up after {retry.attempts} conflicting attempts, as the client does")
        time.sleep(wait)  # gevent-patched: only this user waits

    # -- HTTP helpers ----------------------------------------------------------------------------------------

    def call(self, method: str, path: str, name: str, body=None, ok=(200,), conflict_ok: bool = True):
        """One request; returns (status, parsed JSON or None). 409s are failures named '<name> (409 conflict)'."""
        with self.client.request(method, path, json=body, name=name, catch_response=True) as r:
            status = r.status_code
            if status in ok:
                r.success()
            elif status == 409 and conflict_ok:
                r.request_meta["name"] = f"{name} (409 conflict)"
                r.failure("409 conflict: expected under contention; the client waits, reloads and retries")
            else:
                r.failure(f"HTTP {status}: {(r.text or '')[:200]}")
            try:
                data = r.json() if r.content else None
            except ValueError:
                data = None
            return status, data


@events.quitting.add_listener
def _summary(environment, **_kw) -> None:
    opts = environment.parsed_options
    if opts is None:
        return
    stats = environment.stats
    commit = next((e for (name, method), e in stats.entries.items() if method == COMMIT), None)
    conflicts = sum(e.num_failures for (name, _), e in stats.entries.items() if name.endswith("(409 conflict)"))
    other_failures = sum(e.num_failures for (name, m), e in stats.entries.items()
                         if not name.endswith("(409 conflict)") and m != COMMIT)
    elapsed = max(stats.last_request_timestamp - stats.start_time, 1e-9) if stats.last_request_timestamp else 0
    lines = [f"# locust summary: {Path(opts.locustfile).name} against {opts.host}",
             (f"tables={opts.tables} writers_per_table={opts.writers_per_table} users="
              f"{opts.tables * opts.writers_per_table} duration_s={opts.duration:g} namespace={opts.namespace} "
              f"retry={opts.retry}")]
    if commit is not None and commit.num_requests:
        ok = commit.num_requests - commit.num_failures
        lines += [(f"commits={ok} failed_commits={commit.num_failures} "
                   f"commits_per_s={ok / elapsed:.1f}" if elapsed else f"commits={ok}"),
                  (f"commit_latency_ms p50={commit.get_response_time_percentile(0.5):.1f} "
                   f"p90={commit.get_response_time_percentile(0.9):.1f} "
                   f"p99={commit.get_response_time_percentile(0.99):.1f} max={commit.max_response_time:.1f}")]
    else:
        lines.append("no commit completed: check the host and the failures above")
    lines += [f"http_requests={stats.total.num_requests} conflicts_409={conflicts} other_failures={other_failures}",
              "per request:"]
    for (name, method), e in sorted(stats.entries.items()):
        lines.append(f"  {method:6} {name:50} n={e.num_requests:7d} fail={e.num_failures:6d} "
                     f"p50={e.get_response_time_percentile(0.5):7.1f} ms p99={e.get_response_time_percentile(0.99):7.1f} ms")
    # Conflicts are part of the flow, not errors: exit 0 when everything else worked.
    committed = commit is not None and commit.num_requests - commit.num_failures > 0
    environment.process_exit_code = 0 if committed and other_failures == 0 else 1
    lines.append(f"verdict: {'ok' if environment.process_exit_code == 0 else 'FAILED: see the failures above'}")
    text = "\n".join(line for line in lines if line)
    print(text, flush=True)
    if getattr(opts, "csv_prefix", None):
        Path(f"{opts.csv_prefix}_summary.txt").write_text(text + "\n")
