"""The request bodies a process holds while they arrive, bounded (``max_receiving_bytes``).

``max_body_bytes`` bounds one body, ``max_connections`` the connections: together, a process
could hold 1000 bodies of 16 MiB each, 16 GiB, from clients that send all of a body but its
last byte and wait (100 such connections held 1.8 GB). A body that comes in pieces takes room
here until it is whole (its Content-Length at once, or each piece as it comes without one);
where there is none, its request is refused 503 ``busy`` and the memory is never taken. One
declared past 64 KiB takes it before any of it is read (app/api/body.py), so a client that
sent ``Expect: 100-continue`` is refused before it sends the body. A long body a front end
asks the device process's app to answer keeps its room till the answer comes
(app/frontend/app.py): with 40 clients sending 16 MB bodies to /v2/repository/index, which
the device process parses slower than they come, and room for 100 MB, a front end peaked at
858 MB without that and 343 with it. A short body that comes whole in its first message
takes none: uvicorn reads at most one buffer of it a connection before the app asks for it.
"""

from __future__ import annotations

from app.config import Settings
from app.errors import ReceivingFull
from app.process import memory_bytes

# Of the memory the server may use, the share its processes' arriving bodies may take together
# by default: the model, its batches and the parsed requests need the rest.
MEMORY_SHARE = 4


def receiving_bytes(settings: Settings, processes: int = 1) -> int:
    """One process's room for arriving bodies: ``max_receiving_bytes`` where set, else a
    ``MEMORY_SHARE``-th of the memory the server may use shared by its ``processes`` that take
    HTTP requests, and never less than one body of ``max_body_bytes``."""
    if settings.max_receiving_bytes is not None:
        return settings.max_receiving_bytes
    return max(settings.max_body_bytes, memory_bytes() // MEMORY_SHARE // processes)


class Arriving:
    """The bytes of bodies still arriving in this process (event-loop thread only)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.held = 0

    def take(self, size: int) -> None:
        """Room for ``size`` more bytes, or ReceivingFull (503 busy) where there is none."""
        if self.held + size > self.most:
            raise ReceivingFull(f"request bodies still arriving hold {self.held} of the "
                                f"{self.most} bytes this server takes at once "
                                "(max_receiving_bytes); retry later")
        self.held += size

    def give_back(self, size: int) -> None:
        self.held -= size
