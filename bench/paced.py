"""``python -m bench.paced``: a front end (app/frontend/entry.py) whose messages to the device
process wait while it has not read the last one, for ``python -m bench.frontends
--paced-frontends`` (bench/switch.py starts each front end so).

On the GPU box the device process bounds mlp JSON past eight front ends: more front ends send
smaller messages (6.8 requests a message at N=14 against 25-31 at N=8) and its CPU a request
rises from 19-20 to 29 us (docs/frontends.md), most of it a cost per message. This is Nagle's
rule for the link: at a pass's end, if the device process still has bytes of this front end's
unread (``TIOCOUTQ`` on the link: the bytes a Unix socket holds until its peer reads them), the
message waits, taking what the next passes add, until the device process sends this front end
anything (its answers) or ``PACE_S`` has passed. A device process that keeps up has read
everything by then, so nothing waits; one that is behind gets fewer, larger messages. On the
2-core CPU box: c=64 0.93-1.05 x, c=256 0.95-1.44 x over three pairs (docs/frontends.md).
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import sys
import termios
from typing import Any

from app import links
from app.frontend import entry
from app.frontend.link import DeviceLink

PACE_S = 0.001  # the longest a message waits for the device process to read the last one

_send = links.Outbox._send
_apply = DeviceLink._apply


def unread(outbox: links.Outbox) -> bool:
    """Whether the peer has bytes of ``outbox``'s socket still to read."""
    sock = outbox._transport.get_extra_info("socket")
    if sock is None:
        return False
    count = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, count)
    return count[0] > 0


def paced_send(outbox: Any, held: bool) -> None:
    """``Outbox._send``; a pass's message (not a flush) waits while the peer has not read the
    last one, gathering what the next passes add, until the peer speaks or ``PACE_S``."""
    if not held and unread(outbox):
        outbox._due = False  # the next pass's entries ask again
        if getattr(outbox, "_pacer", None) is None:
            outbox._pacer = asyncio.get_running_loop().call_later(PACE_S, paced_out, outbox)
        return
    pacer = getattr(outbox, "_pacer", None)
    if pacer is not None:
        pacer.cancel()
        outbox._pacer = None
    _send(outbox, held)


def paced_out(outbox: Any) -> None:
    outbox._pacer = None
    _send(outbox, False)


def peer_spoke(outbox: Any) -> None:
    """The peer sent something: a waiting message goes at this pass's end if it has read."""
    if getattr(outbox, "_pacer", None) is not None and not outbox._due:
        outbox._due = True
        asyncio.get_running_loop().call_soon(outbox._pass_done, True)


def paced_apply(link: DeviceLink, message: dict[str, list[Any]]) -> None:
    _apply(link, message)
    if link._outbox is not None:
        peer_spoke(link._outbox)


def pace() -> None:
    """Every outbox of this process paced, every message read from the device process a
    prompt to send what waits."""
    links.Outbox._send = paced_send  # type: ignore[method-assign]
    DeviceLink._apply = paced_apply  # type: ignore[method-assign]


if __name__ == "__main__":
    pace()
    sys.exit(entry.main())
