"""A replica's forward captured as CUDA graphs, one per bucket of batch sizes (docs/cuda-graphs.md).

A batch then costs the device thread seven torch calls, each a GIL hand-off (two events, copy
in, replay, copy out; the wait's sync and elapsed time), whatever the model's depth, where the
eager path makes about twenty and one a layer. Only for models whose items are float32 arrays
of one declared shape (``handler.stacks``) and whose forward gives one tensor with a row per
item; rows past a batch's in its bucket hold earlier data, so the capture checks that they
change nothing.
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from app.arrays import concat_held, copy_held
from app.models.base import ModelHandler, Replica

# Graph against eager on the warm-up examples: kernels differ by batch size; rows that mix
# differ by far more. Half-precision outputs get four of their epsilons.
CHECK_RTOL = 1e-3

# One bucket's forward on its rows of the static input: (replay, its static output).
Recorded = tuple[Callable[[], None], torch.Tensor]
Record = Callable[[Replica, torch.Tensor, list[int]], dict[int, Recorded]]


class NotGraphable(Exception):
    """Why a model is served eagerly although ``cuda_graphs`` is set."""


# From this many rows up, a bucket lies halfway between each two powers of two: there a
# forward's time grows with its rows, and padding costs at most half a batch's compute, not all
# of it (MiniLM on an H200 padded batches of 47 sentences to 64). Below it a forward's time
# barely moves with its rows.
FINE_FROM = 16


def buckets(limit: int, smallest: int = 1) -> list[int]:
    """The sizes captured up to ``limit``: the powers of two from ``smallest`` below it, from
    FINE_FROM up with the sizes halfway between them (16, 24, 32, 48, 64, 96, ...), and
    ``limit``. The cost model's warm-up (``grid``) times the powers of two among them."""
    found, n = [], smallest
    while n < limit:
        found.append(n)
        if n >= FINE_FROM and n + n // 2 < limit:
            found.append(n + n // 2)
        n *= 2
    return [*found, limit]


def fill_rows(out: np.ndarray, items: list[np.ndarray]) -> None:
    """Write ``items`` (rows of ``out``'s row shape, or chunks of such rows: app/pending.py)
    into ``out``, in order, holding the GIL (``concat_held``), or else with one concatenation."""
    flat = out.reshape(-1)
    if not concat_held(flat, items):
        np.concatenate([i.reshape(-1) for i in items], out=flat)


class Outputs(Protocol):
    """What ``release`` needs of a pair of pinned buffers: the outputs' rows, and the mark."""

    rows_out: np.ndarray
    busy: bool


B = TypeVar("B", bound=Outputs)
T = TypeVar("T")


def take_free(sets: list[B]) -> B | None:
    """The first set of buffers not in flight, marked busy until ``release``; None if all are."""
    for buffers in sets:
        if not buffers.busy:
            buffers.busy = True
            return buffers
    return None


@dataclass(eq=False)
class HostBuffers:
    """One pair of pinned host buffers, a batch's rows in and its outputs out, with numpy views
    (writing and reading them makes no torch call) and a view of each bucket's rows."""

    host_in: torch.Tensor
    host_out: torch.Tensor
    rows_in: np.ndarray = field(init=False)
    rows_out: np.ndarray = field(init=False)
    views: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    busy: bool = False

    def __post_init__(self) -> None:
        self.rows_in = self.host_in.numpy()
        self.rows_out = self.host_out.numpy()


class GraphedReplica:
    """A replica whose batches of up to ``limit`` rows replay a captured graph. Called as the
    replica is (the warm-up's examples, a batch when no buffers are free), it runs eagerly."""

    def __init__(self, replica: Replica, device_in: torch.Tensor,
                 graphs: dict[int, Recorded], buffers: list[HostBuffers]) -> None:
        self.replica = replica
        self.sizes = sorted(graphs)
        self._graphs = graphs
        self._device_in = {b: device_in[:b] for b in self.sizes}
        self._buffers = buffers
        for x in buffers:  # views made once: slicing is a torch call too
            x.views = {b: (x.host_in[:b], x.host_out[:b]) for b in self.sizes}

    def __call__(self, batch: Any) -> Any:
        return self.replica(batch)

    def bucket(self, n: int) -> int | None:
        """The smallest captured batch size that holds ``n`` rows."""
        at = bisect_left(self.sizes, n)
        return self.sizes[at] if at < len(self.sizes) else None

    def take(self, n: int) -> HostBuffers | None:
        """Free buffers for a batch of ``n`` rows, marked busy until ``release``; None where
        the batch is larger than any graph or every pair is in flight."""
        if n > self.sizes[-1]:
            return None
        return take_free(self._buffers)

    def run(self, buffers: HostBuffers, n: int) -> None:
        """Enqueue on the current stream: the bucket's rows of ``buffers`` in, the replay, its
        outputs out. The caller has written the first ``n`` rows of ``buffers.rows_in``."""
        b = self.bucket(n)
        assert b is not None
        replay, output = self._graphs[b]
        host_in, host_out = buffers.views[b]
        self._device_in[b].copy_(host_in, non_blocking=True)
        replay()
        host_out.copy_(output, non_blocking=True)

    @staticmethod
    def release(buffers: Outputs, n: int) -> torch.Tensor:
        """The first ``n`` output rows, copied out of ``buffers`` (once the device is done with
        them), which are free again."""
        try:
            return torch.from_numpy(copy_held(buffers.rows_out[:n]))
        finally:
            buffers.busy = False


def capture(handler: ModelHandler, replica: Replica, device: torch.device, limit: int,
            examples: list[Any], record: Record) -> GraphedReplica:
    """``replica``'s forward captured for each bucket up to ``limit`` (``record``: how, e.g.
    ``record_cuda``), or up to half of it, a quarter..., where the largest runs out of device
    memory (larger batches then run eagerly); checked on the decoded warm-up ``examples``
    against the eager forward with the rows past them in their bucket filled with ones. Raises
    NotGraphable."""
    shape = handler.input_shape
    if not handler.stacks or shape is None:
        raise NotGraphable("its items are not float32 arrays of one declared shape")
    if not examples:
        raise NotGraphable("it has no warm-up examples to check the capture on")

    def attempt(rows: int) -> tuple[torch.Tensor, dict[int, Recorded]]:
        device_in = torch.zeros((rows, *shape), device=device)
        _one_tensor(replica(device_in), rows)
        return device_in, record(replica, device_in, buckets(rows))

    device_in, graphs = record_fitting(attempt, limit, device)
    limit = max(graphs)
    output = graphs[limit][1]
    pinned = device.type == "cuda"
    buffers = [HostBuffers(torch.zeros((limit, *shape), pin_memory=pinned),
                           torch.zeros((limit, *output.shape[1:]), dtype=output.dtype,
                                       pin_memory=pinned)) for _ in range(2)]
    graphed = GraphedReplica(replica, device_in, graphs, buffers)
    _check(graphed, replica, examples, limit, device)
    return graphed


def record_fitting(attempt: Callable[[int], T], limit: int, device: torch.device) -> T:
    """``attempt(limit)``: the capture up to a batch of ``limit`` rows, the limit halved while
    it runs out of device memory (what a failed try held is free before the next: its frame
    goes with the handled error). Whatever else the capture raises, and running out of memory
    at one row, raises NotGraphable."""
    try:
        while True:
            try:
                return attempt(limit)
            except torch.OutOfMemoryError:
                if limit == 1:
                    raise
            limit //= 2
            if device.type == "cuda":
                torch.cuda.empty_cache()
    except NotGraphable:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the capture refused
        raise NotGraphable(f"its forward could not be captured ({type(exc).__name__}: "
                           f"{exc})") from exc


def _check(graphed: GraphedReplica, replica: Replica, examples: list[Any], limit: int,
           device: torch.device) -> None:
    """The examples through a bucket with rows to spare, against the eager forward."""
    # At least one row to spare, but with a limit of 1 every batch fills its one-row graph.
    rows = np.asarray(examples[:max(1, limit - 1)], dtype=np.float32)
    n = len(rows)
    buffers = graphed.take(n)
    assert buffers is not None
    buffers.rows_in[:] = 1.0
    buffers.rows_in[:n] = rows
    graphed.run(buffers, min(n + 1, limit))  # a bucket above n, the rows past n ones
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    got = graphed.release(buffers, n)
    check_outputs(got, replica(torch.from_numpy(rows).to(device)))


def check_outputs(got: torch.Tensor, expected: Any) -> None:
    """Raises NotGraphable unless the graph's rows ``got`` match the eager forward's."""
    if not isinstance(expected, torch.Tensor):
        raise NotGraphable("its forward does not return one tensor")
    rtol = CHECK_RTOL
    if expected.is_floating_point():  # half-precision outputs differ more between kernels
        rtol = max(rtol, 4 * torch.finfo(expected.dtype).eps)
    expected = expected.float().cpu()
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    if got.shape != expected.shape or not torch.allclose(
            got.float(), expected, rtol=rtol, atol=rtol * max(scale, 1e-6)):
        raise NotGraphable("its outputs differ with other rows in the batch (rows that are not "
                           "independent, or a forward the capture does not reproduce)")


def record_cuda(replica: Replica, device_in: torch.Tensor, sizes: list[int],
                stream: torch.cuda.Stream) -> dict[int, Recorded]:
    """Each size's forward on the first rows of ``device_in`` as a CUDA graph, captured on
    ``stream`` (not the default stream; the loader's own, app/warmup.py, since cuBLAS keeps a
    workspace for each stream it meets), largest first, all in one memory pool (the smaller
    ones reuse the largest's activations; they are replayed one at a time on one stream).
    bfloat16 outputs are widened to float32 in the graph (numpy, which renders the results, has
    no bfloat16)."""
    device = device_in.device
    stream.wait_stream(torch.cuda.current_stream(device))
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[int, Recorded] = {}
    for size in sorted(sizes, reverse=True):
        graphs[size] = graph_of(functools.partial(replica, device_in[:size]), pool, stream)
    torch.cuda.current_stream(device).wait_stream(stream)
    return graphs


def graph_of(forward: Callable[[], Any], pool: Any, stream: torch.cuda.Stream,
             warmups: int = 2) -> tuple[Callable[[], None], Any]:
    """``forward`` run ``warmups`` times on ``stream`` (off the default stream, as capture
    needs), then captured as a CUDA graph in ``pool``: (its replay, its static output).
    bfloat16 outputs are widened to float32 in the graph (numpy, which renders the results,
    has no bfloat16)."""
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            forward()
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    # thread_local: the device threads may launch and sync other models meanwhile
    with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
        output = forward()
        if isinstance(output, torch.Tensor) and output.dtype == torch.bfloat16:
            output = output.float()
    return graph.replay, output


def _one_tensor(output: Any, rows: int) -> torch.Tensor:
    if not isinstance(output, torch.Tensor) or output.dim() == 0 or output.shape[0] != rows:
        raise NotGraphable("its forward does not return one tensor with a row per item")
    return output
