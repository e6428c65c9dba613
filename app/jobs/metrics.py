"""Job-queue mode's metrics (app/jobs/), in the same registry as the serving metrics."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass(frozen=True)
class JobMetrics:
    """The job families: jobs answered, failed, reclaimed, dead-lettered; leases; lag; held."""

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
