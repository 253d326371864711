"""Prometheus metrics: one registry per service instance, so embedded services and tests never collide."""

from __future__ import annotations

from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.request_latency = Histogram(
            "coordinator_request_seconds", "Request latency by protocol, route and status class",
            ["protocol", "route", "status"], buckets=LATENCY_BUCKETS_S, registry=self.registry)
        self.commit_batch = Histogram(
            "coordinator_actor_batch_commits", "Commits written per actor batch (one compare-and-set)",
            buckets=BATCH_BUCKETS, registry=self.registry)
        self.rejections = Counter(
            "coordinator_rejected_total", "Requests rejected by reason", ["reason"], registry=self.registry)
        self._gauges: list[Callable[[], dict[str, float]]] = []
        self._latency_by_route: dict[tuple[str, str, int], Any] = {}
        self.registry.register(self)

    def observe_request(self, protocol: str, route: str, status: int, seconds: float) -> None:
        # One histogram child per (protocol, route, status class), looked up here rather than through
        # `labels()`, which validates and locks on every request.
        key = (protocol, route, status // 100)
        child = self._latency_by_route.get(key)
        if child is None:
            child = self._latency_by_route[key] = self.request_latency.labels(protocol, route, f"{key[2]}xx")
        child.observe(seconds)

    def observe_batch(self, commits: int) -> None:
        self.commit_batch.observe(commits)

    def add_gauges(self, fn: Callable[[], dict[str, float]]) -> None:
        """`fn` returns {metric_name: value}, sampled at scrape time (actors, mailbox depth, writer batches)."""
        self._gauges.append(fn)

    def collect(self):  # prometheus custom-collector protocol
        for fn in self._gauges:
            for name, value in fn().items():
                g = GaugeMetricFamily(name, name.replace("_", " "))
                g.add_metric([], value)
                yield g

    def describe(self):
        return []

    def render(self) -> bytes:
        return generate_latest(self.registry)
