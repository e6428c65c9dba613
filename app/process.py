"""Process-wide tuning, done by the entry points (``batchserve serve`` and ``worker``) only."""

from __future__ import annotations

import gc
import sys

import torch
from loky import cpu_count

GIL_SWITCH_INTERVAL_S = 0.0001


def usable_cores() -> int:
    """The cores this process may use: the machine's, fewer where its CPU affinity (taskset,
    ``docker --cpuset-cpus``) or a cgroup CPU quota (``docker --cpus``, a Kubernetes CPU
    limit) allows fewer, a quota of 2.5 CPUs counting 3. ``os.cpu_count`` sees the host's."""
    return int(cpu_count(only_physical_cores=False))


def tune_for_serving() -> None:
    """Device threads release the GIL inside every torch op and must win it back from the event
    loop afterwards, waiting up to one switch interval per op. Next to a thread that holds the
    GIL, a batch of 32 of the eager MLP took 103 ms at CPython's default 5 ms, 40 at 1 ms and 29
    at 0.1 ms (24.7 alone; ``python -m bench.gil_switch``)."""
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
    # torch sizes its thread pool by the CPU affinity alone: under a CPU quota it would run
    # more threads than the quota pays for, and they would be throttled in turn. A
    # torch_threads setting is applied after this (app/runtime.py) and wins.
    torch.set_num_threads(min(torch.get_num_threads(), usable_cores()))


def freeze_startup_objects() -> None:
    """Move everything alive once the models are warm (torch, the models, modules: ~200k
    objects) out of the collector's reach, so full collections scan only request garbage; over
    the whole heap each took 70-100 ms, stalling the event loop (docs/benchmarks.md,
    "Tried and measured, not kept")."""
    gc.collect()
    gc.freeze()
