"""``python -m bench.switch US LAUNCH_US serve ...``: batchserve with the GIL's switch interval
at US microseconds in its main process (the device process, with front ends), and at LAUNCH_US
while a device thread launches a CUDA batch and waits for it (``-`` for either: the server's
own), for ``python -m bench.frontends --switch-interval-us / --launch-switch-us``.

The device process's event loop and device threads share one GIL; a device thread that lets it
go inside a torch call waits up to one interval to win it back from a busy loop
(``python -m bench.gil_switch``). The server sets 100 us (app/process.py, which keeps a smaller
interval set before it), and 5 us for a CUDA launch and wait (``launching``; a LAUNCH_US of
100 or more turns that off): this runs it otherwise, to see on a GPU whether the waits or the
switches cost more.
"""

from __future__ import annotations

import sys

from app import process
from app.cli import main

if __name__ == "__main__":
    interval, launch = sys.argv[1:3]
    if interval != "-":
        sys.setswitchinterval(float(interval) / 1e6)
    if launch != "-":
        process.launching.interval_s = float(launch) / 1e6
    sys.exit(main(sys.argv[3:]))
