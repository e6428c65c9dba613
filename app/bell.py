"""Bell: how a device thread sleeps until there is work, and how the event loop wakes it.

The one handshake between the two threads. The device thread sleeps in two ways: idle (nothing
queued for any of its models) until any item arrives, or, while a batch of one model fills, until
that model's queue reaches a depth (``ring_at``) or the wait that pays is up. The event loop asks
``wants`` after each put, and rings once per loop pass (app/served.py), so a burst of requests is
queued before the thread wakes and takes the GIL. The thread says it is asleep before it looks
at the queues a last time, so a put is either seen by that look or rings the bell.

``Mailbox``: what else the event loop asks of the thread (a model attached or detached), run
by the thread between batches, or where it is given once the thread has ended.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from queue import Empty, SimpleQueue


class Bell:
    __slots__ = ("_rings", "_asleep", "_filling", "_ring_at")

    def __init__(self) -> None:
        # A ring is a token put here; the sleeping thread waits for one. A C queue, not a
        # ``threading.Event``: the event loop's ring is one C call (Event.set takes a Python
        # condition's lock and notifies: 8 % of the device process's event loop at c=256).
        self._rings: SimpleQueue[None] = SimpleQueue()
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
            self._rings.put(None)

    def ring_now(self) -> None:
        """Wake the thread asleep or not (a command, a stop): one about to sleep sees the work
        in its last look, or wakes at once."""
        self._rings.put(None)

    def sleep(self, seconds: float, idle: Callable[[], bool], filling: object = None,
              ring_at: int = 1) -> None:
        """Sleep up to ``seconds`` unless ``idle()``, looked at once asleep, says work came
        (device thread). ``filling``: the model whose batch waits for its queue to reach
        ``ring_at`` items; any other model's arrival wakes the thread at once."""
        while not self._rings.empty():  # rings before this sleep: ``idle()`` sees their work
            self._rings.get_nowait()
        self._filling, self._ring_at = filling, ring_at
        self._asleep = True
        try:
            if idle():
                with suppress(Empty):  # the time is up
                    self._rings.get(timeout=seconds)
        finally:
            self._asleep = False
            self._filling, self._ring_at = None, 1


class Mailbox:
    """Commands (calls) for one thread from any thread, rung in with its bell. Once the thread
    has ended (``close``), a command runs where it is given: nothing else will run it, and
    nothing else touches what it changes, so a model can still be detached from a dead
    thread."""

    def __init__(self, bell: Bell) -> None:
        self._bell = bell
        self._calls: deque[tuple[Callable[[], None], Callable[[], None] | None]] = deque()
        self._lock = threading.Lock()
        self._closed = False

    def __bool__(self) -> bool:
        return bool(self._calls)

    def give(self, call: Callable[[], None], then: Callable[[], None] | None = None) -> None:
        """``call`` on the thread, then ``then`` once the thread holds nothing of ``call`` (nor
        what its closure holds): whoever ``then`` tells may find that collected at once."""
        with self._lock:
            if not self._closed:
                self._calls.append((call, then))
                self._bell.ring_now()
                return
        call()
        if then is not None:
            then()

    def run_all(self) -> None:
        """The commands given so far, in order (the thread, between batches)."""
        while self._calls:
            call, then = self._calls.popleft()
            call()
            del call
            if then is not None:
                then()

    def close(self) -> None:
        """The thread ends: what was given runs now, what comes later where it is given."""
        with self._lock:
            self._closed = True
        self.run_all()

