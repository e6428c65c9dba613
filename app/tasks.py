"""Background tasks started and left to run, each kept referenced until it is done (the event
loop keeps only a weak reference to a task, which could otherwise be collected mid-run); threads
for calls that may never return; calls asked again while on their way, shared; and a future's
resolver for a callback from another thread."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")
STOP_S = 2.0  # how long a stop waits for a pool's threads to end (one stuck in a call: no more)
# The DaemonPool threads in a call now, of every pool (``calls_under_way``).
_CALLING: set[threading.Thread] = set()


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
            self._log.error("%s failed: %s: %s", what, type(exc).__name__, str(exc))
            if failed is not None:
                failed()

    async def wait(self) -> None:
        """Until the tasks running now have ended; the first error of one is raised."""
        await asyncio.gather(*self._running)


class DaemonPool(Executor):
    """Runs calls on ``workers`` threads of its own that the process does not wait for at
    exit: model code that never returns (weights on a file system that hangs, a decode stuck
    on its input) cannot keep a stopped server from exiting, as a ThreadPoolExecutor's thread
    would (the interpreter joins those at exit, and ``asyncio.run`` its default executor's).
    One worker runs its calls in order. An ``Executor``: ``loop.run_in_executor`` takes it."""

    def __init__(self, name: str, workers: int = 1) -> None:
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = \
            queue.SimpleQueue()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._serve, name=name if workers == 1 else f"{name}_{n}",
                             daemon=True)
            for n in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if self._closed:
            raise RuntimeError(f"{self._threads[0].name}: closed, it runs no new calls")
        future: Future[T] = Future()
        self._calls.put((future, functools.partial(fn, *args, **kwargs)))
        return future

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a thread (in the caller's context: its log lines keep the request
        id); cancelling the wait cancels a call not yet begun, and leaves one under way to run
        on, its outcome dropped."""
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.wrap_future(self.submit(call))

    def close(self, cancel_calls: bool = False) -> None:
        """Each thread ends once the call it runs returns; queued calls run first, unless
        ``cancel_calls``. No new call is taken."""
        self._closed = True
        while cancel_calls:
            try:
                item = self._calls.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in self._threads:
            self._calls.put(None)

    async def stop(self, cancel_calls: bool = False) -> bool:
        """``close``, then whether every thread ended within ``STOP_S`` (``ended``)."""
        self.close(cancel_calls)
        return await self.ended()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.close(cancel_futures)
        for thread in self._threads if wait else ():
            thread.join()

    async def ended(self, limit_s: float = STOP_S) -> bool:
        """Whether every thread has ended (after ``close``) within ``limit_s``. A process
        should not exit while one that ran torch is ending: its thread-local state going beside
        the interpreter's finalization can abort the process ("terminate called without an
        active exception"). One stuck in a call is left to the exit."""
        def join() -> bool:
            until = time.monotonic() + limit_s
            for thread in self._threads:
                thread.join(max(0.0, until - time.monotonic()))
            return not any(thread.is_alive() for thread in self._threads)

        return await asyncio.to_thread(join)

    def _serve(self) -> None:
        me = threading.current_thread()
        while (item := self._calls.get()) is not None:
            future, call = item
            if future.set_running_or_notify_cancel():
                _CALLING.add(me)
                try:
                    future.set_result(call())
                except BaseException as exc:  # noqa: BLE001 - the caller's to see
                    future.set_exception(exc)
                finally:
                    _CALLING.discard(me)
            del item, future, call  # nothing of a call is held while the thread waits


def calls_under_way() -> bool:
    """Whether a thread of any ``DaemonPool`` is in a call now (a load, a build, a decode: model
    code, which may be inside torch). A process that exits meanwhile should end without the
    interpreter's finalization: a thread that comes back from torch then aborts the process
    ("terminate called without an active exception"; app/lifetime.py)."""
    return bool(_CALLING)


async def on_own_thread(name: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a daemon thread made for it (``name``): model code that may take long
    (importing a module, reading weights) or never return."""
    pool = DaemonPool(name)
    try:
        return await pool.run(fn, *args)
    finally:
        pool.close()


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


class Shared:
    """Calls of one key made while one is on its way share its outcome: a flood of them costs
    one call at a time. A call that comes once the outcome is in makes a new one (its outcome
    is always one given after the call came)."""

    def __init__(self) -> None:
        self._asked: dict[Hashable, asyncio.Future[Any]] = {}

    def __call__(self, key: Hashable, call: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        """The outcome of ``call()`` (or of the one on its way for ``key``), shielded: a caller
        that goes away leaves it to the others."""
        asked = self._asked.get(key)
        if asked is None or asked.done():
            asked = self._asked[key] = asyncio.ensure_future(call())
            asked.add_done_callback(lambda done: self._forget(key, done))
        return asyncio.shield(asked)  # which retrieves an outcome whose callers all left

    def _forget(self, key: Hashable, done: asyncio.Future[Any]) -> None:
        if self._asked.get(key) is done:
            del self._asked[key]


def resolver(future: asyncio.Future[None]) -> Callable[[], None]:
    """A callback (on the loop) that resolves ``future`` unless it is done: cancelled, as an
    awaiting ``gather`` cancels it."""
    def resolve() -> None:
        if not future.done():
            future.set_result(None)

    return resolve
