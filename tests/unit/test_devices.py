"""Resolving the devices setting."""

from __future__ import annotations

import pytest
import torch

from app.devices import resolve_devices
from app.errors import ConfigError


def test_device_names() -> None:
    assert resolve_devices("cpu,cpu") == [torch.device("cpu")] * 2
    if not torch.cuda.is_available():
        assert resolve_devices("auto") == [torch.device("cpu")]
        with pytest.raises(ConfigError, match="no such CUDA device"):
            resolve_devices("cuda:0")
    with pytest.raises(ConfigError):
        resolve_devices("tpu")
