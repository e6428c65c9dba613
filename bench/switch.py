"""``python -m bench.switch US serve ...``: batchserve with the GIL's switch interval at US
microseconds in its main process (the device process, with front ends), for
``python -m bench.frontends --switch-interval-us``.

The device process's event loop and device threads share one GIL; a device thread that lets it
go inside a torch call waits up to one interval to win it back from a busy loop
(``python -m bench.gil_switch``). The server sets 100 us (app/process.py, which keeps a smaller
interval set before it): this runs it at less, to see on a GPU whether the waits or the
switches cost more.
"""

from __future__ import annotations

import sys

from app.cli import main

if __name__ == "__main__":
    sys.setswitchinterval(float(sys.argv[1]) / 1e6)
    sys.exit(main(sys.argv[2:]))
