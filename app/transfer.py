"""Running one model call on a device: copy in, forward, copy out, split.

On the CPU everything happens inside ``launch``. On CUDA (in the spirit of SPDL's transfer stage)
``launch`` only enqueues work and returns: the collated batch is copied from pinned host memory to
the device on a copy-in stream, the forward runs on a compute stream once that copy's event fired,
and the outputs are copied back into pinned host memory on a copy-out stream once the compute event
fired. ``Launch.wait`` sleeps until the last event fired and splits the outputs. So while batch N
computes, the device thread collects batch N+1 and enqueues its copy-in, and batch N-1's copy-out
and scatter overlap batch N's compute.

Memory safety across streams: tensors made on one stream and used on another are marked with
``record_stream`` so the caching allocator does not hand their memory out again before the other
stream is done with it. Pinned host memory comes from PyTorch's caching host allocator
(``pin_memory``), which reuses pinned blocks and keeps each one until the copies that use it have
completed; the host outputs stay alive as long as the per-item results that view them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from app.graphs import GraphedReplica, HostBuffers, fill_rows
from app.models.base import ModelHandler, Replica, Tensors
from app.models.outputs import OutputCountMismatch, map_tensors
from app.process import launching
from app.text_graphs import TextBuffers, TextGraphedReplica, batch_length


@dataclass(eq=False)
class Launch:
    """One model call in progress. ``wait`` gives (per-item results, device seconds).

    On CUDA ``done`` fires when the outputs are in host memory; ``started`` and ``computed`` time
    the forward. On the CPU the call is finished and ``cpu_seconds`` holds its time. A batch
    replayed as a graph (app/graphs.py) has its outputs in ``graph``'s buffers until ``wait``.
    """

    handler: ModelHandler
    n: int
    outputs: Tensors
    done: torch.cuda.Event | None = None
    started: torch.cuda.Event | None = None
    computed: torch.cuda.Event | None = None
    cpu_seconds: float = 0.0
    graph: HostBuffers | TextBuffers | None = None

    @property
    def pending(self) -> bool:
        """True while the device may still be working on it (never on the CPU)."""
        return self.done is not None

    def wait(self) -> tuple[Sequence[Any], float]:
        seconds = self.cpu_seconds
        try:
            if self.done is not None:
                with launching:  # two GIL hand-offs at the short interval (app/process.py)
                    self.done.synchronize()
                    if self.started is not None and self.computed is not None:
                        seconds = self.started.elapsed_time(self.computed) / 1000.0
        finally:
            if self.graph is not None:  # the buffers are free again, whatever happened
                self.outputs = GraphedReplica.release(self.graph, self.n)
                self.graph = None
        results = self.handler.split(self.outputs, self.n)
        if len(results) != self.n:
            raise OutputCountMismatch(f"handler returned {len(results)} results for {self.n} items")
        return results, seconds


class DeviceExecutor:
    """Launches model calls on one device, for any model. Created and used on one thread only
    (the device's thread, or a loader warming a model up)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # OpenMP's thread count is per thread, and ATen gives a new thread the process's
        # torch.set_num_threads only at its first parallel op, which small batches never reach:
        # until then MKL called from this thread runs on every core. Asking for the count
        # applies it now.
        torch.get_num_threads()
        self.pipelined = device.type == "cuda"
        self.stream: torch.cuda.Stream | None = None  # the compute stream, on CUDA
        if self.pipelined:
            torch.cuda.set_device(device)
            self._copy_in = _stream(device)
            self._compute = self.stream = _stream(device)
            self._copy_out = _stream(device)

    def launch(self, handler: ModelHandler, replica: Replica, data: list[Any],
               rows: int | None = None) -> Launch:
        """Collate ``data`` and start the model call; raises what collate or forward raise
        (an out-of-memory error among them) before anything is left running. ``rows``: the
        instances ``data`` holds, where some are chunks (app/pending.py); one result each. On
        CUDA its GIL hand-offs run at the short switch interval (``launching``,
        app/process.py)."""
        if not self.pipelined:
            return self._launch(handler, replica, data, rows)
        with launching:
            return self._launch(handler, replica, data, rows)

    def _launch(self, handler: ModelHandler, replica: Replica, data: list[Any],
                rows: int | None) -> Launch:
        n = len(data) if rows is None else rows
        with torch.inference_mode():
            if isinstance(replica, GraphedReplica) and (buffers := replica.take(n)) is not None:
                return self._replay(handler, n, buffers,
                                    functools.partial(fill_rows, buffers.rows_in[:n], data),
                                    functools.partial(replica.run, buffers, n))
            batch = handler.collate(data)
            if isinstance(replica, TextGraphedReplica):
                length = batch_length(batch)
                key = replica.bucket(n, length) if length is not None else None
                if key is not None and (text := replica.take()) is not None:
                    return self._replay(handler, n, text,
                                        functools.partial(replica.fill, text, batch, key),
                                        functools.partial(replica.run, text, key))
            if not self.pipelined:
                t0 = time.perf_counter()
                outputs = replica(batch)
                return Launch(handler, n, outputs, cpu_seconds=time.perf_counter() - t0)
            return self._launch_cuda(handler, replica, batch, n)

    def _replay(self, handler: ModelHandler, n: int, buffers: HostBuffers | TextBuffers,
                write: Callable[[], None], run: Callable[[], None]) -> Launch:
        """A batch through a captured graph: ``write`` puts it into pinned memory with numpy,
        then five torch calls or so: an event, copy in, replay (``run``), copy out, an event
        (docs/cuda-graphs.md). The buffers are free again if anything fails."""
        try:
            write()
            if not self.pipelined:
                t0 = time.perf_counter()
                run()
                return Launch(handler, n, None, cpu_seconds=time.perf_counter() - t0,
                              graph=buffers)
            started, done = _event(timing=True), _event(timing=True)
            with torch.cuda.stream(self._compute):
                started.record(self._compute)
                run()
                done.record(self._compute)
        except BaseException:
            buffers.busy = False
            raise
        return Launch(handler, n, None, done, started, done, graph=buffers)

    def _launch_cuda(self, handler: ModelHandler, replica: Replica, batch: Tensors,
                     n: int) -> Launch:
        device = self.device
        pinned = map_tensors(lambda t: t if t.is_pinned() else t.pin_memory(), batch)
        with torch.cuda.stream(self._copy_in):
            on_device = map_tensors(lambda t: t.to(device, non_blocking=True), pinned)
        copied = _event()
        copied.record(self._copy_in)

        self._compute.wait_event(copied)
        started = _event(timing=True)
        computed = _event(timing=True)
        with torch.cuda.stream(self._compute):
            map_tensors(lambda t: _recorded(t, self._compute), on_device)
            started.record(self._compute)
            outputs = replica(on_device)
            computed.record(self._compute)

        self._copy_out.wait_event(computed)
        with torch.cuda.stream(self._copy_out):
            map_tensors(lambda t: _recorded(t, self._copy_out), outputs)
            host = map_tensors(_to_pinned_host, outputs)
        done = _event()
        done.record(self._copy_out)
        return Launch(handler, n, host, done, started, computed)


def _stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def _event(timing: bool = False) -> torch.cuda.Event:
    """An event whose ``synchronize`` sleeps until the device is done, where CUDA's default with
    one context spins: a spinning wait holds a core for as long as a batch is in flight, a core
    the front ends and the device process's event loop need (docs/frontends.md)."""
    return torch.cuda.Event(enable_timing=timing, blocking=True)  # type: ignore[no-untyped-call]


def _recorded(tensor: torch.Tensor, stream: torch.cuda.Stream) -> torch.Tensor:
    if tensor.is_cuda:
        tensor.record_stream(stream)
    return tensor


def _to_pinned_host(tensor: torch.Tensor) -> torch.Tensor:
    if not tensor.is_cuda:
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host
