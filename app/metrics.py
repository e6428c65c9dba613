"""Prometheus metrics, one registry per app (no module globals)."""

from __future__ import annotations

import contextlib
import operator
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, reduce
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.report import BatchReport
from app.statistics import Statistics

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def observe_all(histogram: Any, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for each of ``values`` (a labelled child), with one update of
    the sum and one of each bucket hit, not one of each per value: the device process counts
    every request of its front ends. It writes prometheus_client's histogram state
    (``_upper_bounds``, ``_buckets``, ``_sum``) as ``observe`` does; tests/unit/test_metrics.py
    checks the two give the same exposition. The values are sorted once and each bucket's count
    found by bisection, which costs a third of a bisection per value (32 values: 4.7 against
    12.3 us)."""
    if not values:
        return
    histogram._raise_if_not_observable()
    # Added left to right, as ``observe`` one by one does: ``sum`` compensates on Python 3.12,
    # and the exposition would differ in a last digit.
    histogram._sum.inc(reduce(operator.add, values))
    ordered, at, end = sorted(values), 0, len(values)
    for bucket, bound in zip(histogram._buckets, histogram._upper_bounds, strict=True):
        below = bisect_right(ordered, bound, at)  # a value equal to a bound falls in its bucket
        if below > at:
            bucket.inc(below - at)
            at = below
            if at == end:
                return


@dataclass(frozen=True)
class Metrics:
    """The server's metric families. Serving metrics carry ``model``; ``for_model`` binds them."""

    registry: CollectorRegistry
    requests: Counter
    request_duration: Histogram
    queue_depth: Gauge
    in_flight: Gauge
    queue_wait: Histogram
    batch_size: Histogram
    batch_compute: Histogram
    padding_waste: Histogram
    rejected: Counter
    dropped: Counter
    device_busy: Gauge
    device_up: Gauge
    device_restarts: Counter
    batch_limit: Gauge
    model_state: Gauge
    cost: Gauge
    frontends: Gauge
    frontend_restarts: Counter
    frontend_messages: Counter
    # Triton's statistics extension, by (model, version), counted with the metrics.
    statistics: dict[tuple[str, str], Statistics] = field(default_factory=dict)

    def for_model(self, model: str, version: str) -> ModelMetrics:
        """The children of one model (version); ``model=""`` counts requests for no known model.
        Each child is created at its first use, so unused ones add no series."""
        return ModelMetrics(self, model, version)

    def forget_model(self, model: str, version: str) -> None:
        """Drop a model's gauges (they read a model that is gone); counters keep their totals."""
        for gauge in (self.queue_depth, self.in_flight):
            with contextlib.suppress(KeyError):
                gauge.remove(model, version)

    @classmethod
    def create(cls) -> Metrics:
        r = CollectorRegistry(auto_describe=True)
        return cls(
            registry=r,
            requests=Counter(
                "batchserve_requests", "Requests answered, by HTTP status (gRPC calls: the "
                "status HTTP would have answered), and protocol (http, grpc)",
                ["model", "version", "status", "protocol"], registry=r,
            ),
            request_duration=Histogram(
                "batchserve_request_duration_seconds", "Arrival to answer", ["model", "protocol"],
                buckets=LATENCY_BUCKETS, registry=r,
            ),
            queue_depth=Gauge(
                "batchserve_queue_depth", "Items waiting for a batch", ["model", "version"],
                registry=r,
            ),
            in_flight=Gauge(
                "batchserve_in_flight_requests", "Admitted requests not yet answered",
                ["model", "version"], registry=r,
            ),
            queue_wait=Histogram(
                "batchserve_queue_wait_seconds", "Enqueue to batch start, per item", ["model"],
                buckets=LATENCY_BUCKETS, registry=r,
            ),
            batch_size=Histogram(
                "batchserve_batch_size", "Items per model call", ["model"],
                buckets=BATCH_BUCKETS, registry=r,
            ),
            batch_compute=Histogram(
                "batchserve_batch_compute_seconds", "Collate to results, per model call",
                ["model"], buckets=LATENCY_BUCKETS, registry=r,
            ),
            padding_waste=Histogram(
                "batchserve_padding_waste_ratio",
                "Text batches: share of padded tokens that are padding", ["model"],
                buckets=(0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), registry=r,
            ),
            rejected=Counter(
                "batchserve_rejected", "Requests refused before queueing", ["model", "reason"],
                registry=r,
            ),
            dropped=Counter(
                "batchserve_dropped_items", "Queued items dropped before computing",
                ["model", "reason"], registry=r,
            ),
            device_busy=Gauge(
                "batchserve_device_busy_ratio", "Share of time the device spent computing",
                ["device"], registry=r,
            ),
            device_up=Gauge(
                "batchserve_device_up",
                "1 while the device thread runs, 0 while it is down or stuck in a call",
                ["device"], registry=r,
            ),
            device_restarts=Counter(
                "batchserve_device_restarts", "Device threads restarted after they died",
                ["device"], registry=r,
            ),
            batch_limit=Gauge(
                "batchserve_effective_batch_limit", "Current batch limit (lowered after OOM)",
                ["model", "version", "device"], registry=r,
            ),
            model_state=Gauge(
                "batchserve_model_state", "1 for the state a model version is in",
                ["model", "version", "state"], registry=r,
            ),
            cost=Gauge(
                "batchserve_cost_seconds",
                "What the scheduler believes a batch takes, by work (items, or padded tokens)",
                ["model", "version", "device", "work"], registry=r,
            ),
            frontends=Gauge(
                "batchserve_frontends_connected",
                "Front-end processes linked to the device process (--frontends above 1)",
                registry=r,
            ),
            frontend_restarts=Counter(
                "batchserve_frontend_restarts", "Front-end processes replaced after they died",
                registry=r,
            ),
            frontend_messages=Counter(
                "batchserve_frontend_messages",
                "Messages the device process read from front ends (a message: what one pass of "
                "a front end's event loop had to say; requests over messages, what a message "
                "carries)",
                registry=r,
            ),
        )


@dataclass
class ModelMetrics:
    """One model version's metric children, bound once so that the hot path looks up no labels."""

    metrics: Metrics
    model: str
    version: str
    _by_status: dict[tuple[int, str], tuple[Any, Any]] = field(default_factory=dict)
    _by_reason: dict[tuple[str, str], Any] = field(default_factory=dict)

    @cached_property
    def queue_wait(self) -> Any:
        return self.metrics.queue_wait.labels(model=self.model)

    @cached_property
    def batch_size(self) -> Any:
        return self.metrics.batch_size.labels(model=self.model)

    @cached_property
    def batch_compute(self) -> Any:
        return self.metrics.batch_compute.labels(model=self.model)

    @cached_property
    def padding_waste(self) -> Any:
        return self.metrics.padding_waste.labels(model=self.model)

    @cached_property
    def statistics(self) -> Statistics:
        return self.metrics.statistics.setdefault((self.model, self.version), Statistics())

    def answered(self, status: int, seconds: float, protocol: str = "http") -> None:
        """Count one answered request (runs per request)."""
        count, duration = self._children(status, protocol)
        count.inc()
        duration.observe(seconds)
        self.statistics.answered(status, 1, seconds)

    def answered_all(self, status: int, durations: Sequence[float],
                     protocol: str = "http") -> None:
        """Count ``len(durations)`` answered requests of one status at once."""
        count, duration = self._children(status, protocol)
        count.inc(len(durations))
        observe_all(duration, durations)
        self.statistics.answered(status, len(durations), sum(durations))

    def _children(self, status: int, protocol: str) -> tuple[Any, Any]:
        children = self._by_status.get((status, protocol))
        if children is None:
            children = self._by_status[(status, protocol)] = (
                self.metrics.requests.labels(model=self.model, version=self.version,
                                             status=str(status), protocol=protocol),
                self.metrics.request_duration.labels(model=self.model, protocol=protocol))
        return children

    def _counted(self, family: str, reason: str) -> Any:
        child = self._by_reason.get((family, reason))
        if child is None:
            counter = self.metrics.rejected if family == "rejected" else self.metrics.dropped
            child = self._by_reason[(family, reason)] = counter.labels(
                model=self.model, reason=reason)
        return child

    def rejected(self, reason: str) -> None:
        self._counted("rejected", reason).inc()

    def dropped(self, reason: str, n: int) -> None:
        self._counted("dropped", reason).inc(n)

    def batch(self, report: BatchReport, waits: list[float]) -> None:
        """One batch's figures: the answered items' ``waits`` in the queue, each model
        call's size, seconds and padding, the items dropped unanswered."""
        observe_all(self.queue_wait, waits)
        self.statistics.batch(waits, report.sizes, report.compute_s)
        for size, seconds, work, tokens in zip(report.sizes, report.compute_s, report.work,
                                               report.tokens, strict=True):
            self.batch_size.observe(size)
            self.batch_compute.observe(seconds)
            if report.padded:
                self.padding_waste.observe(1.0 - tokens / work)
        if report.expired:
            self.dropped("expired", report.expired)
        if report.cancelled:
            self.dropped("cancelled", report.cancelled)

    def watch(self, depth: Callable[[], float], in_flight: Callable[[], float]) -> None:
        """Queue depth and requests in flight, read at each scrape."""
        self.metrics.queue_depth.labels(self.model, self.version).set_function(depth)
        self.metrics.in_flight.labels(self.model, self.version).set_function(in_flight)

    def state(self, state: str, states: tuple[str, ...]) -> None:
        for name in states:
            self.metrics.model_state.labels(self.model, self.version, name).set(
                1 if name == state else 0)
