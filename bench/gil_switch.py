"""``python -m bench.gil_switch``: a device thread's batches next to a thread that holds the GIL.

The device thread releases the GIL inside each torch op and must win it back afterwards; while
another thread holds it (the event loop, in the server) it waits up to one switch interval per
op. On the CPU an op computes for long enough that this costs little at the server's 0.1 ms; on
CUDA an op only enqueues a kernel (microseconds), so a batch of many ops next to a busy event
loop may spend most of its time waiting for the GIL. This runs the server's own path for one
batch (``DeviceExecutor.launch`` and ``Launch.wait``: collate, pinning, copies, events, the
forward, the split) alone, then next to a thread that only spins, at several switch intervals,
and prints the batch's time and the spinner's rate (what the waiting costs it). On CUDA,
``--graph`` also runs it with ``cuda_graphs`` (app/graphs.py: two events, a copy in, one
replay and a copy out a batch, whatever the model), to show what fewer ops a batch take back.

Then, for each path, where a batch let the GIL go: ten batches under a profile
hook next to the spinner at a 5 ms switch interval, where letting the GIL go costs a whole
interval to win it back, so each gap of more than half an interval between two profile events
is named (by the C function it returned from, or else the Python line it was in) with how
often a batch has it. These are what a busy event loop makes the device thread wait on, and
what to take out of the launch (or into one graph) first. On the CPU an op that computes for
longer than half an interval shows too; on CUDA an op only enqueues.

    python -m bench.gil_switch --workload mlp
    python -m bench.gil_switch --workload mlp --devices cuda --batch 256 --seconds 2 --graph
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import FrameType
from typing import Any

import torch

from app.devices import resolve_devices
from app.graphs import GraphedReplica
from app.models.registry import load_handler
from app.process import launching
from app.transfer import DeviceExecutor
from app.warmup import warm_replica

INTERVALS_S = (0.005, 0.001, 0.0001, 0.00002)


def batch_us(run: Callable[[], None], seconds: float) -> float:
    """The mean time of ``run()`` over ``seconds``, in microseconds."""
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        run()
        n += 1
    return (time.perf_counter() - start) / n * 1e6


def spin(stop: threading.Event, count: list[int]) -> None:
    """Hold the GIL as a saturated event loop would, counting iterations."""
    x = 0
    while not stop.is_set():
        x += 1
    count[0] = x


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="mlp", help="a builtin model (mlp)")
    p.add_argument("--devices", default="cpu", help="one device (cpu)")
    p.add_argument("--batch", type=int, default=32, help="items a batch (32)")
    p.add_argument("--seconds", type=float, default=4.0, help="a point (4)")
    p.add_argument("--graph", action="store_true", help="CUDA: also the forward as a CUDA graph")
    p.add_argument("--short-launch", action="store_true",
                   help="on the CPU, run each batch at the short switch interval of a CUDA "
                        "launch and wait (app/process.py), as a stand-in whose ops are as short "
                        "as CUDA's")
    p.add_argument("--pause-ms", type=float, default=0.0,
                   help="on the CPU, sleep this long between a batch's launch and its wait, "
                        "as a CUDA batch's sync lets the GIL go while the device computes (0)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    device = resolve_devices(args.devices)[0]
    handler = load_handler(args.workload, None)
    replica = handler.load(device)
    items = handler.decode(handler.examples()[:1] * args.batch)
    executor = DeviceExecutor(device)

    cuda = device.type == "cuda"
    # On CUDA the launch and the wait take the short interval themselves.
    short: AbstractContextManager[None] = (
        launching if args.short_launch and not cuda else contextlib.nullcontext())

    pause_s = args.pause_ms / 1e3

    def run() -> None:
        with short:
            launch = executor.launch(handler, replica, items)
            if pause_s:
                time.sleep(pause_s)  # a device computing, the GIL let go (a CUDA sync's)
            launch.wait()

    curve(f"{args.workload} on {device}, batch {args.batch}, the server's launch and wait", run,
          args.seconds, cuda or args.short_launch)
    releases(run)
    if args.graph and device.type == "cuda":
        graphs = warm_replica(handler, device, args.batch, executor, graphs=True).replica

        def replay() -> None:
            executor.launch(handler, graphs, items).wait()

        kind = "CUDA graphs" if isinstance(graphs, GraphedReplica) else "none: not graphable"
        curve(f"the same with cuda_graphs ({kind}; docs/cuda-graphs.md)", replay, args.seconds,
              cuda)
        releases(replay)
    return 0


def curve(title: str, run: Callable[[], None], seconds: float, short: bool = False) -> None:
    """``run``'s time alone, then next to a spinning thread at each switch interval; where its
    launch and wait take the server's shorter one (``short``: on CUDA, ``launching`` in
    app/process.py), the server's 0.1 ms is also run without it."""
    batch_us(run, 1.0)  # warm up
    print(title)
    print(f"  alone: {batch_us(run, seconds):.0f} us a batch")
    points = [(interval, "") for interval in INTERVALS_S]
    if short:
        points.append((INTERVALS_S[2], ", launch and wait at it too"))
    for interval, note in points:
        spins = [0]
        start = time.perf_counter()
        with long_launches() if note else contextlib.nullcontext(), spinning(interval, spins):
            took = batch_us(run, seconds)
        spin_rate = spins[0] / (time.perf_counter() - start) / 1e6
        print(f"  switch interval {interval * 1e3:.2f} ms{note}: {took:.0f} us a batch, "
              f"spinner {spin_rate:.1f} M/s")


@contextmanager
def long_launches() -> Iterator[None]:
    """Launches and waits at the interval set, not at the server's shorter one (``launching``,
    app/process.py)."""
    launch_s = launching.interval_s
    launching.interval_s = 1.0  # never below the interval set
    try:
        yield
    finally:
        launching.interval_s = launch_s


@contextmanager
def spinning(interval_s: float, spins: list[int] | None = None) -> Iterator[None]:
    """A thread that holds the GIL (``spin``) at this switch interval while the block runs;
    its iterations into ``spins``."""
    sys.setswitchinterval(interval_s)
    stop = threading.Event()
    spins = [0] if spins is None else spins
    spinner = threading.Thread(target=spin, args=(stop, spins))
    spinner.start()
    try:
        yield
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(INTERVALS_S[0])


def releases(run: Callable[[], None], batches: int = 10, interval_s: float = 0.005) -> None:
    """Print where ``run`` let the GIL go (module docstring): each gap of more than half a
    switch interval between two profile events next to the spinner, named by the C function
    it returned from, or else by the Python line it was in (a callable C object, a TorchScript
    forward among them, sends no C-call event of its own)."""
    slow: collections.Counter[str] = collections.Counter()
    waited: collections.defaultdict[str, float] = collections.defaultdict(float)  # s, by place
    last = [0.0]

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        now = time.perf_counter()
        if now - last[0] > interval_s / 2 and last[0]:
            where = "/".join(frame.f_code.co_filename.rsplit("/", 2)[-2:])
            name = (getattr(arg, "__qualname__", repr(arg)) if event.startswith("c_")
                    else frame.f_code.co_qualname)
            place = f"{name} ({where}:{frame.f_lineno})"
            slow[place] += 1
            waited[place] += now - last[0]
        last[0] = time.perf_counter()

    with long_launches(), spinning(interval_s):  # each wait a whole interval, to be seen
        sys.setprofile(hook)
        try:
            for _ in range(batches):
                run()
        finally:
            sys.setprofile(None)
    per_batch = batches * interval_s  # seconds -> intervals a batch
    print(f"  where the GIL went: {sum(slow.values()) / batches:.1f} places a batch, "
          f"{sum(waited.values()) / per_batch:.1f} intervals (one C call may let it go many "
          "times: one place, many intervals)")
    for name, count in slow.most_common():
        print(f"    {count / batches:6.2f} x {waited[name] / per_batch:6.1f} intervals  {name}")


if __name__ == "__main__":
    sys.exit(main())
