"""A text model's forward as CUDA graphs, one per bucket of (batch size, length)
(docs/cuda-graphs.md, "Text models").

For a model that pads each batch to its longest item, whose ``collate`` gives 2-D integer
tensors of (items, length) (token ids, attention mask) and whose forward gives one tensor with
a row per item. A batch is collated as ever, then written into its bucket's region of pinned
buffers with numpy, zeros past its rows and tokens (padding id 0, mask 0); then an event, one
copy in per input, the replay, the copy out, an event. The capture checks that the padding
changes nothing. Kept apart from app/graphs.py's fixed-shape path; both are taken under the
default ``cuda_graphs = "auto"``.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from app.graphs import (
    GraphedReplica,
    NotGraphable,
    buckets,
    check_outputs,
    graph_of,
    record_fitting,
    take_free,
)
from app.models.base import ModelHandler, Replica
from app.models.outputs import map_tensors

MIN_LENGTH = 16  # the shortest length captured: shorter batches pad up to it

Key = tuple[int, int]  # a bucket: (rows, length)
# One bucket's forward: (replay, its static inputs on the device, its static output).
TextRecorded = tuple[Callable[[], None], dict[str, torch.Tensor], torch.Tensor]
# How to capture: the replica, each input's dtype, the buckets, the device.
TextRecord = Callable[[Replica, dict[str, torch.dtype], list[Key], torch.device],
                      dict[Key, TextRecorded]]


def lengths(longest: int) -> list[int]:
    """The lengths captured: as ``buckets`` from MIN_LENGTH (powers of two, halfway sizes from
    FINE_FROM), and ``longest``."""
    return buckets(longest, MIN_LENGTH) if longest > MIN_LENGTH else [longest]


@dataclass(eq=False)
class TextBuffers:
    """One set of pinned host buffers: each input flat (``rows`` x ``longest``), the outputs
    out, with numpy views and each bucket's contiguous (rows, length) view of the inputs."""

    host_in: dict[str, torch.Tensor]
    host_out: torch.Tensor
    rows_out: np.ndarray = field(init=False)
    views: dict[Key, tuple[dict[str, torch.Tensor], dict[str, np.ndarray], torch.Tensor]] = \
        field(default_factory=dict)
    busy: bool = False

    def __post_init__(self) -> None:
        self.rows_out = self.host_out.numpy()


class TextGraphedReplica:
    """A replica whose batches replay the graph of the smallest bucket that holds their rows
    and length. Called as the replica is (warm-up, a batch no bucket holds), it runs eagerly."""

    def __init__(self, replica: Replica, graphs: dict[Key, TextRecorded],
                 buffers: list[TextBuffers]) -> None:
        self.replica = replica
        self.sizes = sorted({rows for rows, _ in graphs})
        self.lengths = sorted({length for _, length in graphs})
        self._graphs = graphs
        self._buffers = buffers
        for x in buffers:  # views made once: slicing is a torch call too
            for rows, length in graphs:
                hosts = {name: t[:rows * length].view(rows, length)
                         for name, t in x.host_in.items()}
                x.views[rows, length] = (hosts, {name: t.numpy() for name, t in hosts.items()},
                                         x.host_out[:rows])

    def __call__(self, batch: Any) -> Any:
        return self.replica(batch)

    def bucket(self, n: int, length: int) -> Key | None:
        """The smallest captured (rows, length) that holds ``n`` items of ``length``."""
        at, to = bisect_left(self.sizes, n), bisect_left(self.lengths, length)
        if at == len(self.sizes) or to == len(self.lengths):
            return None
        return self.sizes[at], self.lengths[to]

    def take(self) -> TextBuffers | None:
        """Free buffers, marked busy until released; None while every set is in flight."""
        return take_free(self._buffers)

    def fill(self, buffers: TextBuffers, batch: dict[str, torch.Tensor], key: Key) -> None:
        """Write a collated batch into ``key``'s region of ``buffers``, zeros past it (numpy:
        no torch call but reading the batch's arrays)."""
        arrays = buffers.views[key][1]
        for name, tensor in batch.items():
            view = arrays[name]
            view.fill(0)
            n, length = tensor.shape
            view[:n, :length] = tensor.numpy()

    def run(self, buffers: TextBuffers, key: Key) -> None:
        """Enqueue on the current stream: ``key``'s inputs in, its replay, its outputs out."""
        replay, inputs, output = self._graphs[key]
        hosts, _, host_out = buffers.views[key]
        for name, device_in in inputs.items():
            device_in.copy_(hosts[name], non_blocking=True)
        replay()
        host_out.copy_(output, non_blocking=True)


def batch_length(batch: Any) -> int | None:
    """The length of a collated text batch: its 2-D integer tensors' second dimension, where
    it has only such tensors, all of one shape; None otherwise."""
    if not isinstance(batch, dict) or not batch:
        return None
    shapes = {t.shape if isinstance(t, torch.Tensor) and t.dim() == 2
              and not t.is_floating_point() else None for t in batch.values()}
    if len(shapes) != 1 or None in shapes:
        return None
    return int(next(iter(batch.values())).shape[1])


def capture_text(handler: ModelHandler, replica: Replica, device: torch.device, limit: int,
                 examples: list[Any], record: TextRecord) -> TextGraphedReplica:
    """``replica``'s forward captured for each (rows, length) bucket up to ``limit`` rows and
    the handler's ``max_length`` (``record``: how, e.g. ``record_text_cuda``), the rows halved
    while the largest runs out of device memory; checked on the decoded warm-up ``examples``
    against the eager forward, in a bucket with rows and tokens to spare. Raises
    NotGraphable."""
    longest = handler.max_length
    if longest is None:
        raise NotGraphable("it declares no longest input (max_length)")
    if not examples:
        raise NotGraphable("it has no warm-up examples to check the capture on")
    collated = handler.collate(examples)
    if batch_length(collated) is None:
        raise NotGraphable("its batches are not integer tensors of (items, length)")
    assert isinstance(collated, dict)
    dtypes = {name: t.dtype for name, t in collated.items()}
    graphs = record_fitting(lambda most: record(
        replica, dtypes, [(rows, length) for rows in buckets(most) for length in lengths(longest)],
        device), limit, device)
    limit = max(rows for rows, _ in graphs)
    output = graphs[limit, longest][2]
    if not isinstance(output, torch.Tensor) or output.dim() == 0 or output.shape[0] != limit:
        raise NotGraphable("its forward does not return one tensor with a row per item")
    pinned = device.type == "cuda"
    buffers = [TextBuffers({name: torch.zeros(limit * longest, dtype=dtype, pin_memory=pinned)
                            for name, dtype in dtypes.items()},
                           torch.zeros((limit, *output.shape[1:]), dtype=output.dtype,
                                       pin_memory=pinned)) for _ in range(2)]
    graphed = TextGraphedReplica(replica, graphs, buffers)
    _check(graphed, replica, collated, limit, longest, device)
    return graphed


def _check(graphed: TextGraphedReplica, replica: Replica, collated: dict[str, torch.Tensor],
           limit: int, longest: int, device: torch.device) -> None:
    """The examples through a bucket with rows and tokens to spare, against the eager forward."""
    n, length = next(iter(collated.values())).shape
    if n > limit or length > longest:
        raise NotGraphable("its warm-up examples do not fit its largest graph")
    key = graphed.bucket(min(n + 1, limit), min(length + 1, longest))
    assert key is not None
    buffers = graphed.take()
    assert buffers is not None
    graphed.fill(buffers, collated, key)
    graphed.run(buffers, key)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    got = GraphedReplica.release(buffers, n)  # any buffers with outputs' rows
    check_outputs(got, replica(map_tensors(lambda t: t.to(device), collated)))


def record_text_cuda(replica: Replica, dtypes: dict[str, torch.dtype], keys: list[Key],
                     device: torch.device, stream: torch.cuda.Stream) -> dict[Key, TextRecorded]:
    """Each bucket's forward on static inputs of its (rows, length) as a CUDA graph, captured
    on ``stream`` (the loader's, app/warmup.py), largest first, all in one memory pool. Three
    runs before each capture: a TorchScript forward specialises on the shapes it has seen.
    bfloat16 outputs are widened to float32 in the graph."""
    stream.wait_stream(torch.cuda.current_stream(device))
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[Key, TextRecorded] = {}
    for rows, length in sorted(keys, key=lambda k: (k[0] * k[1], k), reverse=True):
        inputs = {name: torch.zeros((rows, length), dtype=dtype, device=device)
                  for name, dtype in dtypes.items()}
        replay, output = graph_of(functools.partial(replica, inputs), pool, stream, 3)
        graphs[rows, length] = (replay, inputs, output)
    torch.cuda.current_stream(device).wait_stream(stream)
    return graphs
