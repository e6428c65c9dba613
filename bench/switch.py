"""``python -m bench.switch US LAUNCH_US SYNC WRITES serve ...``: batchserve with the
GIL's switch interval at US microseconds in its main process (the device process, with front
ends), and at LAUNCH_US while a device thread launches a CUDA batch and waits for it (``-`` for
either: the server's own), with SYNC ``spinning`` its CUDA events made without ``blocking=True``
(``-``: as the server makes them, blocking) or ``napping`` its device threads napping on their
bell before a batch's wait (bench/nap.py), with WRITES ``gil-free`` its messages to the front
ends written by ``os.writev``, which lets the GIL go during the system call (``-``: uvloop's
write, which holds it), for ``python -m bench.frontends --switch-interval-us /
--launch-switch-us / --spinning-sync / --napping-waits / --gil-free-writes``.

The device process's event loop and device threads share one GIL; a device thread that lets it
go inside a torch call waits up to one interval to win it back from a busy loop
(``python -m bench.gil_switch``). The server sets 100 us (app/process.py, which keeps a smaller
interval set before it), and 5 us for a CUDA launch and wait (``launching``; a LAUNCH_US of
100 or more turns that off): this runs it otherwise, to see on a GPU whether the waits or the
switches cost more.

A device thread waits for a batch in ``Event.synchronize``, without the GIL. The server's
events are blocking: the thread sleeps and is woken, later by a wake-up's time. With one CUDA
context and more cores than that, CUDA's default is to spin there instead: a core busy for as
long as a batch is in flight. Whether the core or the wake-up counts more on a box whose cores
the front ends use is what ``spinning`` measures.

A write to a front end asleep in ``epoll`` wakes it, 5-20 us of kernel time on the CPU box,
through which uvloop holds the GIL: in ``bench.device --profile`` a quarter of the device
process's GIL samples. Written with ``os.writev`` the loop held the GIL 0.68 x as long a request
there, but had to win it back after each write, and the requests a second at c=256 moved by
0.74-1.22 x, minilm's items by 0.93-0.98 x (docs/benchmarks.md): ``gil-free`` asks a GPU box,
where the device thread's share of the GIL differs, which counts more.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

from app import links, process, transfer
from app.cli import main
from bench import nap


def spinning_event(timing: bool = False) -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]


IOV_MAX = os.sysconf("SC_IOV_MAX")  # the most buffers one ``os.writev`` takes


def gil_free_write(outbox: links.Outbox, parts: list[Any]) -> None:
    """``Outbox._write`` with ``os.writev`` while the transport holds nothing unsent (the GIL
    let go during the call); what the socket does not take, or a broken link, goes through
    the transport, in order."""
    transport = outbox._transport
    sock = transport.get_extra_info("socket")
    if sock is None or transport.get_write_buffer_size() or len(parts) > IOV_MAX:
        transport.writelines(parts)
        return
    try:
        sent = os.writev(sock.fileno(), parts)
    except (BlockingIOError, InterruptedError):
        sent = 0
    except OSError:  # the link is broken: the transport finds it and says so its own way
        transport.writelines(parts)
        return
    for at, part in enumerate(parts):
        size = memoryview(part).nbytes
        if sent < size:
            transport.writelines([memoryview(part)[sent:], *parts[at + 1:]])
            return
        sent -= size


if __name__ == "__main__":
    interval, launch, sync, writes = sys.argv[1:5]
    if interval != "-":
        sys.setswitchinterval(float(interval) / 1e6)
    if launch != "-":
        process.launching.interval_s = float(launch) / 1e6
    if sync == "spinning":
        transfer._event = spinning_event  # every launch's events (app/transfer.py)
    if sync == "napping":
        nap.install()
    if writes == "gil-free":
        links.Outbox._write = gil_free_write  # type: ignore[method-assign]
    sys.exit(main(sys.argv[5:]))
