"""Triton's statistics extension: each model version's cumulative counts and durations since
the server started, as ``GET /v2/models/{name}/stats`` and gRPC's ``ModelStatistics`` give
them (tritonclient's ``get_inference_statistics``; perf_analyzer reads them to split a
request's time on the server into queue and compute).

They are counted where the metrics are (app/metrics.py, ``ModelMetrics``), in the process that
holds the queues: every front end's requests, once. What each figure counts here:

- ``success`` and ``fail``: requests answered 200, and answered otherwise (a refusal, a client
  mistake, a failed batch), with the time from arrival to answer;
- ``queue``: each item (a row of a request) computed, with its wait from enqueue to its
  batch's start; ``compute_infer``: each such item, with its model call's time (collate to
  results: batchserve times a call whole, so ``compute_input`` and ``compute_output`` carry
  the same counts and 0 ns, which perf_analyzer requires of them);
- ``inference_count``: items computed; ``execution_count``: model calls; ``batch_stats``: per
  batch size, the calls of that size and their time; ``last_inference``: the last call's
  end, in milliseconds since the epoch. No response cache: ``cache_hit`` and ``cache_miss``
  stay 0.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

NS = 1_000_000_000


@dataclass
class Duration:
    """A count, and the nanoseconds its events took together."""

    count: int = 0
    ns: int = 0

    def add(self, count: int, seconds: float) -> None:
        self.count += count
        self.ns += round(seconds * NS)

    def view(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class Statistics:
    """One model version's figures (the module's docstring says what each counts)."""

    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute: Duration = field(default_factory=Duration)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    by_size: dict[int, Duration] = field(default_factory=dict)

    def answered(self, status: int, count: int, seconds: float) -> None:
        """``count`` requests answered with ``status``, their times summing to ``seconds``."""
        (self.success if status == 200 else self.fail).add(count, seconds)

    def batch(self, waits: Sequence[float], sizes: Sequence[int],
              seconds: Sequence[float]) -> None:
        """One batch: its computed items' ``waits`` in the queue; each model call's size and
        time."""
        self.queue.add(len(waits), sum(waits))
        for size, took in zip(sizes, seconds, strict=True):
            self.compute.add(size, size * took)
            self.inference_count += size
            self.execution_count += 1
            calls = self.by_size.get(size)
            if calls is None:
                calls = self.by_size[size] = Duration()
            calls.add(1, took)
        if sizes:
            self.last_inference_ms = int(time.time() * 1000)

    def view(self, name: str, version: str) -> dict[str, Any]:
        """Triton's JSON for the model version (its ``model_stats`` entry)."""
        return {
            "name": name, "version": version, "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count, "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.view(), "fail": self.fail.view(),
                "queue": self.queue.view(), **_compute(self.compute),
                "cache_hit": Duration().view(), "cache_miss": Duration().view(),
            },
            "batch_stats": [{"batch_size": size, **_compute(self.by_size[size])}
                            for size in sorted(self.by_size)],
        }


def _compute(infer: Duration) -> dict[str, dict[str, int]]:
    """The three compute figures of one whole model call: its time is ``compute_infer``'s."""
    unsplit = Duration(infer.count, 0).view()
    return {"compute_input": unsplit, "compute_infer": infer.view(), "compute_output": unsplit}
