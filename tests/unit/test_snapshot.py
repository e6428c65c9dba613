"""What the device process sends its front ends of the repository (app/snapshot.py)."""

from __future__ import annotations

import pickle

import pytest

from app.models.builtin import linear_handler
from app.models.tensor import TensorHandler
from app.snapshot import snapshot
from tests.fakes import EchoHandler
from tests.unit.test_runtime import running


@pytest.mark.asyncio
async def test_a_tensor_model_comes_with_its_handler_and_snapshots_are_alike_till_a_change(
        ) -> None:
    """The bridge sends a snapshot again when it differs from the last one sent (every 0.1 s
    it compares): each carries the one copy of the handler made when the model was."""
    async with running(linear_handler()) as service:
        first, second = snapshot(service), snapshot(service)
        sent = first.served["linear"]["1"].handler
        assert sent is not None and isinstance(pickle.loads(sent), TensorHandler)
        assert first == second


@pytest.mark.asyncio
async def test_a_handler_of_its_own_is_built_by_each_front_end() -> None:
    async with running(EchoHandler()) as service:
        assert snapshot(service).served["echo"]["1"].handler is None
