"""What the device process sends its front ends of the repository (app/snapshot.py)."""

from __future__ import annotations

import pytest

from app.models.builtin import linear_handler
from app.models.tensor import TensorHandler
from app.snapshot import snapshot
from tests.fakes import EchoHandler
from tests.unit.test_runtime import running

pytestmark = pytest.mark.asyncio


async def test_a_tensor_model_comes_with_its_handler_and_a_copy_is_no_change() -> None:
    """The bridge sends a snapshot again when it differs from the last one sent: a fresh copy
    of the same handler in each is no change."""
    async with running(linear_handler()) as service:
        first, second = snapshot(service), snapshot(service)
        sent = first.served["linear"]["1"].handler
        assert isinstance(sent, TensorHandler) and sent is not second.served["linear"]["1"].handler
        assert first == second


async def test_a_handler_of_its_own_is_built_by_each_front_end() -> None:
    async with running(EchoHandler()) as service:
        assert snapshot(service).served["echo"]["1"].handler is None
