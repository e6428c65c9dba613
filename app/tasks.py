"""Background tasks started and left to run, each kept referenced until it is done (the event
loop keeps only a weak reference to a task, which could otherwise be collected mid-run); a
thread for calls that may never return; and a future's resolver for a callback from another
thread."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Background:
    """The tasks one owner started and that still run; a task that fails is logged in one line
    on ``log`` (asyncio would print its traceback when the task is collected)."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._running: set[asyncio.Task[Any]] = set()

    def start(self, coroutine: Coroutine[Any, Any, Any], what: str,
              failed: Callable[[], object] | None = None) -> None:
        """Run ``coroutine`` as a task on the running loop; ``what`` names it in the log, and
        ``failed`` is called if it raises."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._running.add(task)
        task.add_done_callback(functools.partial(self._ended, what, failed))

    def _ended(self, what: str, failed: Callable[[], object] | None,
               task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            self._log.error("%s failed: %s: %s", what, type(exc).__name__, exc)
            if failed is not None:
                failed()

    async def wait(self) -> None:
        """Until the tasks running now have ended; the first error of one is raised."""
        await asyncio.gather(*self._running)


class DaemonThread:
    """Runs calls one at a time, in order, on one thread of its own that the process does not
    wait for at exit: a model's code that never returns (its weights on a file system that
    hangs) cannot keep a stopped server from exiting, as a ThreadPoolExecutor's thread would
    (the interpreter joins those at exit, and ``asyncio.run`` its default executor's)."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.AbstractEventLoop,
                                             asyncio.Future[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread (in the caller's context: its log lines keep the request
        id); cancelling the wait leaves the call to run on, its outcome dropped."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        self._calls.put((call, loop, future))
        return await future

    def close(self) -> None:
        """The thread ends once the call it runs returns; calls queued after it never run."""
        self._calls.put(None)

    async def ended(self, limit_s: float) -> bool:
        """Whether the thread has ended (after ``close``) within ``limit_s``. A process should
        not exit while one that ran torch is ending: its thread-local state going beside the
        interpreter's finalization can abort the process ("terminate called without an active
        exception"). One stuck in a call is left to the exit."""
        await asyncio.to_thread(self._thread.join, limit_s)
        return not self._thread.is_alive()

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            _run(*item)
            del item  # nothing of a call is held while the thread waits for the next


def _run(call: Callable[[], Any], loop: asyncio.AbstractEventLoop,
         future: asyncio.Future[Any]) -> None:
    try:
        outcome = functools.partial(_settle, future, call(), None)
    except BaseException as exc:  # noqa: BLE001 - the caller's to see
        outcome = functools.partial(_settle, future, None, exc)
    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
        loop.call_soon_threadsafe(outcome)


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():  # the wait was cancelled
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


async def unless(work: Coroutine[Any, Any, None], stop: Callable[[], bool],
                 poll_s: float) -> bool:
    """Run ``work`` as a task: True once it has ended (raising its error), False if ``stop()``
    came true first (checked at once, then every ``poll_s``): it is cancelled then."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            if stop():
                return False
            await asyncio.wait({task}, timeout=poll_s)
    finally:
        task.cancel()
    task.result()
    return True


def resolver(future: asyncio.Future[None]) -> Callable[[], None]:
    """A callback (on the loop) that resolves ``future`` unless it is done: cancelled, as an
    awaiting ``gather`` cancels it."""
    def resolve() -> None:
        if not future.done():
            future.set_result(None)

    return resolve
