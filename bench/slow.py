"""A model of known, flat cost for the overload benchmarks: every batch takes $SLOW_BATCH_S
seconds (default 0.05) whatever its size. It declares an example, so the server's warm-up
measures that cost and deadline-aware admission can use it."""

from __future__ import annotations

import os
import time

import torch


class FixedCost(torch.nn.Module):
    input_shape = (2,)
    example_inputs = [[1.0, 2.0]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(float(os.environ.get("SLOW_BATCH_S", "0.05")))
        return x * 2


def fixed_cost() -> torch.nn.Module:
    return FixedCost()
