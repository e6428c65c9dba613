"""app/text_graphs.py: a text model's batches through (rows, length) graphs give the eager
forward's results whatever their size and length; what cannot be captured, or whose padding or
rows change the results, is refused with a reason. On the CPU the graphs are stood in for by
``record_text_eager`` (each replay runs the forward on the same static inputs into the same
static output), so buckets, buffers, padding and checks are tested here; the CUDA capture
itself only where there is a GPU."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from app.graphs import NotGraphable, buckets
from app.models.base import ModelHandler, Replica, Tensors
from app.text_graphs import (
    Key,
    TextGraphedReplica,
    TextRecorded,
    batch_length,
    capture_text,
    lengths,
)
from app.transfer import DeviceExecutor
from app.warmup import warm_replica

CPU = torch.device("cpu")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class MaskedMean(torch.nn.Module):
    """Token embeddings averaged over the real tokens: padding (id 0, mask 0) changes nothing."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 4)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        weights = mask.unsqueeze(-1).float()
        return (self.embed(ids) * weights).sum(1) / weights.sum(1).clamp(min=1.0)


class MinusBatchMean(MaskedMean):
    """Each row less the batch's mean: rows that depend on each other."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows = super().forward(ids, mask)
        return rows - rows.mean(0, keepdim=True)


class Tokens(ModelHandler):
    """Token ids in, padded to each batch's longest like MiniLM (ids 0, mask 0 past the end)."""

    name = "tokens"
    max_length: int | None = 32

    def __init__(self, build: Callable[[], torch.nn.Module] = MaskedMean,
                 floats: bool = False) -> None:
        self.build = build
        self.floats = floats

    def examples(self) -> list[Any]:
        return [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]]

    def decode(self, instances: list[Any]) -> list[Any]:
        return [np.asarray(i, dtype=np.int64) for i in instances]

    def length(self, item: Any) -> int | None:
        return len(item)

    def load(self, device: torch.device) -> Replica:
        module = self.build().to(device).eval()
        return lambda batch: module(batch["input_ids"], batch["attention_mask"])

    def collate(self, items: list[Any]) -> Tensors:
        longest = max(map(len, items))
        ids = np.zeros((len(items), longest), dtype=np.int64)
        for row, item in enumerate(items):
            ids[row, :len(item)] = item
        mask = torch.from_numpy((ids > 0).astype(np.int64))
        return {"input_ids": torch.from_numpy(ids), "attention_mask": mask.float() if self.floats
                else mask}


def record_text_eager(replica: Replica, dtypes: dict[str, torch.dtype], keys: list[Key],
                      device: torch.device) -> dict[Key, TextRecorded]:
    """A stand-in for CUDA graphs: fixed inputs in, a fixed output tensor out."""
    graphs: dict[Key, TextRecorded] = {}
    for rows, length in keys:
        inputs = {name: torch.zeros((rows, length), dtype=dtype, device=device)
                  for name, dtype in dtypes.items()}
        output = replica(inputs)
        output = output.clone() if isinstance(output, torch.Tensor) else output

        def replay(inputs: dict[str, torch.Tensor] = inputs, output: torch.Tensor = output
                   ) -> None:
            output.copy_(replica(inputs))

        graphs[rows, length] = (replay, inputs, output)
    return graphs


def graphed(handler: Tokens, limit: int = 8) -> TextGraphedReplica:
    replica = handler.load(CPU)
    with torch.inference_mode():
        return capture_text(handler, replica, CPU, limit, handler.decode(handler.examples()),
                            record_text_eager)


def sentences(n: int, length: int, seed: int = 0) -> list[np.ndarray]:
    """``n`` token arrays of 1 to ``length`` ids (one of exactly ``length``)."""
    rng = np.random.default_rng(seed)
    sizes = [length, *rng.integers(1, length + 1, n - 1)]
    return [rng.integers(1, 50, size).astype(np.int64) for size in sizes]


def eager(handler: Tokens, items: list[np.ndarray]) -> np.ndarray:
    """Each item through the eager forward on its own, unpadded."""
    replica = handler.load(CPU)
    with torch.inference_mode():
        return np.stack([replica(handler.collate([item]))[0].numpy() for item in items])


def test_lengths_are_the_buckets_from_16_then_the_longest() -> None:
    assert lengths(256) == [16, 24, 32, 48, 64, 96, 128, 192, 256]
    assert lengths(40) == [16, 24, 32, 40]
    assert lengths(20) == [16, 20]
    assert lengths(16) == [16]
    assert lengths(8) == [8]


def test_a_batch_is_text_when_it_holds_integer_tensors_of_one_shape() -> None:
    ids = torch.zeros((3, 7), dtype=torch.int64)
    assert batch_length({"input_ids": ids, "attention_mask": ids}) == 7
    assert batch_length({"input_ids": ids, "attention_mask": ids.float()}) is None
    assert batch_length({"input_ids": ids, "attention_mask": ids[:, :5]}) is None
    assert batch_length(ids) is None and batch_length({}) is None


def test_each_rows_and_length_bucket_is_captured() -> None:
    replica = graphed(Tokens())
    assert replica.sizes == buckets(8) and replica.lengths == [16, 24, 32]
    assert replica.bucket(3, 17) == (4, 24) and replica.bucket(3, 25) == (4, 32)
    assert replica.bucket(1, 1) == (1, 16)
    assert replica.bucket(9, 5) is None and replica.bucket(2, 33) is None


@pytest.mark.parametrize(("n", "length"), [(1, 1), (3, 17), (8, 32), (5, 16), (9, 4)])
def test_batches_through_the_graphs_match_each_item_alone(n: int, length: int) -> None:
    """Any rows and length (9 rows: above every bucket, eagerly), padded in their bucket with
    zeros past their rows and tokens, give each item's eager result; two in flight at once."""
    handler = Tokens()
    replica = graphed(handler)
    executor = DeviceExecutor(CPU)
    first, second = sentences(n, length, seed=1), sentences(n, length, seed=2)
    launches = [executor.launch(handler, replica, items) for items in (first, second)]
    assert all((launch.graph is not None) == (n <= 8) for launch in launches)
    for launch, items in zip(launches, (first, second), strict=True):
        results, _ = launch.wait()
        assert launch.graph is None
        np.testing.assert_allclose(np.stack(results), eager(handler, items), rtol=1e-5,
                                   atol=1e-6)
    assert replica.take() is not None  # the buffers are free again


def test_a_short_batch_after_a_long_one_sees_none_of_its_tokens() -> None:
    """The same bucket and buffers, a batch of 15 tokens and then one of 3: the second's
    rows and tokens past its own are zeros again, not the first's."""
    handler = Tokens()
    replica = graphed(handler)
    executor = DeviceExecutor(CPU)
    for items in (sentences(4, 15, seed=3), sentences(3, 3, seed=4)):
        launch = executor.launch(handler, replica, items)
        assert launch.graph is not None
        results, _ = launch.wait()
        np.testing.assert_allclose(np.stack(results), eager(handler, items), rtol=1e-5,
                                   atol=1e-6)


@pytest.mark.parametrize(("handler", "reason"), [
    (Tokens(MinusBatchMean), "differ with other rows"),
    (Tokens(floats=True), "integer tensors of"),
])
def test_a_model_the_graphs_would_change_is_refused(handler: Tokens, reason: str) -> None:
    with pytest.raises(NotGraphable, match=reason):
        graphed(handler)


def test_a_model_without_a_longest_input_is_refused() -> None:
    handler = Tokens()
    handler.max_length = None
    with pytest.raises(NotGraphable, match="max_length"):
        graphed(handler)


def test_a_forward_that_gives_no_tensor_a_row_is_refused() -> None:
    class Pair(MaskedMean):
        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> Any:
            rows = super().forward(ids, mask)
            return rows, rows

    with pytest.raises(NotGraphable, match="one tensor"):
        graphed(Tokens(Pair))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("graphs", [True, "auto"])
def test_minilm_on_cuda_as_graphs_matches_eager(
        graphs: bool | str, caplog: pytest.LogCaptureFixture) -> None:
    """MiniLM's (rows, length) graphs give the eager forward's embeddings, for batches of
    several lengths, asked for and under the default (auto)."""
    from app.models.minilm import MiniLMHandler

    handler = MiniLMHandler()
    device = torch.device("cuda", 0)
    with caplog.at_level(logging.INFO, logger="batchserve.warmup"):
        warm = warm_replica(handler, device, 16, DeviceExecutor(device), graphs=graphs)
    assert isinstance(warm.replica, TextGraphedReplica)
    assert "captured as CUDA graphs" in caplog.text
    texts = ["Hi.", "A man is eating food.", "Dynamic batching " * 12]
    items = handler.decode(texts)
    results, _ = DeviceExecutor(device).launch(handler, warm.replica, items).wait()
    plain = handler.load(device)
    with torch.inference_mode():
        want = np.stack([plain({k: v.to(device) for k, v in handler.collate([i]).items()})
                         .cpu().numpy()[0] for i in items])
    np.testing.assert_allclose(np.stack(results), want, rtol=1e-3, atol=1e-4)


def test_minilm_qualifies_and_its_padding_changes_nothing() -> None:
    """MiniLM through the stand-in graphs: its batches padded to their bucket (rows and
    tokens of zeros) give each sentence's embedding alone, so on a GPU its capture's check
    has only the kernels' differences to allow for."""
    from app.models.minilm import MiniLMHandler

    handler = MiniLMHandler()
    replica = handler.load(CPU)
    with torch.inference_mode():
        graphs = capture_text(handler, replica, CPU, 4, handler.decode(handler.examples()),
                              record_text_eager)
    assert graphs.sizes == [1, 2, 4] and graphs.lengths == lengths(256)
    items = handler.decode(["Hi.", "A man is eating food.", "Dynamic batching " * 12])
    results, _ = DeviceExecutor(CPU).launch(handler, graphs, items).wait()
    with torch.inference_mode():
        want = np.stack([replica(handler.collate([i]))[0].numpy() for i in items])
    np.testing.assert_allclose(np.stack(results), want, rtol=1e-4, atol=1e-5)
