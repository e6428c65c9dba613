"""Handlers: tensor decoding/validation, the registry's model sources, minilm correctness."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from app.errors import InvalidInput
from app.models.base import OutputCountMismatch, split_rows
from app.models.builtin import linear_module
from app.models.registry import ModelLoadError, load_handler
from app.models.tensor import TensorHandler


@pytest.fixture
def handler() -> TensorHandler:
    return load_handler("linear")  # type: ignore[return-value]


def test_linear_is_deterministic(handler: TensorHandler) -> None:
    a = handler.load(torch.device("cpu"))
    b = handler.load(torch.device("cpu"))
    x = handler.collate(handler.decode([[1, 2, 3, 4]]))
    assert torch.equal(a(x), b(x))
    assert torch.allclose(a(x), linear_module()(x))


@pytest.mark.parametrize(
    ("instance", "message"),
    [
        ([1, 2, 3], r"expected shape \[4\], got \[3\]"),
        ("text", "got a string"),
        (None, "got null"),
        (True, "got bool"),
        ({"a": 1}, "got dict"),
        ([1, 2, "x", 4], "non-numbers"),
        ([1, 2, None, 4], "ragged lists, nulls"),
        ([[1, 2], [3]], "ragged"),
        ([1, 2, 3, 1e39], "finite and within float32"),
        ([1, 2, 3, 10**400], "out of range"),
    ],
)
def test_bad_instances_are_named(handler: TensorHandler, instance: object, message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as info:
        handler.decode([[0, 0, 0, 0], instance])
    assert "instances[1]" in info.value.message


def test_deep_nesting_is_refused_not_crashed(handler: TensorHandler) -> None:
    deep: object = 1.0
    for _ in range(100):
        deep = [deep]
    with pytest.raises(InvalidInput):
        handler.decode([deep])


def test_valid_batch_decodes_to_float32_rows(handler: TensorHandler) -> None:
    items = handler.decode([[1, 2, 3, 4], [0.5, 0, 0, 0]])
    assert [i.dtype for i in items] == [np.float32, np.float32]
    assert items[1].tolist() == [0.5, 0, 0, 0]


def test_shapeless_module_batches_by_shape() -> None:
    h = TensorHandler.from_module("double", torch.nn.Identity())
    items = h.decode([[1.0, 2.0], [[1.0]], [3.0, 4.0]])
    assert h.key(items[0]) == h.key(items[2]) != h.key(items[1])
    assert h.examples() == []


def test_shape_inferred_from_example() -> None:
    module = torch.nn.Linear(3, 1)
    module.example_inputs = [[1.0, 2.0, 3.0]]  # type: ignore[assignment]
    h = TensorHandler.from_module("m", module)
    assert h.input_shape == (3,)
    with pytest.raises(InvalidInput, match="expected shape"):
        h.decode([[1.0]])


def test_split_rows_checks_the_count() -> None:
    assert len(split_rows(torch.zeros(3, 2), 3)) == 3
    assert split_rows({"a": torch.zeros(2, 1)}, 2)[1]["a"].shape == (1,)
    with pytest.raises(OutputCountMismatch):
        split_rows(torch.zeros(2, 2), 3)
    with pytest.raises(OutputCountMismatch):
        split_rows(torch.tensor(1.0), 1)


def _tiny() -> torch.nn.Module:
    m = torch.nn.Linear(3, 2)
    m.input_shape = (3,)  # type: ignore[assignment]
    return m


def test_module_callable(monkeypatch: pytest.MonkeyPatch) -> None:
    h = load_handler("tests.unit.test_models:_tiny")
    assert isinstance(h, TensorHandler) and h.input_shape == (3,) and h.name == "_tiny"
    out = h.load(torch.device("cpu"))(h.collate(h.decode([[1, 2, 3]])))
    assert out.shape == (1, 2)


def test_callable_returning_a_handler() -> None:
    h = load_handler("tests.fakes:EchoHandler", name="renamed")
    assert h.name == "renamed" and h.decode([2]) == [2.0]


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_torchscript_file(tmp_path: Path) -> None:
    path = tmp_path / "scripted.pt"
    torch.jit.script(torch.nn.Linear(4, 2)).save(str(path))
    h = load_handler(str(path))
    assert h.name == "scripted"
    x = h.collate(h.decode([[1, 2, 3, 4], [4, 3, 2, 1]]))
    assert h.load(torch.device("cpu"))(x).shape == (2, 2)


def test_exported_program_file(tmp_path: Path) -> None:
    module = torch.nn.Linear(4, 2)
    program = torch.export.export(
        module, (torch.randn(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    path = tmp_path / "exported.pt2"
    torch.export.save(program, str(path))
    h = load_handler(str(path))
    assert isinstance(h, TensorHandler) and h.input_shape == (4,)
    x = h.collate(h.decode([[1, 2, 3, 4]] * 5))
    assert torch.allclose(h.load(torch.device("cpu"))(x), module(x), atol=1e-6)


def test_exported_program_with_fixed_batch_is_refused(tmp_path: Path) -> None:
    program = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    path = tmp_path / "fixed.pt2"
    torch.export.save(program, str(path))
    with pytest.raises(ModelLoadError, match="dynamic batch"):
        load_handler(str(path))


def test_unknown_models_are_explained(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="unknown model"):
        load_handler("nonsense")
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_handler(str(tmp_path / "missing.pt"))
    with pytest.raises(ModelLoadError, match="cannot import"):
        load_handler("no_such_module_xyz:thing")
    with pytest.raises(ModelLoadError, match="not an nn.Module"):
        load_handler("tests.unit.test_models:_not_model")


def _not_model() -> int:
    return 3


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


def test_minilm_refuses_non_strings() -> None:
    from app.models.minilm import MiniLMHandler

    with pytest.raises(InvalidInput, match=r"instances\[1\]: expected a string, got int"):
        MiniLMHandler().decode(["ok", 3])


@pytest.mark.slow
def test_minilm_runs_traced_and_equals_eager(caplog: pytest.LogCaptureFixture) -> None:
    from app.models.minilm import MiniLMHandler, _MeanPooled

    handler = MiniLMHandler()
    replica = handler.load(torch.device("cpu"))
    assert "running eagerly" not in caplog.text  # the trace was exact at load
    from transformers import AutoModel

    eager = _MeanPooled(AutoModel.from_pretrained(str(handler._path))).eval()
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    texts = [" ".join(words[: i % 10]) * (1 + i % 7) for i in range(64)]
    with torch.inference_mode():
        for batch in (texts, texts[:1], texts[5:6] * 3, ["long " * 300] + texts[:3]):
            b = handler.collate(handler.decode(batch))
            want = eager(b["input_ids"], b["attention_mask"])
            assert (replica(b) - want).abs().max().item() < 1e-6
