"""app/tasks.py: background tasks kept until done, threads for calls that may never return."""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import threading
import weakref

import pytest

from app.tasks import Background, DaemonPool, Shared, resolver, unless
from tests.conftest import ROOT, WAIT_S, wait_until

LOG = logging.getLogger("batchserve.test")


def held(entered: threading.Event, gate: threading.Event) -> bool:
    """A pool's call that says it runs, then holds its thread until ``gate`` is set."""
    entered.set()
    return gate.wait()


@pytest.mark.asyncio
async def test_wait_returns_once_every_started_task_has_ended() -> None:
    background = Background(LOG)
    gate = asyncio.Event()
    ran: list[int] = []

    async def job(n: int) -> None:
        await gate.wait()
        ran.append(n)

    for n in range(3):
        background.start(job(n), f"job {n}", failed=lambda: ran.append(-1))
    await asyncio.sleep(0)
    assert ran == []
    gate.set()
    await background.wait()
    assert sorted(ran) == [0, 1, 2]
    await background.wait()  # nothing left: returns at once


@pytest.mark.asyncio
async def test_a_tasks_error_is_logged_in_one_line_and_raised_by_wait(
        caplog: pytest.LogCaptureFixture) -> None:
    background = Background(LOG)
    told: list[str] = []

    async def fails() -> None:
        raise ValueError("boom")

    with caplog.at_level(logging.ERROR, LOG.name):
        background.start(fails(), "the fuse", failed=lambda: told.append("failed"))
        with pytest.raises(ValueError, match="boom"):
            await background.wait()
    assert [r.getMessage() for r in caplog.records] == ["the fuse failed: ValueError: boom"]
    assert told == ["failed"]


@pytest.mark.asyncio
async def test_a_resolver_resolves_its_future_once_unless_it_was_cancelled() -> None:
    loop = asyncio.get_running_loop()
    future, cancelled = loop.create_future(), loop.create_future()
    resolve = resolver(future)
    resolve()
    resolve()  # a second call changes nothing
    assert future.result() is None
    cancelled.cancel()
    resolver(cancelled)()  # no InvalidStateError
    assert cancelled.cancelled()


@pytest.mark.asyncio
async def test_a_daemon_pool_of_one_runs_calls_in_order_and_gives_back_results_and_errors() -> None:
    thread = DaemonPool("calls")
    seen: list[tuple[int, str, bool]] = []

    def record(n: int) -> int:
        current = threading.current_thread()
        seen.append((n, current.name, current.daemon))
        return n * 2

    try:
        assert await asyncio.gather(*(thread.run(record, n) for n in range(3))) == [0, 2, 4]
        assert seen == [(0, "calls", True), (1, "calls", True), (2, "calls", True)]
        with pytest.raises(ZeroDivisionError):
            await thread.run(lambda: 1 / 0)
        gate, entered = threading.Event(), threading.Event()
        waiting = asyncio.ensure_future(thread.run(held, entered, gate))
        await wait_until(entered.is_set, "the first call running on the thread")
        queued = asyncio.ensure_future(thread.run(record, 4))
        await asyncio.sleep(0.01)
        waiting.cancel()  # the wait is let go; the call runs on, its outcome dropped
        queued.cancel()  # not begun: it never runs
        await asyncio.sleep(0.01)  # the cancel reaches the pool's future a few turns later
        gate.set()
        assert await thread.run(record, 5) == 10
        assert [n for n, _, _ in seen] == [0, 1, 2, 5]
    finally:
        thread.close()


@pytest.mark.parametrize("pool", ["DaemonPool('stuck')", "ThreadPoolExecutor(1)"])
def test_a_call_that_never_returns_keeps_no_process_from_exiting(pool: str) -> None:
    """A process whose daemon pool has a thread stuck in a call exits once its event loop is
    done; a ThreadPoolExecutor's stuck thread is joined at exit: that process never ends."""
    script = ("import asyncio, threading\n"
              "from concurrent.futures import ThreadPoolExecutor\n"
              "from app.tasks import DaemonPool\n"
              "async def main():\n"
              f"    pool = {pool}\n"
              "    loop = asyncio.get_running_loop()\n"
              "    task = loop.run_in_executor(pool, threading.Event().wait)\n"
              "    await asyncio.sleep(0.1)\n"
              "    task.cancel()\n"
              "    pool.shutdown(wait=False, cancel_futures=True)\n"
              "asyncio.run(main())\n")
    hangs = pool.startswith("ThreadPoolExecutor")
    try:  # the hang is for good: a few seconds show it
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT,
                              timeout=3 if hangs else WAIT_S, check=False)
    except subprocess.TimeoutExpired:
        assert hangs
    else:
        assert not hangs and done.returncode == 0


@pytest.mark.asyncio
async def test_a_daemon_pool_runs_as_many_calls_at_once_as_it_has_threads() -> None:
    pool = DaemonPool("decode", workers=3)
    loop = asyncio.get_running_loop()
    gate, names = threading.Barrier(3, timeout=WAIT_S), set()

    def meet() -> bool:
        names.add(threading.current_thread().name)
        gate.wait()  # only three calls on three threads at once pass
        return threading.current_thread().daemon

    try:
        assert await asyncio.gather(*(loop.run_in_executor(pool, meet) for _ in range(3))) \
            == [True] * 3
        assert names == {"decode_0", "decode_1", "decode_2"}
    finally:
        pool.close()
    assert await pool.ended()
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(meet)


@pytest.mark.asyncio
async def test_closing_with_cancel_calls_cancels_the_queued_and_leaves_the_running() -> None:
    pool, gate = DaemonPool("decode"), threading.Event()
    running = pool.submit(gate.wait)
    await wait_until(running.running, "the first call begun")
    queued = pool.submit(lambda: "never")
    pool.close(cancel_calls=True)
    assert queued.cancelled() and not running.done()
    gate.set()
    assert running.result(WAIT_S) is True
    assert await pool.ended()


@pytest.mark.asyncio
async def test_a_daemon_thread_holds_nothing_of_a_call_once_it_is_answered() -> None:
    """Neither a call's arguments nor its error (whose traceback holds them) are kept while
    the thread waits for the next call: an unloaded model's objects are let go."""
    class Weights:
        pass

    def fail(weights: Weights) -> None:
        raise RuntimeError("device memory is gone")

    thread = DaemonPool("calls")
    try:
        weights = Weights()
        held = weakref.ref(weights)
        with pytest.raises(RuntimeError):
            await thread.run(fail, weights)
        del weights

        def freed() -> bool:
            gc.collect()
            return held() is None

        await wait_until(freed, "the call's arguments let go")  # the thread may still be in it
    finally:
        thread.close()


@pytest.mark.asyncio
async def test_a_closed_daemon_thread_ends_unless_a_call_holds_it() -> None:
    idle, stuck = DaemonPool("idle"), DaemonPool("stuck")
    gate, entered = threading.Event(), threading.Event()
    waiting = asyncio.ensure_future(stuck.run(held, entered, gate))
    await wait_until(entered.is_set, "the call holding the thread running")
    for thread in (idle, stuck):
        thread.close()
    assert await idle.ended(WAIT_S)
    assert not await stuck.ended(0.05)  # left to the exit
    gate.set()
    assert await waiting is True and await stuck.ended(WAIT_S)


@pytest.mark.asyncio
async def test_unless_runs_work_to_its_end_or_abandons_it_once_told() -> None:
    done: list[str] = []

    async def work(what: str, gate: asyncio.Event | None = None) -> None:
        if gate is not None:
            await gate.wait()
        if what == "fail":
            raise ValueError(what)
        done.append(what)

    assert await unless(work("ends"), lambda: False, 0.01)
    with pytest.raises(ValueError, match="fail"):
        await unless(work("fail"), lambda: False, 0.01)
    told = {"stop": False}
    gate = asyncio.Event()
    waiting = asyncio.ensure_future(unless(work("held", gate), lambda: told["stop"], 0.01))
    await asyncio.sleep(0.05)
    told["stop"] = True
    assert await waiting is False
    gate.set()
    await asyncio.sleep(0.01)
    assert done == ["ends"]  # the abandoned work was cancelled, not finished


@pytest.mark.asyncio
async def test_calls_of_one_key_on_their_way_share_one_outcome_and_a_later_one_makes_its_own(
) -> None:
    shared, gate, made = Shared(), asyncio.Event(), []

    async def call(outcome: object) -> object:
        made.append(outcome)
        await gate.wait()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    first = [asyncio.ensure_future(shared("a", lambda: call(1))) for _ in range(3)]
    other = asyncio.ensure_future(shared("b", lambda: call(2)))
    leaving = asyncio.ensure_future(shared("a", lambda: call(3)))
    await asyncio.sleep(0)
    leaving.cancel()  # its caller went away: the call goes on for the others
    gate.set()
    assert await asyncio.gather(*first, other) == [1, 1, 1, 2]
    assert made == [1, 2]
    assert await shared("a", lambda: call(4)) == 4  # came after the outcome: a call of its own
    failing = [asyncio.ensure_future(shared("c", lambda: call(ValueError("no")))) for _ in "xy"]
    assert [type(r) for r in await asyncio.gather(*failing, return_exceptions=True)] == [
        ValueError, ValueError]
    assert len(made) == 4  # 1, 2, 4 and the one failure shared
