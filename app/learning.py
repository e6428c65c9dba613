"""What the runtime learns of a model version as it is placed, and the gauges showing it.

``warm_on`` loads and warms up a replica on a device's loader, measuring its cost. A model whose
warm-up had no examples serves without a cost model (its batches do not wait to fill):
``measure_on`` times its replica with its first request's items on the device's loader, off the
request path. ``export_replica``, ``unexport`` and ``busy_ratio`` are the gauges of what a
device believes and does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from app.metrics import Metrics
from app.process import refrozen
from app.scheduler.cost import CostModel
from app.served import ServedModel
from app.tasks import Background
from app.warmup import Loader, Warm
from app.worker import DeviceWorker

log = logging.getLogger("batchserve.service")


async def warm_on(loader: Loader, model: ServedModel, label: str,
                  loop: asyncio.AbstractEventLoop) -> Warm:
    """``model``'s replica loaded and warmed up on ``loader``'s device (``label``), logged."""
    log.info("model %s version %s: loading and warming up on %s", model.name, model.version,
             label)
    started = time.monotonic()
    with refrozen(f"model {model.name} version {model.version}'s load on {label}", loop):
        warm = await loader.warm(model.handler, model.batch_limit, model.settings.cuda_graphs)
    log.info("model %s version %s: warm on %s in %.1f s", model.name, model.version, label,
             time.monotonic() - started)
    if warm.batch_limit < model.batch_limit:
        log.warning("model %s version %s on %s: batches above %d items run out of device "
                    "memory; serving with a batch limit of %d", model.name, model.version,
                    label, warm.batch_limit, warm.batch_limit)
    return warm


async def measure_on(model: ServedModel, worker: DeviceWorker, loader: Loader,
                     items: list[Any], metrics: Metrics) -> None:
    """Measure ``model``'s cost on ``worker``'s device from ``items`` (real ones, of one key);
    it serves on without one if that fails."""
    replica = worker.replica_of(model)
    cost = model.costs.get(worker.label)
    # (The first batch may have observed one point already: the grid replaces it.)
    if replica is None or cost is None:  # unloaded meanwhile
        return
    try:
        measured, fits = await loader.measure(model.handler, replica, items,
                                              worker.batch_limit(model))
    except Exception as exc:  # noqa: BLE001 - it serves on without one, as before
        log.warning("model %s version %s: no cost measured on %s from its first request "
                    "(%s: %s)", model.name, model.version, worker.label, type(exc).__name__,
                    str(exc))
        return
    if not worker.holds(model):  # unloaded while measured: no gauge reads it again
        return
    cost.take(measured)
    model.learn(worker.label, cost, model.work_per_item, None, fits)
    export_cost(metrics, model, worker.label, cost)
    log.info("model %s version %s: cost measured on %s from its first request",
             model.name, model.version, worker.label)


def measure_first(model: ServedModel, workers: list[DeviceWorker], loaders: dict[Any, Loader],
                  metrics: Metrics, background: Background, items: list[Any]) -> None:
    """The first request's items (of the first item's key) measure the cost of a model that
    had no warm-up examples, on each device's loader, in the background."""
    key = model.handler.key
    alike = [item for item in items if key(item) == key(items[0])]
    for worker in workers:
        background.start(measure_on(model, worker, loaders[worker.device], alike, metrics),
                         f"model {model.name}'s measurement on {worker.label}")


def export_replica(metrics: Metrics, model: ServedModel, worker: DeviceWorker) -> None:
    """``model``'s per-device gauges, its batch limit and cost curve, read this replica."""
    metrics.batch_limit.labels(model.name, model.version, worker.label).set_function(
        lambda: worker.batch_limit(model))
    export_cost(metrics, model, worker.label, model.costs[worker.label])


def unexport(metrics: Metrics, model: ServedModel, models: list[ServedModel],
             workers: list[DeviceWorker]) -> None:
    """``model``'s version's per-device gauges stop reading it (unloaded, or its load failed):
    they read the object among ``models`` that serves its version now (a reload's), or go."""
    for gauge in (metrics.batch_limit, metrics.cost):
        gauge.remove_by_labels({"model": model.name, "version": model.version})
    for other in models:
        if (other.name, other.version) == (model.name, model.version) and other is not model:
            for worker in workers:
                if worker.holds(other):
                    export_replica(metrics, other, worker)


def export_cost(metrics: Metrics, model: ServedModel, label: str, cost: CostModel) -> None:
    """``batchserve_cost_seconds``: the curve a device believes, point by point as it is now."""
    for index, (work, _) in enumerate(cost.curve()):
        metrics.cost.labels(model.name, model.version, label, f"{work:g}").set_function(
            functools.partial(_point, cost, index))


def _point(cost: CostModel, index: int) -> float:
    return cost.seconds[index] if index < len(cost.seconds) else float("nan")


def busy_ratio(worker: DeviceWorker) -> Callable[[], float]:
    """A gauge callback: share of wall time spent computing since the previous scrape."""
    last = {"busy": worker.busy_s, "at": time.monotonic()}

    def ratio() -> float:
        now, busy_s = time.monotonic(), worker.busy_s
        elapsed = now - last["at"]
        value = (busy_s - last["busy"]) / elapsed if elapsed > 0 else 0.0
        last.update(busy=busy_s, at=now)
        return min(1.0, max(0.0, value))

    return ratio
