"""How the GIL switch interval slows a model's thread next to a busy Python thread.

The device thread releases the GIL inside each torch op and must win it back afterwards; while
another thread holds it (the event loop, in the server) it waits up to one switch interval per
op. This runs a builtin model at batch 32 alone, then next to a thread that only spins, at
several intervals, and prints the model's items/s and the spinner's rate (its cost).

    python bench/gil_switch.py mlp
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from app.models.registry import load_handler

INTERVALS_S = (0.005, 0.001, 0.0002, 0.0001, 0.00005)


def items_per_s(replica: Callable[[Any], Any], batch: Any, seconds: float = 4.0) -> float:
    n, start = 0, time.perf_counter()
    with torch.inference_mode():
        while time.perf_counter() - start < seconds:
            replica(batch)
            n += 32
    return n / (time.perf_counter() - start)


def spin(stop: threading.Event, count: list[int]) -> None:
    """Hold the GIL as a busy event loop would, counting iterations."""
    x = 0
    while not stop.is_set():
        x += 1
    count[0] = x


def main(name: str) -> None:
    torch.set_num_threads(1)
    handler = load_handler(name, None)
    replica = handler.load(torch.device("cpu"))
    batch = handler.collate(handler.decode(handler.examples()[:1] * 32))
    items_per_s(replica, batch, 1.0)  # warm up
    print(f"{name} alone: {items_per_s(replica, batch):.0f} items/s")
    for interval in INTERVALS_S:
        sys.setswitchinterval(interval)
        stop = threading.Event()
        spins = [0]
        spinner = threading.Thread(target=spin, args=(stop, spins))
        spinner.start()
        start = time.perf_counter()
        rate = items_per_s(replica, batch)
        stop.set()
        spinner.join()
        spin_rate = spins[0] / (time.perf_counter() - start) / 1e6
        print(f"switch interval {interval * 1e3:.2f} ms: model {rate:.0f} items/s, "
              f"spinner {spin_rate:.1f} M/s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mlp")
