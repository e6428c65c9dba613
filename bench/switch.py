"""``python -m bench.switch US LAUNCH_US SYNC serve ...``: batchserve with the GIL's switch
interval at US microseconds in its main process (the device process, with front ends), and at
LAUNCH_US while a device thread launches a CUDA batch and waits for it (``-`` for either: the
server's own), and with SYNC ``blocking`` its CUDA events made with ``blocking=True`` (``-``:
as the server makes them), for ``python -m bench.frontends --switch-interval-us /
--launch-switch-us / --blocking-sync``.

The device process's event loop and device threads share one GIL; a device thread that lets it
go inside a torch call waits up to one interval to win it back from a busy loop
(``python -m bench.gil_switch``). The server sets 100 us (app/process.py, which keeps a smaller
interval set before it), and 5 us for a CUDA launch and wait (``launching``; a LAUNCH_US of
100 or more turns that off): this runs it otherwise, to see on a GPU whether the waits or the
switches cost more.

A device thread waits for a batch in ``Event.synchronize``, without the GIL. With one CUDA
context and more cores than that, CUDA's default is to spin there: a core busy for as long as a
batch is in flight. A blocking event sleeps instead and is woken, later by a wake-up's time:
whether the core or the wake-up counts more on a box whose cores the front ends use is what
``blocking`` measures.
"""

from __future__ import annotations

import sys

import torch

from app import process, transfer
from app.cli import main


def blocking_event(timing: bool = False) -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=timing, blocking=True)  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    interval, launch, sync = sys.argv[1:4]
    if interval != "-":
        sys.setswitchinterval(float(interval) / 1e6)
    if launch != "-":
        process.launching.interval_s = float(launch) / 1e6
    if sync == "blocking":
        transfer._event = blocking_event  # every launch's events (app/transfer.py)
    sys.exit(main(sys.argv[4:]))
