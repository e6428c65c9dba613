"""all-MiniLM-L6-v2: equal to sentence-transformers, strings only, traced equals eager."""

from __future__ import annotations

import logging
import math
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from app.errors import InvalidInput


@pytest.mark.slow
def test_minilm_matches_sentence_transformers() -> None:
    from sentence_transformers import SentenceTransformer

    from app.models.minilm import MiniLMHandler, model_dir

    texts = [
        "Hello, world.",
        "The quick brown fox jumps over the lazy dog.",
        "",
        "Dynamic batching pads each batch only to its own longest item. " * 40,  # > 256 tokens
        "Ünïcödé and emoji 🚀 survive tokenisation",
    ]
    handler = MiniLMHandler()
    replica = handler.load(torch.device("cpu"))
    items = handler.decode(texts)
    assert max(len(i) for i in items) == 256  # truncated like sentence-transformers
    with torch.inference_mode():
        ours = torch.stack([torch.from_numpy(r) for r in handler.split(
            replica(handler.collate(items)), len(items))])
        alone = replica(handler.collate(items[:1]))  # padding does not change an item's result
    reference = SentenceTransformer(str(model_dir()), device="cpu").encode(
        texts, convert_to_tensor=True
    )
    assert ours.shape == (5, 384)
    assert (ours - reference).abs().max().item() < 1e-5
    assert (alone[0] - ours[0]).abs().max().item() < 1e-5
    assert torch.allclose(ours.norm(dim=1), torch.ones(5), atol=1e-5)
    assert not math.isnan(ours.sum().item())


@pytest.mark.slow
def test_loading_minilm_logs_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    """A server's startup on the default model says nothing alarming (transformers warned that
    the training loss, which serving never computes, defaults to a causal-LM one)."""
    from app.models.minilm import MiniLMHandler

    warning_once = getattr(logging.Logger, "warning_once", None)  # transformers adds it
    if warning_once is not None:
        warning_once.cache_clear()  # it warns once per process: earlier loads said it already
    with caplog.at_level(logging.WARNING):
        MiniLMHandler().load(torch.device("cpu"))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_minilm_refuses_non_strings() -> None:
    from app.models.minilm import MiniLMHandler

    with pytest.raises(InvalidInput, match=r"instances\[1\]: expected a string, got int"):
        MiniLMHandler().decode(["ok", 3])


def test_one_sentence_decodes_as_it_does_among_others() -> None:
    from app.models.minilm import MiniLMHandler

    handler = MiniLMHandler()
    sentences = ["Hello, world.", "x " * 400, "", "Batching turns requests into one call."]
    together = handler.decode(sentences)
    for sentence, ids in zip(sentences, together, strict=True):
        alone, = handler.decode([sentence])
        assert alone.dtype == ids.dtype and alone.tolist() == ids.tolist()


def test_only_one_short_sentence_is_tokenized_on_the_event_loop() -> None:
    """It holds the GIL either way; anything longer, or several, goes to the decode pool."""
    from app.models.minilm import INLINE_TEXT_CHARS, MiniLMHandler

    handler = MiniLMHandler()
    short, long = "x" * INLINE_TEXT_CHARS, "x" * (INLINE_TEXT_CHARS + 1)
    assert handler.decodes_inline([short]) and handler.decodes_inline(["Hello, world."])
    assert not handler.decodes_inline([long])
    assert not handler.decodes_inline(["Hello.", "World."])
    assert not handler.decodes_inline([3])  # decode names the fault, in the pool


class RecordingTokenizer:
    """A tokenizer that records the longest text it was given, and the longest given to
    ``encode``, which holds the GIL."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.longest = 0
        self.longest_held = 0

    def encode(self, text: str) -> Any:
        self.longest = max(self.longest, len(text))
        self.longest_held = max(self.longest_held, len(text))
        return self.tokenizer.encode(text)

    def encode_batch(self, texts: list[str]) -> Any:
        self.longest = max([self.longest, *map(len, texts)])
        return self.tokenizer.encode_batch(texts)


def test_a_long_text_is_tokenized_from_its_first_part_alone() -> None:
    """The model reads a text's first 256 tokens: a megabyte of words is tokenized from its
    first HEAD_CHARS characters, with the ids all of it gives; CJK text and punctuation too."""
    from app.models.minilm import HEAD_CHARS, MiniLMHandler

    handler = MiniLMHandler()
    whole = handler._tokenizer
    texts = ["Dynamic batching, at scale. " * 40_000, "中文的句子" * 1_000, "!?" * 3_000]
    handler._tokenizer = recording = RecordingTokenizer(whole)  # type: ignore[assignment]
    items = handler.decode(texts)
    assert recording.longest == HEAD_CHARS
    assert [i.tolist() for i in items] == [whole.encode(t).ids for t in texts]
    assert all(len(i) == 256 for i in items)


def test_a_text_cut_anywhere_gives_the_ids_of_all_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a head of 8 characters (so cuts fall in words, in runs of white space, between a
    letter and its accent, in CJK text, among control characters), every random text decodes
    to the ids of tokenizing it whole, many of them from a first part."""
    import app.models.minilm as minilm

    monkeypatch.setattr(minilm, "HEAD_CHARS", 8)
    cut: list[bool] = []
    first_tokens = minilm._first_tokens
    monkeypatch.setattr(minilm, "_first_tokens", lambda e: cut.append(first_tokens(e)) or cut[-1])
    handler = minilm.MiniLMHandler()
    pieces = ["word", "Hello", ",", ".", " ", "  ", "\t", "\r\n", "中", "文字", "é", "e\u0301",
              "\u0301", "\x01", "\u200b", "\u00a0", "a" * 120, "x" * 99, "ÜBER", "don't", "🚀",
              "\ufffd", "\x00", "İ", "ﬁ", "٣", "ß"]
    rng = random.Random(7)
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 600)))
        assert handler.decode([text])[0].tolist() == handler._tokenizer.encode(text).ids, text
    assert sum(cut) >= 10  # texts whose ids came from a first part


def test_a_long_text_of_few_tokens_is_tokenized_with_the_gil_let_go() -> None:
    """One endless word or a run of white space is tokenized whole up to MAX_HEAD_CHARS
    characters (about a second): by ``encode_batch``, which lets the GIL go, never by
    ``encode`` (which held it, and the event loop with it, for all of that second)."""
    from app.models.minilm import INLINE_TEXT_CHARS, MiniLMHandler

    handler = MiniLMHandler()
    whole = handler._tokenizer
    texts = ["7" * 100_000, " " * 50_000 + "last words", "ok"]
    handler._tokenizer = recording = RecordingTokenizer(whole)  # type: ignore[assignment]
    items = handler.decode(texts)
    assert recording.longest == 100_000 and recording.longest_held <= INLINE_TEXT_CHARS
    assert [i.tolist() for i in items] == [whole.encode(t).ids for t in texts]
    assert items[1].tolist() == whole.encode("last words").ids


def test_a_decode_whose_request_was_answered_stops_before_the_next_part() -> None:
    """Told its request no longer waits (``decode_abandoned``), a decode in the pool does not
    go on to tokenize a long text of few tokens whole; not told, it does."""
    from app.errors import DeadlineExceeded
    from app.models.base import abandonable
    from app.models.minilm import HEAD_CHARS, MiniLMHandler

    handler = MiniLMHandler()
    handler._tokenizer = recording = RecordingTokenizer(  # type: ignore[assignment]
        handler._tokenizer)
    texts = ["fine", "7" * 100_000]
    call, abandoned = abandonable(handler.decode, texts)
    abandoned.set()
    with pytest.raises(DeadlineExceeded):
        call()
    assert recording.longest == HEAD_CHARS
    call, _ = abandonable(handler.decode, texts)
    assert len(call()) == 2 and recording.longest == 100_000


def test_a_long_text_that_makes_no_tokens_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A text whose first MAX_HEAD_CHARS characters do not make the tokens the model reads
    (white space, one endless word) is refused, not tokenized whole; one no longer is."""
    import app.models.minilm as minilm

    monkeypatch.setattr(minilm, "HEAD_CHARS", 16)
    monkeypatch.setattr(minilm, "MAX_HEAD_CHARS", 64)
    handler = minilm.MiniLMHandler()
    for filler in (" ", "a", "\u200b"):
        with pytest.raises(InvalidInput, match=r"instances\[1\]: a text of 65 characters whose "
                                               r"first 64 make fewer than the 256 tokens"):
            handler.decode(["ok", filler * 65])
        shorter = filler * 64
        assert handler.decode(["ok", shorter])[1].tolist() == handler._tokenizer.encode(
            shorter).ids


def test_a_batch_is_padded_to_its_longest_item_and_masked() -> None:
    from app.models.minilm import MiniLMHandler

    items = [np.array([101, 7, 102]), np.array([101, 102]), np.array([101, 5, 6, 7, 102])]
    batch = MiniLMHandler().collate(items)
    assert batch["input_ids"].tolist() == [[101, 7, 102, 0, 0], [101, 102, 0, 0, 0],
                                           [101, 5, 6, 7, 102]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0],
                                                [1, 1, 1, 1, 1]]
    assert batch["input_ids"].dtype == batch["attention_mask"].dtype == torch.int64


@pytest.mark.slow
def test_minilm_runs_traced_and_equals_eager(caplog: pytest.LogCaptureFixture) -> None:
    from app.models.minilm import MiniLMHandler
    from app.models.minilm_encoder import MeanPooled

    handler = MiniLMHandler()
    replica = handler.load(torch.device("cpu"))
    assert "running eagerly" not in caplog.text  # the trace was exact at load
    from transformers import AutoModel

    eager = MeanPooled(AutoModel.from_pretrained(str(handler._path))).float().eval()
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    texts = [" ".join(words[: i % 10]) * (1 + i % 7) for i in range(64)]
    with torch.inference_mode():
        for batch in (texts, texts[:1], texts[5:6] * 3, ["long " * 300] + texts[:3]):
            b = handler.collate(handler.decode(batch))
            want = eager(b["input_ids"], b["attention_mask"])
            assert (replica(b) - want).abs().max().item() < 1e-6


@pytest.mark.slow
def test_minilm_computes_in_float32_whatever_its_weights_are_stored_as(tmp_path: Path) -> None:
    """transformers 5 loads weights in their stored dtype; the server's contract is FP32."""
    from safetensors.torch import load_file, save_file

    from app.models.minilm import MiniLMHandler, model_dir

    stored = tmp_path / "model"
    shutil.copytree(model_dir(), stored)
    weights = load_file(stored / "model.safetensors")
    save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()},
              stored / "model.safetensors", metadata={"format": "pt"})
    texts = ["Hello, world.", "Weights stored as float16."]
    outputs = []
    for handler in (MiniLMHandler(stored), MiniLMHandler()):
        with torch.inference_mode():
            outputs.append(handler.load(torch.device("cpu"))(
                handler.collate(handler.decode(texts))))
    assert outputs[0].dtype == torch.float32
    assert (outputs[0] - outputs[1]).abs().max().item() < 1e-3  # float16 rounding of weights
