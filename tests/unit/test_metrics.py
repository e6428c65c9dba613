"""Counting in bulk gives the same exposition as counting one by one; every metric is documented."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from app.jobs.metrics import JobMetrics
from app.metrics import LATENCY_BUCKETS, Metrics, observe_all

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


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(LATENCY_BUCKETS),
                          st.floats(min_value=0.0, max_value=60.0)), max_size=64))
def test_observe_all_is_observe_one_by_one_for_any_values(values: list[float]) -> None:
    """Values on the bounds, between them, repeated and past the last one."""
    bulk, single = Metrics.create(), Metrics.create()
    observe_all(bulk.queue_wait.labels(model="m"), values)
    child = single.queue_wait.labels(model="m")
    for value in values:
        child.observe(value)
    assert exposition(bulk.registry) == exposition(single.registry)


def test_answered_all_is_answered_one_by_one() -> None:
    bulk, single = Metrics.create(), Metrics.create()
    bulk.for_model("m", "1").answered_all(200, DURATIONS, "grpc")
    for value in DURATIONS:
        single.for_model("m", "1").answered(200, value, "grpc")
    assert exposition(bulk.registry) == exposition(single.registry)


def test_every_metric_is_documented_under_the_name_it_is_scraped_by() -> None:
    """docs/operations.md names each serving metric, docs/jobs.md each job-queue one, as a
    scrape shows it (a counter with ``_total``)."""
    root = Path(__file__).resolve().parents[2]
    metrics = Metrics.create()
    serving = {m.name + ("_total" if m.type == "counter" else ""): m
               for m in metrics.registry.collect()}
    jobs_registry = CollectorRegistry()
    JobMetrics.create(jobs_registry)
    jobs = {m.name + ("_total" if m.type == "counter" else ""): m
            for m in jobs_registry.collect()}
    for page, families in (("operations.md", serving), ("jobs.md", jobs)):
        text = (root / "docs" / page).read_text()
        assert families and not [name for name in families if name not in text], page
