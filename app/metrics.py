"""Prometheus metrics, one registry per app (no module globals)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Metrics:
    registry: CollectorRegistry
    requests: Counter
    request_duration: Histogram
    queue_depth: Gauge
    in_flight: Gauge
    queue_wait: Histogram
    batch_size: Histogram
    batch_compute: Histogram
    rejected: Counter
    dropped: Counter
    device_busy: Gauge
    batch_limit: Gauge
    _by_status: dict[int, Any] = field(default_factory=dict)

    def answered(self, status: int, seconds: float) -> None:
        """Count one answered request (label lookups are cached: this runs per request)."""
        child = self._by_status.get(status)
        if child is None:
            child = self._by_status[status] = self.requests.labels(status=str(status))
        child.inc()
        self.request_duration.observe(seconds)

    @classmethod
    def create(cls) -> Metrics:
        r = CollectorRegistry(auto_describe=True)
        return cls(
            registry=r,
            requests=Counter(
                "batchserve_requests", "Requests answered, by HTTP status", ["status"], registry=r
            ),
            request_duration=Histogram(
                "batchserve_request_duration_seconds", "Arrival to answer",
                buckets=LATENCY_BUCKETS, registry=r,
            ),
            queue_depth=Gauge("batchserve_queue_depth", "Items waiting in the queue", registry=r),
            in_flight=Gauge(
                "batchserve_in_flight_requests", "Admitted requests not yet answered", registry=r
            ),
            queue_wait=Histogram(
                "batchserve_queue_wait_seconds", "Enqueue to batch start, per item",
                buckets=LATENCY_BUCKETS, registry=r,
            ),
            batch_size=Histogram(
                "batchserve_batch_size", "Items per model call", buckets=BATCH_BUCKETS, registry=r
            ),
            batch_compute=Histogram(
                "batchserve_batch_compute_seconds", "Collate to results, per model call",
                buckets=LATENCY_BUCKETS, registry=r,
            ),
            rejected=Counter(
                "batchserve_rejected", "Requests refused before queueing", ["reason"], registry=r
            ),
            dropped=Counter(
                "batchserve_dropped_items", "Queued items dropped before computing",
                ["reason"], registry=r,
            ),
            device_busy=Gauge(
                "batchserve_device_busy_ratio", "Share of time the device spent computing",
                ["device"], registry=r,
            ),
            batch_limit=Gauge(
                "batchserve_effective_batch_limit", "Current batch limit (lowered after OOM)",
                ["device"], registry=r,
            ),
        )


@dataclass(frozen=True)
class JobMetrics:
    """Job-queue mode (app/jobs/), in the same registry as the serving metrics."""

    done: Counter
    failed: Counter
    reclaimed: Counter
    dead_lettered: Counter
    lease_renewals: Counter
    stream_lag: Gauge
    held: Gauge

    @classmethod
    def create(cls, r: CollectorRegistry) -> JobMetrics:
        return cls(
            done=Counter("batchserve_jobs_done", "Jobs answered with an ok result", registry=r),
            failed=Counter(
                "batchserve_jobs_failed", "Jobs answered with an error result", ["reason"],
                registry=r,
            ),
            reclaimed=Counter(
                "batchserve_jobs_reclaimed", "Jobs taken over from a lost worker", registry=r
            ),
            dead_lettered=Counter(
                "batchserve_jobs_dead_lettered", "Jobs copied to the dead-letter stream",
                ["reason"], registry=r,
            ),
            lease_renewals=Counter(
                "batchserve_job_lease_renewals", "Leases renewed on jobs still in work", registry=r
            ),
            stream_lag=Gauge(
                "batchserve_job_stream_lag", "Jobs in the stream not yet read by the group",
                registry=r,
            ),
            held=Gauge("batchserve_jobs_held", "Jobs this worker holds now", registry=r),
        )
