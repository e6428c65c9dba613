"""Counting in bulk gives the same exposition as counting one by one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from app.metrics import Metrics, observe_all

DURATIONS = [0.0001, 0.0005, 0.0007, 0.003, 0.003, 0.2, 31.0, 0.0]  # bounds, between, above


def exposition(registry: CollectorRegistry) -> list[str]:
    """The samples, less the creation times (which differ between registries)."""
    return [line for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line]


def test_observe_all_is_observe_one_by_one() -> None:
    bulk, single = Metrics.create(), Metrics.create()
    observe_all(bulk.queue_wait.labels(model="m"), DURATIONS)
    observe_all(bulk.queue_wait.labels(model="m"), [])
    for value in DURATIONS:
        single.queue_wait.labels(model="m").observe(value)
    assert exposition(bulk.registry) == exposition(single.registry)
    assert 'batchserve_queue_wait_seconds_bucket{le="0.0005",model="m"} 3.0' in \
        exposition(bulk.registry)


def test_answered_all_is_answered_one_by_one() -> None:
    bulk, single = Metrics.create(), Metrics.create()
    bulk.for_model("m", "1").answered_all(200, DURATIONS, "grpc")
    for value in DURATIONS:
        single.for_model("m", "1").answered(200, value, "grpc")
    assert exposition(bulk.registry) == exposition(single.registry)
