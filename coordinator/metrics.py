"""Prometheus metrics: one registry per service instance, so embedded services and tests never collide.

prometheus_client keeps the registry and writes the exposition: an observation costs ~1 us (a histogram's
`observe`, measured over 100k calls), against the milliseconds a commit takes. Figures that other parts already
count (the database writer's flushes, the actors' mailboxes) are read at scrape time, typed as what they are:
a count that only grows is a counter, a level is a gauge.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

# What a commit's requester was told: applied; conflict (409: the table moved on, or the name is taken); rejected
# (refused, nothing applied: a bad request, a busy table, an unreachable database); unknown (the database's
# answer was lost: it may or may not have applied).
OUTCOMES = ("applied", "conflict", "rejected", "unknown")
# Every label value of a request's series comes from a closed set: a client picks the method token (HTTP allows
# any token, and h11 takes one of up to 64 KiB) and the path, and each new label value would be a new series kept
# in memory and in every scrape for the life of the process. The route is the matched rule's pattern (or
# "unmatched"), the protocol one of api/protocol.py `Protocols.of`'s names, the status its class; the method is one of
# these, or "other".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# HELP of the figures sampled at scrape time, by metric name. A name missing here is a programming error.
SAMPLED_HELP = {
    "coordinator_active_actors": "Tables with a running actor (a task holding the table in memory) now",
    "coordinator_mailbox_depth": "Requests queued in all actors' mailboxes, waiting to be decided, now",
    "coordinator_dormant_tables": "Idle tables kept in memory in compact form, ready to serve without a reload",
    "coordinator_feed_waiting_readers": "Commit feed readers in a long-poll, waiting for a commit, now",
    "coordinator_http_connections": "HTTP connections the service holds open now",
    "coordinator_http_connections_max": "HTTP connections allowed open at once (http_max_connections)",
    "coordinator_http_connections_closed_at_limit_total": "HTTP connections closed because the maximum was "
                                                          "reached (an idle one to make room, or the new one)",
    "coordinator_db_flushes_total": "Database transactions of the group-commit writer (each writes many commits)",
    "coordinator_db_groups_total": "Commits (groups of table rows) written by the group-commit writer",
    "coordinator_db_fenced_writes_total": "Commits refused by the database because their member lost the "
                                          "table's shard lease (cluster only)",
    "coordinator_file_write_cpu_seconds_total": "CPU seconds spent making table files durable (write and fsync)",
    "coordinator_cluster_shards_held": "Shards this cluster member holds a lease on",
    "coordinator_cluster_members_live": "Cluster members whose lease heartbeat is current",
    "coordinator_cluster_channel_version": "The newest cluster channel version this member speaks",
    "coordinator_cluster_channel_connections_older":
        "This member's channel connections (to and from peers) on a version older than this release's",
    "coordinator_cluster_takeovers_total": "Shards this member took over from another member",
    "coordinator_cluster_forwarded_total": "Requests this member forwarded to the shard's owner",
    "coordinator_uniform_versions_behind": "Delta versions the service's Iceberg conversion (UniForm) lags the "
                                           "tables it converts by, summed over those tables",
    "coordinator_uniform_tables_behind": "Tables whose Iceberg conversion (UniForm) lags their Delta version",
    "coordinator_uniform_conversions_total": "Conversions of Delta tables to Iceberg recorded (each covers every "
                                             "commit since the one before)",
    "coordinator_uniform_refusals_total": "Delta versions the Iceberg conversion refused (deletion vectors, a type "
                                          "outside IcebergCompatV2's, metadata beyond its size limit, ...)",
    "coordinator_uniform_metadata_cached_bytes": "Bytes of Iceberg metadata files (UniForm) kept in memory to serve "
                                                 "loads, now (at most uniform_cache_bytes)",
    "coordinator_uniform_failures_total": "Conversions to Iceberg that failed and are retried (storage, a worker)",
    "coordinator_maintenance_expiry_commits_total": "Snapshot expiries the service committed to Iceberg tables",
    "coordinator_maintenance_snapshots_expired_total": "Iceberg snapshots the service's expiry removed",
    "coordinator_maintenance_refs_removed_total": "Iceberg branches and tags the service's expiry removed (older "
                                                  "than their max ref age)",
    "coordinator_maintenance_expiry_failures_total": "Snapshot expiries that failed (retried after a later commit)",
    "coordinator_maintenance_expiry_cpu_seconds_total": "CPU seconds the table actors spent deciding the service's "
                                                        "snapshot expiries (policy, new metadata, its JSON)",
    "coordinator_maintenance_files_deleted_total": "Files deleted because only expired snapshots referenced them",
    "coordinator_maintenance_deletion_cpu_seconds_total": "CPU seconds spent finding and deleting the files only "
                                                          "expired snapshots referenced (worker threads)",
    "coordinator_maintenance_deletion_failures_total": "Deletions of expired snapshots' files that stopped and are "
                                                       "resumed later",
    "coordinator_maintenance_deletions_running": "Deletions of expired snapshots' files under way or waiting out "
                                                 "their grace, now",
    "coordinator_maintenance_tables_due": "Tables queued for snapshot expiry, now",
    "coordinator_maintenance_published_commits_total": "Ratified Delta commits the service published to "
                                                       "_delta_log/<v>.json itself (or found published)",
    "coordinator_maintenance_publish_conflicts_total": "Delta versions whose _delta_log/<v>.json held another file "
                                                       "than the ratified commit (left intact: an alert)",
    "coordinator_maintenance_publish_failures_total": "Publishing passes that failed (retried after a later commit)",
}


class Metrics:
    def __init__(self, formats: Iterable[str] = ()) -> None:
        """`formats`: the names of the formats served, whose commit series are exported from the start."""
        self.registry = CollectorRegistry()
        self.request_latency = Histogram(
            "coordinator_request_seconds", "HTTP request time from its headers to its answer, by protocol, "
            "route and status class", ["protocol", "route", "status"], buckets=LATENCY_BUCKETS_S,
            registry=self.registry)
        self.commits = Counter(
            "coordinator_commits", "Commits (changes to a table's contents) by format and by what the client "
            "was told: applied, conflict, rejected or unknown", ["format", "outcome"], registry=self.registry)
        self.commit_latency = Histogram(
            "coordinator_commit_seconds", "Time from a commit reaching its table's actor to its answer (queueing, "
            "checks and durable write), by format", ["format"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.db_write = Histogram(
            "coordinator_db_write_seconds", "Time of one group-commit database transaction (it writes every "
            "commit waiting at that moment)", buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.file_write = Histogram(
            "coordinator_file_write_seconds", "Time to make one batch of table files durable (written and "
            "fsynced), the files of every commit waiting at that moment", buckets=LATENCY_BUCKETS_S,
            registry=self.registry)
        self.rebased = Counter(
            "coordinator_rebased_commits", "Iceberg appends whose branch had moved on, rebased onto its head by the "
            "table's actor instead of answered 409 (docs/rebasing.md); also counted as applied commits",
            ["format"], registry=self.registry)
        self.commit_batch = Histogram(
            "coordinator_actor_batch_commits", "Commits an actor wrote with one compare-and-set of its table's row",
            buckets=BATCH_BUCKETS, registry=self.registry)
        # Every format and outcome is exported from the start (at 0), so a rate or a dashboard panel has a series
        # before the first conflict happens; a format's commits are counted whether or not it was named here.
        self._formats = tuple(formats)
        self._commit_counters: dict[tuple[str, str], Any] = {}
        self._commit_latency: dict[str, Any] = {}
        for fmt in self._formats:
            self._commit_series(fmt)
        self._gauges: list[Callable[[], dict[str, float]]] = []
        self._counters: list[Callable[[], dict[str, float]]] = []
        self._latency_by_route: dict[tuple[str, str, int], Any] = {}
        self.registry.register(self)

    def observe_request(self, protocol: str, method: str, rule: str | None, status: int, seconds: float) -> None:
        """One request: `rule` is the pattern of the route that matched it (None: none did)."""
        # One histogram child per (protocol, route, status class), looked up here rather than through
        # `labels()`, which validates and locks on every request.
        route = f"{method if method in METHODS else 'other'} {rule or 'unmatched'}"
        key = (protocol, route, status // 100)
        child = self._latency_by_route.get(key)
        if child is None:
            child = self._latency_by_route[key] = self.request_latency.labels(protocol, route, f"{key[2]}xx")
        child.observe(seconds)

    def _commit_series(self, fmt: str) -> None:
        for outcome in OUTCOMES:
            self._commit_counters[fmt, outcome] = self.commits.labels(fmt, outcome)
        self._commit_latency[fmt] = self.commit_latency.labels(fmt)

    def observe_commit(self, fmt: str, outcome: str, seconds: float | None) -> None:
        """One commit's outcome; `seconds` from reaching its actor to its answer (None: not timed)."""
        counter = self._commit_counters.get((fmt, outcome))
        if counter is None:   # a format not named at the start: its series begin now, its commits are never dropped
            if fmt not in self._commit_latency:
                self._commit_series(fmt)
            counter = self._commit_counters.get((fmt, outcome)) or self.commits.labels(fmt, outcome)
            self._commit_counters[fmt, outcome] = counter
        counter.inc()
        if seconds is not None:
            self._commit_latency[fmt].observe(seconds)

    def observe_batch(self, commits: int) -> None:
        self.commit_batch.observe(commits)

    def add_gauges(self, fn: Callable[[], dict[str, float]]) -> None:
        """`fn` returns {metric_name: value} of levels (actors, mailbox depth), sampled at scrape time."""
        self._gauges.append(fn)

    def add_counters(self, fn: Callable[[], dict[str, float]]) -> None:
        """`fn` returns {metric_name_total: value} of counts that only grow, sampled at scrape time."""
        self._counters.append(fn)

    def collect(self):  # prometheus custom-collector protocol
        for fn in self._gauges:
            for name, value in fn().items():
                family = GaugeMetricFamily(name, SAMPLED_HELP[name])
                family.add_metric([], value)
                yield family
        for fn in self._counters:
            for name, value in fn().items():
                family = CounterMetricFamily(name, SAMPLED_HELP[name])
                family.add_metric([], value)
                yield family

    def describe(self):
        return []

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Per format: commits by outcome and the commit-latency sum and count (a console computes rates and
        means from two snapshots), and rebased commits for a format that rebases."""
        out: dict[str, dict[str, float]] = {f: {} for f in self._formats}
        for family in (*self.commits.collect(), *self.commit_latency.collect(), *self.rebased.collect()):
            for sample in family.samples:
                fmt = sample.labels.get("format")
                out.setdefault(fmt, {})
                if sample.name == "coordinator_rebased_commits_total":
                    out[fmt]["rebased"] = sample.value
                elif sample.name == "coordinator_commits_total":
                    out[fmt][sample.labels["outcome"]] = sample.value
                elif sample.name == "coordinator_commit_seconds_sum":
                    out[fmt]["latency_sum_s"] = sample.value
                elif sample.name == "coordinator_commit_seconds_count":
                    out[fmt]["latency_count"] = sample.value
        return out
