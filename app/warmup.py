"""Loading a replica and learning what it costs, before a device thread serves it.

``warm_replica`` runs on a loader thread (docs/models.md), so a device thread keeps serving its
other models meanwhile: it loads the replica, runs the model's examples through it (warm-up, and
the outputs' real shapes), and times a small grid of batch sizes (the cost model,
docs/scheduler.md, section 1).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from app.graphs import GraphedReplica, NotGraphable, capture, record_cuda
from app.models.base import ModelHandler, Replica
from app.models.signature import TensorSpec, describe_outputs
from app.scheduler.cost import CostModel, grid
from app.scheduler.waiting import group_by
from app.tasks import DaemonPool
from app.text_graphs import TextGraphedReplica, capture_text, record_text_cuda
from app.transfer import DeviceExecutor

log = logging.getLogger("batchserve.warmup")

Graphs = bool | Literal["auto"]  # the cuda_graphs setting (app/config.py)

TEXT_LENGTHS = (16, 128)  # tokens per item when measuring a text model's cost
# A point of the cost grid is timed three times (the median kept) unless one run takes this
# long: then once. On a CPU those points are most of a text model's warm-up (minilm's 128-token
# batches of 8 to 32 took 7.2 of its 8.7 s at limit 32, three runs each), and serving refines them.
LONG_RUN_S = 0.2


@dataclass
class Warm:
    """A replica loaded and warmed up: its outputs and its measured cost (docs/scheduler.md)."""

    replica: Replica
    outputs: list[TensorSpec] | None
    cost: CostModel
    batch_limit: int  # the most items a batch may have: the one asked, or the largest that fits
    work_per_item: float = 1.0  # the examples' (their tokens, for a text model)
    padded: bool = False  # the handler gives lengths: batches are padded to the longest


class Loader:
    """Loads and warms one device's replicas, one at a time, on one thread of its own with the
    same streams every time. cuBLAS keeps a workspace for each (thread, stream) it has run on
    until the process ends (tens of MB each on recent GPUs): a fresh thread or stream per load
    would leave that much behind each time, so an unloaded model's memory would never all come
    back. A daemon thread: a load that never returns does not keep the process from exiting."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._thread = DaemonPool(f"load-{device}")
        self._executor: DeviceExecutor | None = None

    async def warm(self, handler: ModelHandler, limit: int, graphs: Graphs = False) -> Warm:
        return await self._thread.run(self._warm, handler, limit, graphs)

    def _warm(self, handler: ModelHandler, limit: int, graphs: Graphs) -> Warm:
        if self._executor is None:
            self._executor = DeviceExecutor(self.device)
        return warm_replica(handler, self.device, limit, self._executor, graphs)

    async def measure(self, handler: ModelHandler, replica: Replica, items: list[Any],
                      limit: int) -> tuple[CostModel, int]:
        """The cost grid of a replica already serving, from real items (a model without
        warm-up examples, after its first request)."""
        return await self._thread.run(self._measure, handler, replica, items, limit)

    def _measure(self, handler: ModelHandler, replica: Replica, items: list[Any],
                 limit: int) -> tuple[CostModel, int]:
        if self._executor is None:
            self._executor = DeviceExecutor(self.device)
        with torch.inference_mode():
            return measure(handler, replica, self._executor, items, limit, padded=False)

    async def close(self) -> None:
        """Its thread ends (unless a load is stuck in it: ``STOP_S`` at most)."""
        await self._thread.stop()


def warm_replica(handler: ModelHandler, device: torch.device, limit: int,
                 executor: DeviceExecutor | None = None, graphs: Graphs = False) -> Warm:
    """Load ``handler``'s replica for ``device``, run its examples through it (warm-up), with
    ``graphs`` on CUDA capture its forward as CUDA graphs (app/graphs.py; where it cannot,
    ``"auto"`` says so at info level, ``True`` warns), and time a small
    grid of batch sizes up to ``limit`` (for a text model, of two item lengths). Runs on a
    loader thread (``Loader``), so that a device thread keeps serving its other models
    meanwhile."""
    with torch.inference_mode():
        replica = handler.load(device)
        examples = handler.examples()
        executor = executor or DeviceExecutor(device)
        if not examples:
            if graphs:  # refused for want of examples to check a capture on; the log says so
                graphed(handler, replica, executor, limit, [], graphs == "auto")
            return Warm(replica, None, CostModel(), limit)
        items = handler.decode(examples)
        results: list[Any] = []
        for group in group_by(items, handler.key):
            results.extend(executor.launch(handler, replica, group).wait()[0])
        if graphs:
            replica = graphed(handler, replica, executor, limit, items, graphs == "auto")
        lengths = [handler.length(i) for i in items]
        padded = None not in lengths
        per_item = sum(lengths) / len(lengths) if padded else 1.0  # type: ignore[arg-type]
        cost, fits = measure(handler, replica, executor, items, limit, padded)
        return Warm(replica, describe_outputs(results), cost, fits, per_item, padded)


def graphed(handler: ModelHandler, replica: Replica, executor: DeviceExecutor, limit: int,
            items: list[Any], quiet: bool = False) -> Replica:
    """``replica`` with its forward captured as CUDA graphs up to ``limit`` on the executor's
    stream, or as it is where it cannot be. The log says why: a warning, or with ``quiet`` (the
    default setting's case) an info line, and nothing on a CPU."""
    name, device = handler.name, executor.device
    refused = logging.INFO if quiet else logging.WARNING
    if executor.stream is None:
        if not quiet:
            log.info("model %s on %s: cuda_graphs applies to CUDA devices only", name, device)
        return replica
    text = bool(items) and handler.length(items[0]) is not None
    started = time.perf_counter()
    try:
        # On the loader's own stream, as its other work: cuBLAS keeps a workspace for each
        # (thread, stream) it meets, which a default-stream matmul here would leave behind.
        with torch.cuda.stream(executor.stream):
            if not text:
                result: GraphedReplica | TextGraphedReplica = capture(
                    handler, replica, device, limit, items,
                    functools.partial(record_cuda, stream=executor.stream))
            else:
                result = capture_text(handler, replica, device, limit, items,
                                      functools.partial(record_text_cuda, stream=executor.stream))
    except NotGraphable as exc:
        log.log(refused, "model %s on %s: served without CUDA graphs: %s", name, device,
                str(exc))
        return replica
    lengths = (f" of lengths {', '.join(map(str, result.lengths))}"
               if isinstance(result, TextGraphedReplica) else "")
    log.info("model %s on %s: forward captured as CUDA graphs for batches of %s%s in %.1f s",
             name, device, ", ".join(map(str, result.sizes)), lengths,
             time.perf_counter() - started)
    if result.sizes[-1] < limit:
        log.log(refused, "model %s on %s: batches above %d run without CUDA graphs: a larger "
                "one's ran out of device memory", name, device, result.sizes[-1])
    return result


def measure(handler: ModelHandler, replica: Replica, executor: DeviceExecutor,
            items: list[Any], limit: int, padded: bool) -> tuple[CostModel, int]:
    """The cost grid, from batches of the warm-up items: repeated, or for a model that pads
    (``padded``) the first one cut to each of TEXT_LENGTHS; and the batch limit. A batch that
    runs out of device memory halves the limit, as serving does, until one fits (a model that
    cannot run one item fails to load)."""
    first = items[0]
    lengths = TEXT_LENGTHS if padded else (None,)

    def batch(n: int, length: int | None) -> list[Any]:
        if length is None:
            return [items[i % len(items)] for i in range(n)]
        return [np.resize(first, length) for _ in range(n)]

    def timed(n: int, length: int | None) -> list[tuple[float, float]]:
        """The point's samples: three runs, or one run of LONG_RUN_S or more."""
        def run() -> float:
            return executor.launch(handler, replica, batch(n, length)).wait()[1]

        runs = [run()]
        if runs[0] < LONG_RUN_S:
            runs += [run(), run()]
        return [(n * (length or 1), s) for s in runs]

    samples: list[tuple[float, float]] = []
    for length in lengths:
        sizes, ran = grid(limit), 0  # ran: the largest batch of this length that fitted
        while sizes:
            n = sizes.pop(0)
            try:
                samples += timed(n, length)
                ran = n
            except torch.OutOfMemoryError:
                if n == 1:
                    raise
                _release(executor)
                limit = max(n // 2, ran)
                sizes = [limit] if limit > ran else []
    return CostModel.measured(samples), limit


def _release(executor: DeviceExecutor) -> None:
    """What an out-of-memory batch left cached goes back, for the next try."""
    if executor.device.type == "cuda":
        torch.cuda.empty_cache()
