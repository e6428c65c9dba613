"""all-MiniLM-L6-v2's model on a device: the encoder, mean pooling, L2 normalisation, traced.

The handler (app/models/minilm.py) tokenizes; this is the device process's part of it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import cast

import torch

from app.models.base import Replica, Tensors
from app.models.outputs import map_tensors

log = logging.getLogger("batchserve.models")


class MeanPooled(torch.nn.Module):
    """Encoder -> mean pooling over real tokens -> L2 normalisation (two tensors in)."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, return_dict=False
        )[0]
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)


def replica(path: Path, device: torch.device, example: Tensors) -> Replica:
    """The model in ``path`` on ``device``, traced on ``example`` (a collated batch)."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    # No progress bar on stderr, and transformers' messages through our log handlers (so
    # --log-format json stays one JSON object per line).
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()

    encoder = AutoModel.from_pretrained(str(path), local_files_only=True)
    # Serving computes no loss. Tracing reads every attribute, and transformers warns at
    # startup that the (unset) training loss will be a causal-LM one unless it has a value.
    encoder.loss_function = None
    # float32 whatever the weights are stored as: transformers 5 loads them in their own
    # dtype, and the server's contract is FP32 (OUTPUT0).
    model = MeanPooled(encoder).to(device=device, dtype=torch.float32).eval()
    with torch.inference_mode():
        forward = _traced(model, map_tensors(lambda t: t.to(device), example))

    def run(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return forward(batch["input_ids"], batch["attention_mask"])

    return run


def _traced(model: MeanPooled, example: dict[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The model as a TorchScript trace, or the model itself if the trace is not exact.

    A traced forward runs its ops without going back to Python (and the GIL) between them, so
    the device thread does not wait on the event loop for every op: offline as fast as eager,
    next to a busy Python thread ~35 % faster (docs/benchmarks.md, "minilm"). The example
    is padded, so the trace keeps the attention mask; the trace must match eager within 1e-6.
    """
    args = (example["input_ids"], example["attention_mask"])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TracerWarnings, and torch.jit's deprecation
            traced = torch.jit.trace(model, args, check_trace=False)  # type: ignore[no-untyped-call]
        error = float((traced(*args) - model(*args)).abs().max())
    except Exception as exc:  # noqa: BLE001 - the eager model always works
        log.warning("minilm: tracing failed (%s); running eagerly", str(exc))
        return model
    if error > 1e-6:
        log.warning("minilm: trace differs from eager by %.2e; running eagerly", error)
        return model
    return cast(Callable[..., torch.Tensor], traced)
