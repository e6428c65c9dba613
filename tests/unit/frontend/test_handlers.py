"""The handler a front end decodes with (app/frontend/handlers.py): the one sent where it can
be read, else one built from the model setting (on one torch thread), else none."""

from __future__ import annotations

import pytest
import torch

from app.config import BatchSettings
from app.frontend import handlers
from app.models.base import ModelHandler, sendable
from app.models.registry import load_handler
from app.models.tensor import TensorHandler
from app.snapshot import ModelEntry
from tests.fakes import EchoHandler


def entry(spec: str, handler: bytes | None) -> ModelEntry:
    return ModelEntry("m", "1", spec, BatchSettings(), "ready", None, handler)


def test_a_front_end_builds_a_handler_only_where_none_was_sent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[str] = []

    def build(spec: str, name: str | None = None) -> ModelHandler:
        built.append(spec)
        return load_handler(spec, name)

    monkeypatch.setattr(handlers, "load_handler", build)
    sent = handlers.handler_for(entry("linear", sendable(load_handler("linear"))))
    assert isinstance(sent, TensorHandler) and sent.input_shape == (4,)
    assert built == []
    # a handler that cannot be read here (its class gone): built from the setting instead
    assert isinstance(handlers.handler_for(entry("linear", b"not a pickle")), TensorHandler)
    assert built == ["linear"]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # tests.fakes imports torch: a front end that builds its handler computes on one thread
        assert isinstance(handlers.handler_for(entry("tests.fakes:EchoHandler", None)), EchoHandler)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert handlers.handler_for(entry("tests.fakes:raising_factory", None)) is None  # logged
    assert built == ["linear", "tests.fakes:EchoHandler", "tests.fakes:raising_factory"]
