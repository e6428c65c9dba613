"""Model outputs on the device side: per-item rows of tensors, and a function over them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch


class OutputCountMismatch(RuntimeError):
    """The model returned a different number of results than it was given items."""


def split_rows(outputs: Any, n: int) -> Sequence[Any]:
    """Per-item rows of a tensor, or of each tensor in a tuple/list/dict, as numpy views. A
    tensor's rows come as its numpy array: indexing it gives a row, slicing it a block of rows
    (a chunk's results, app/pending.py), with no view made per row until one is asked for.
    A tensor that is not contiguous (transposed, expanded) is copied once for the batch: rows
    that are not contiguous cannot be rendered as JSON without a copy each. bfloat16, which
    numpy lacks, comes as float32 (exactly: every bfloat16 is a float32)."""
    if isinstance(outputs, torch.Tensor):
        if outputs.dim() == 0 or outputs.shape[0] != n:
            got = "a scalar" if outputs.dim() == 0 else f"{outputs.shape[0]} rows"
            raise OutputCountMismatch(f"model returned {got} for a batch of {n}")
        if outputs.dtype == torch.bfloat16:
            outputs = outputs.float()
        # An ndarray: len, index, slice, iterate.
        return cast(Sequence[Any], outputs.contiguous().numpy())
    if isinstance(outputs, dict):
        columns = {k: split_rows(v, n) for k, v in outputs.items()}
        return [{k: col[i] for k, col in columns.items()} for i in range(n)]
    if isinstance(outputs, (tuple, list)):
        parts = [split_rows(v, n) for v in outputs]
        return [[p[i] for p in parts] for i in range(n)]
    raise OutputCountMismatch(f"model returned {type(outputs).__name__}, expected tensors")


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], obj: Any) -> Any:
    """Apply ``fn`` to every tensor in a tensor / tuple / list / dict structure."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: map_tensors(fn, v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(map_tensors(fn, v) for v in obj)
    return obj
