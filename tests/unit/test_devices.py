"""Resolving the devices setting; telling a broken device from a failed call."""

from __future__ import annotations

import pytest
import torch

from app.devices import device_fault, resolve_devices
from app.errors import ConfigError


def test_device_names() -> None:
    assert resolve_devices("cpu,cpu") == [torch.device("cpu")] * 2
    if not torch.cuda.is_available():
        assert resolve_devices("auto") == [torch.device("cpu")]
        with pytest.raises(ConfigError, match="no such CUDA device"):
            resolve_devices("cuda:0")
    with pytest.raises(ConfigError):
        resolve_devices("tpu")


def test_a_device_fault_is_a_cuda_context_that_fails_a_synchronize(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert device_fault(torch.device("cpu")) is None  # the CPU keeps no error state

    def poisoned(device: torch.device) -> None:
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered\n"
                                     "Compile with `TORCH_USE_CUDA_DSA` to enable ...")

    monkeypatch.setattr(torch.cuda, "synchronize", poisoned)
    assert device_fault(torch.device("cuda", 0)) == (
        "CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device: None)
    assert device_fault(torch.device("cuda", 0)) is None  # the call's own error: it works on

