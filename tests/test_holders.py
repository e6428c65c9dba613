"""holders: the chains that keep an object alive, for a test's failure message."""

from __future__ import annotations

import logging

from tests.holders import holders


class Replica:
    pass


def test_a_log_record_holding_an_error_is_named_with_the_frame_that_held_the_object() -> None:
    kept: list[logging.LogRecord] = []

    def fail(replica: Replica) -> None:
        raise ValueError("no")

    def load() -> None:
        replica = Replica()
        try:
            fail(replica)
        except ValueError as exc:
            kept.append(logging.LogRecord("x", logging.INFO, __file__, 1, "%s", (exc,), None))

    load()
    held = kept[0].args[0].__traceback__.tb_next.tb_frame.f_locals["replica"]  # type: ignore
    text = holders(held)
    assert text.startswith("Replica is still held:\n")
    assert "LogRecord -> " in text and "ValueError -> traceback -> frame load (" in text
    assert text.endswith(") [replica] -> Replica")  # the frame's local that holds it
    kept.clear()
    assert holders(held).startswith(  # only this frame's argument holds it
        "Replica is still held:\nby nothing the collector sees")
