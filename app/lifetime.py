"""A command's process at its start and its end: the standard descriptors open before any
socket is made, and an exit that no thread left inside torch can turn into an abort. Imports
nothing of the server (app/cli.py reads its settings before torch loads)."""

from __future__ import annotations

import logging
import os
import sys
import threading


def open_standard_streams() -> None:
    """/dev/null on each of descriptors 0, 1 and 2 that is closed (a command started with
    ``<&-``, or by a supervisor that closes them), and ``sys.stdin`` and the others on them:
    else the server's first sockets take those numbers, and a line written to stderr goes to a
    socket (a front end, whose settings come on its descriptor 0, lost its listening socket
    there and was started again forever)."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            os.set_inheritable(fd, True)  # the front ends' too
            if getattr(sys, name) is None:
                setattr(sys, name, open(fd, "w" if fd else "r", closefd=False))  # noqa: SIM115


def ended(code: int) -> int:
    """A command's exit ``code``; where model code still runs on a thread (a device thread, or
    a load, build or decode the stop did not wait out: stuck, or a warm-up under way at
    SIGTERM), the process ends here with it, its logs flushed. The interpreter's finalization
    beside a thread inside torch aborts the process when that thread comes back from torch
    ("terminate called without an active exception", SIGABRT: a worker's exit in six to eight,
    a SIGTERM during a model's warm-up in most), and the orchestrator would see that instead
    of the code."""
    devices = sys.modules.get("app.devices")  # not imported (no torch): no device thread
    tasks = sys.modules.get("app.tasks")
    if (devices is not None and any(t.name.startswith(devices.THREAD_PREFIX) and t.is_alive()
                                    for t in threading.enumerate())
            or tasks is not None and tasks.calls_under_way()):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
