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

    python -m bench.gil_switch --workload mlp
    python -m bench.gil_switch --workload mlp --devices cuda --batch 256 --seconds 2 --graph
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable

import torch

from app.devices import resolve_devices
from app.graphs import GraphedReplica
from app.models.registry import load_handler
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
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    device = resolve_devices(args.devices)[0]
    handler = load_handler(args.workload, None)
    replica = handler.load(device)
    items = handler.decode(handler.examples()[:1] * args.batch)
    executor = DeviceExecutor(device)

    def run() -> None:
        executor.launch(handler, replica, items).wait()

    curve(f"{args.workload} on {device}, batch {args.batch}, the server's launch and wait", run,
          args.seconds)
    if args.graph and device.type == "cuda":
        graphs = warm_replica(handler, device, args.batch, executor, graphs=True).replica

        def replay() -> None:
            executor.launch(handler, graphs, items).wait()

        kind = "CUDA graphs" if isinstance(graphs, GraphedReplica) else "none: not graphable"
        curve(f"the same with cuda_graphs ({kind}; docs/cuda-graphs.md)", replay, args.seconds)
    return 0


def curve(title: str, run: Callable[[], None], seconds: float) -> None:
    """``run``'s time alone, then next to a spinning thread at each switch interval."""
    batch_us(run, 1.0)  # warm up
    print(title)
    print(f"  alone: {batch_us(run, seconds):.0f} us a batch")
    for interval in INTERVALS_S:
        sys.setswitchinterval(interval)
        stop, spins = threading.Event(), [0]
        spinner = threading.Thread(target=spin, args=(stop, spins))
        spinner.start()
        start = time.perf_counter()
        took = batch_us(run, seconds)
        stop.set()
        spinner.join()
        spin_rate = spins[0] / (time.perf_counter() - start) / 1e6
        print(f"  switch interval {interval * 1e3:.2f} ms: {took:.0f} us a batch, "
              f"spinner {spin_rate:.1f} M/s")
    sys.setswitchinterval(INTERVALS_S[0])


if __name__ == "__main__":
    sys.exit(main())
