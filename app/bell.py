"""Bell: how a device thread sleeps until there is work, and how the event loop wakes it.

The one handshake between the two threads. The device thread sleeps in two ways: idle (nothing
queued for any of its models) until any item arrives, or, while a batch of one model fills, until
that model's queue reaches a depth (``ring_at``) or the wait that pays is up. The event loop asks
``wants`` after each put, and rings once per loop pass (app/served.py), so a burst of requests is
queued before the thread wakes and takes the GIL. The thread says it is asleep before it looks
at the queues a last time, so a put is either seen by that look or rings the bell.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Bell:
    __slots__ = ("_event", "_asleep", "_filling", "_ring_at")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._asleep = False
        self._filling: object = None  # the model whose batch fills while the thread sleeps
        self._ring_at = 1  # the depth of its queue that wakes the thread

    @property
    def asleep(self) -> bool:
        return self._asleep

    def wants(self, model: object, depth: int) -> bool:
        """Whether ``depth`` items queued for ``model`` should wake the thread: any item while
        it is idle, or enough to fill the batch it is waiting for (any thread)."""
        return self._asleep and (model is not self._filling or depth >= self._ring_at)

    def ring(self) -> None:
        """Wake the thread if it sleeps; a busy thread pays nothing (any thread)."""
        if self._asleep:
            self._asleep = False
            self._event.set()

    def ring_now(self) -> None:
        """Wake the thread, or keep it from its next sleep (a command, a stop)."""
        self._event.set()

    def sleep(self, seconds: float, idle: Callable[[], bool], filling: object = None,
              ring_at: int = 1) -> None:
        """Sleep up to ``seconds`` unless ``idle()``, looked at once asleep, says work came
        (device thread). ``filling``: the model whose batch waits for its queue to reach
        ``ring_at`` items; any other model's arrival wakes the thread at once."""
        self._event.clear()
        self._filling, self._ring_at = filling, ring_at
        self._asleep = True
        try:
            if idle():
                self._event.wait(seconds)
        finally:
            self._asleep = False
            self._filling, self._ring_at = None, 1
