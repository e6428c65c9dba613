"""Device threads that nap on their bell before waiting for a batch, for ``python -m
bench.frontends --napping-waits`` (bench/switch.py installs it in the device process).

With a batch in flight and nothing queued, the server's device thread waits for that batch
(``DeviceWorker._settle``, app/worker.py), asleep in CUDA's event until the device is done:
requests that arrive meanwhile wait for the whole batch, its results' split and its hand-over
before their own batch is launched (on the H200, mlp JSON at N=8: 0.25 ms in the queue and 0.25
in a batch of a 4.35 ms round trip). Here the thread first sleeps on its bell for ``NAP_SHARE``
of the batch's time as the model's cost model predicts it, less the time it has been in flight:
work that comes meanwhile wakes it and is launched behind the batch at once (the device runs it
next, on the same stream); otherwise it then waits for the batch as the server does, less of it
left. On the CPU a launch is complete at once, so nothing is ever in flight: a GPU measures it
(``CURVES=nap``, bench/gpu.sh).
"""

from __future__ import annotations

import time
from typing import Any

from app.worker import DeviceWorker

NAP_SHARE = 0.8  # of the batch's predicted time: a nap ends before the batch does
MIN_NAP_S = 50e-6  # shorter naps are not taken (Linux's timer slack for a thread is 50 us)

_settle = DeviceWorker._settle


def napping_settle(self: Any, flights: list[Any]) -> None:
    """``DeviceWorker._settle`` with a nap first, once for each batch: ``NAP_SHARE`` of what the
    model's cost model predicts for the batch, less the time it has been in flight."""
    flight = flights[0]
    if getattr(self, "_napped", None) is not flight:
        self._napped = flight
        work, _ = flight.slot.work(flight.items())
        left = (flight.slot.cost.predict(work) * NAP_SHARE
                - (time.monotonic() - flight.report.started_at))
        if left >= MIN_NAP_S:
            self.bell.sleep(left, self._idle)
            return  # work that came is launched behind it; else its wait comes next
    _settle(self, flights)


def install() -> None:
    DeviceWorker._settle = napping_settle  # type: ignore[method-assign]
