"""app/bell.py: the sleep/wake handshake between a device thread and the event loop."""

from __future__ import annotations

import threading
import time

from app.bell import Bell, Mailbox
from tests.conftest import WAIT_S, wait_until_sync


def sleeper(bell: Bell, **kwargs: object) -> threading.Thread:
    thread = threading.Thread(target=bell.sleep, args=(WAIT_S, lambda: True), kwargs=kwargs)
    thread.start()
    wait_until_sync(lambda: bell.asleep, "asleep")
    return thread


def test_work_already_there_keeps_the_thread_awake() -> None:
    bell = Bell()
    bell.sleep(WAIT_S, lambda: False)  # returns at once: the last look found work
    assert not bell.asleep


def test_an_idle_thread_wants_any_item_and_a_ring_wakes_it() -> None:
    bell = Bell()
    thread = sleeper(bell)
    assert bell.wants("any model", 1)
    bell.ring()
    thread.join(WAIT_S)
    assert not thread.is_alive() and not bell.asleep and not bell.wants("any model", 1)


def test_a_filling_batch_wants_its_depth_and_any_other_models_item() -> None:
    bell = Bell()
    thread = sleeper(bell, filling="m", ring_at=8)
    assert not bell.wants("m", 7) and bell.wants("m", 8) and bell.wants("other", 1)
    bell.ring_now()
    thread.join(WAIT_S)
    assert not thread.is_alive() and not bell.wants("m", 8)  # back to idle's rule, awake


def test_rings_while_awake_do_not_cut_a_later_sleep_short() -> None:
    bell = Bell()
    for _ in range(3):
        bell.ring_now()  # a command or a stop, seen by the thread's next look at its work
    start = time.monotonic()
    bell.sleep(0.05, lambda: True)  # nothing to do: sleeps its whole time, not woken by those
    assert time.monotonic() - start >= 0.05


def test_commands_run_on_the_thread_until_it_ends_then_where_they_are_given() -> None:
    bell = Bell()
    mailbox = Mailbox(bell)
    ran: list[tuple[str, str]] = []

    def command(name: str) -> None:
        mailbox.give(lambda: ran.append((name, threading.current_thread().name)))

    command("first")
    command("second")
    assert not ran and mailbox  # waiting for the thread
    started = time.monotonic()
    bell.sleep(WAIT_S, lambda: not mailbox)  # a thread about to sleep sees them: no sleep
    assert time.monotonic() - started < WAIT_S
    worker = threading.Thread(target=mailbox.run_all, name="device")
    worker.start()
    worker.join(WAIT_S)
    assert ran == [("first", "device"), ("second", "device")] and not mailbox
    command("left")  # given before the thread ended, not yet run: the ending thread runs it
    ender = threading.Thread(target=mailbox.close, name="ending")
    ender.start()
    ender.join(WAIT_S)
    command("late")  # after: here, at once
    assert ran[2:] == [("left", "ending"), ("late", threading.current_thread().name)]

