"""The handler contract's own helpers (app/models/base.py)."""

from __future__ import annotations

import logging
import pickle

import pytest

from app.models.base import sendable
from app.models.builtin import linear_handler
from app.models.tensor import TensorHandler
from tests.fakes import EchoHandler


class Unsendable(EchoHandler):
    """A handler whose copy for the front ends holds what does not pickle (a lock)."""

    def for_frontends(self) -> EchoHandler:
        return self


def test_a_handler_that_cannot_be_sent_is_built_by_each_front_end(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "batchserve.models")
    assert sendable(Unsendable()) is None
    assert "cannot be sent to front ends (TypeError" in caplog.text
    sent = sendable(linear_handler())
    assert sent is not None and isinstance(pickle.loads(sent), TensorHandler)


def test_a_decode_is_told_only_once_its_request_is_answered() -> None:
    """``decode_abandoned`` is False outside a call made ``abandonable`` and inside one till
    its event is set; the call runs in a copy of the caller's context (a log's request id)."""
    import contextvars

    from app.models.base import abandonable, decode_abandoned

    seen = contextvars.ContextVar("seen", default="")
    seen.set("request 7")
    call, abandoned = abandonable(lambda: (decode_abandoned(), seen.get()))
    assert not decode_abandoned() and call() == (False, "request 7")
    abandoned.set()
    assert call() == (True, "request 7") and not decode_abandoned()
