"""Process-wide tuning, done by the entry points (``batchserve serve`` and ``worker``) only."""

from __future__ import annotations

import gc
import sys

GIL_SWITCH_INTERVAL_S = 0.0001


def tune_for_serving() -> None:
    """Device threads release the GIL inside every torch op and must win it back from the event
    loop afterwards, waiting up to one switch interval per op. Next to a thread that holds the
    GIL, a batch of 32 of the eager MLP took 103 ms at CPython's default 5 ms, 40 at 1 ms and 29
    at 0.1 ms (24.7 alone; ``python -m bench.gil_switch``)."""
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))


def freeze_startup_objects() -> None:
    """Move everything alive once the models are warm (torch, the models, modules: ~200k
    objects) out of the collector's reach, so full collections scan only request garbage; over
    the whole heap each took 70-100 ms, stalling the event loop (docs/benchmarks.md,
    "Tried and measured, not kept")."""
    gc.collect()
    gc.freeze()
