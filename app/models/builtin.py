"""Small built-in tensor models: ``linear`` (the demo) and ``mlp`` (the benchmark workload)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.models.tensor import TensorHandler

if TYPE_CHECKING:
    import torch


def linear_module() -> torch.nn.Module:
    """``nn.Linear(4, 2)`` with weights from a fixed seed, so every replica and run agree."""
    return mlp_module((4, 2))


def mlp_module(sizes: tuple[int, ...] = (512, 4096, 4096, 16)) -> torch.nn.Module:
    """Linear layers with ReLU between them, weights from a fixed seed.

    The default, 512-4096-4096-16 float32 (~19 M parameters), is the memory-bound benchmark model.
    """
    import torch  # built on the device side only; front ends decode without torch

    gen = torch.Generator().manual_seed(0)
    layers: list[torch.nn.Module] = []
    for a, b in zip(sizes, sizes[1:], strict=False):
        layer = torch.nn.Linear(a, b)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(b, a, generator=gen) / a**0.5)
            layer.bias.copy_(torch.randn(b, generator=gen) * 0.1)
        layers += [layer, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1]) if len(layers) > 2 else layers[0]


def linear_handler() -> TensorHandler:
    return TensorHandler(
        "linear", lambda d: linear_module().to(d).eval(), (4,), examples=[[1.0, 2.0, 3.0, 4.0]],
        output_shape=(2,),
    )


def mlp_handler() -> TensorHandler:
    return TensorHandler("mlp", lambda d: mlp_module().to(d).eval(), (512,), output_shape=(16,))
