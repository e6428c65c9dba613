"""app/graphs.py: batches through captured graphs give the eager forward's results, whatever
their size, chunks and padding; what cannot be captured, or whose rows are not independent, is
refused with a reason. On the CPU the graphs are stood in for by ``record_eager`` (each replay
runs the forward on the same static rows into the same static output), so the buckets, buffers
and checks are tested here; the CUDA capture itself only where there is a GPU."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from app.graphs import (
    GraphedReplica,
    NotGraphable,
    Recorded,
    buckets,
    capture,
    fill_rows,
)
from app.models.base import Replica
from app.models.builtin import mlp_module
from app.models.tensor import TensorHandler
from app.transfer import DeviceExecutor
from app.warmup import warm_replica

CPU = torch.device("cpu")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def record_eager(replica: Replica, device_in: torch.Tensor,
                 sizes: list[int]) -> dict[int, Recorded]:
    """A stand-in for CUDA graphs: fixed rows in, a fixed output tensor out."""
    graphs: dict[int, Recorded] = {}
    for size in sizes:
        rows = device_in[:size]
        output = replica(rows).clone()

        def replay(rows: torch.Tensor = rows, output: torch.Tensor = output) -> None:
            output.copy_(replica(rows))

        graphs[size] = (replay, output)
    return graphs


def small(build: object = None) -> TensorHandler:
    return TensorHandler("small", build or (lambda d: mlp_module((8, 16, 3)).to(d).eval()),
                         (8,), output_shape=(3,))


def rows(n: int, seed: int = 0) -> list[np.ndarray]:
    return list(np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32))


def graphed(handler: TensorHandler, limit: int = 16) -> tuple[GraphedReplica, Replica]:
    replica = handler.load(CPU)
    with torch.inference_mode():
        result = capture(handler, replica, CPU, limit, handler.decode(rows(2, seed=9)),
                         record_eager)
    return result, replica


def eager(replica: Replica, data: list[np.ndarray]) -> np.ndarray:
    with torch.inference_mode():
        return replica(torch.from_numpy(np.stack(data))).numpy()


# A graph's rows against the eager forward at the batch's own size: CPU kernels differ by batch
# size in the last bits (1.5e-6 relative on an AMD EPYC); a row from another batch differs by
# far more.
SAME = {"rtol": 1e-5, "atol": 1e-6}


def test_buckets_are_powers_of_two_with_halfway_sizes_from_16_then_the_limit() -> None:
    assert buckets(1) == [1]
    assert buckets(2) == [1, 2]
    assert buckets(16) == [1, 2, 4, 8, 16]
    assert buckets(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert buckets(48) == [1, 2, 4, 8, 16, 24, 32, 48]
    assert buckets(256) == [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256]
    assert buckets(256, 16) == [16, 24, 32, 48, 64, 96, 128, 192, 256]
    sizes = buckets(4096)  # past 16 rows no batch is padded by more than half
    assert all(b <= 1.5 * n for n in range(17, 4097) for b in [min(s for s in sizes if s >= n)])


def test_fill_rows_writes_rows_and_chunks_in_order() -> None:
    data = [np.full(3, 1.0, np.float32), np.arange(6, dtype=np.float32).reshape(2, 3),
            np.full(3, 7.0, np.float32)]
    out = np.zeros((5, 3), np.float32)
    fill_rows(out[:4], data)
    np.testing.assert_array_equal(out, [[1, 1, 1], [0, 1, 2], [3, 4, 5], [7, 7, 7], [0, 0, 0]])
    scalars = np.zeros(4, np.float32)  # scalar items, and a chunk of two
    fill_rows(scalars, [np.float32(1.0), np.array([2.0, 3.0], np.float32), np.float32(4.0)])
    np.testing.assert_array_equal(scalars, [1, 2, 3, 4])
    square = np.zeros((3, 2, 2), np.float32)  # items of two dimensions, one chunk of two
    fill_rows(square, [np.ones((2, 2), np.float32), np.zeros((2, 2, 2), np.float32)])
    np.testing.assert_array_equal(square[0], np.ones((2, 2)))
    assert not square[1:].any()


@pytest.mark.parametrize("n", [1, 3, 8, 9, 16])
def test_a_batch_through_its_bucket_matches_the_eager_forward(n: int) -> None:
    handler = small()
    replica, plain = graphed(handler)
    executor = DeviceExecutor(CPU)
    data = rows(n, seed=n)
    launch = executor.launch(handler, replica, data)
    buffers = launch.graph
    assert buffers is not None and buffers.busy
    results, seconds = launch.wait()
    assert not buffers.busy and launch.graph is None  # released once
    assert seconds >= 0
    np.testing.assert_allclose(np.stack(results), eager(plain, data), **SAME)


def test_chunks_among_rows_come_back_a_row_each() -> None:
    handler = small()
    replica, plain = graphed(handler)
    data = rows(5, seed=3)
    items = [data[0], np.stack(data[1:4]), data[4]]  # a request's rows queued as one chunk
    results, _ = DeviceExecutor(CPU).launch(handler, replica, items, rows=5).wait()
    np.testing.assert_allclose(np.stack(results), eager(plain, data), **SAME)


def test_with_both_buffers_in_flight_a_third_batch_runs_eagerly() -> None:
    handler = small()
    replica, plain = graphed(handler)
    executor = DeviceExecutor(CPU)
    batches = [rows(4, seed=s) for s in range(3)]
    launches = [executor.launch(handler, replica, data) for data in batches]
    assert [launch.graph is not None for launch in launches] == [True, True, False]
    for data, launch in zip(batches, launches, strict=True):
        np.testing.assert_allclose(np.stack(launch.wait()[0]), eager(plain, data), **SAME)
    assert replica.take(1) is not None  # every pair free again


def test_a_smaller_batch_after_a_larger_one_gets_only_its_own_rows() -> None:
    handler = small()
    replica, plain = graphed(handler)
    executor = DeviceExecutor(CPU)
    for n in (8, 5, 3, 1):  # each in a bucket the one before left rows in
        data = rows(n, seed=100 + n)
        results = executor.launch(handler, replica, data).wait()[0]
        assert len(results) == n
        np.testing.assert_allclose(np.stack(results), eager(plain, data), **SAME)


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_a_model_of_scalar_items_runs_through_its_graphs() -> None:
    handler = TensorHandler("scalar", lambda d: Double(), ())
    replica = handler.load(CPU)
    with torch.inference_mode():
        graphed_replica = capture(handler, replica, CPU, 8, handler.decode([1.0, 2.0]),
                                  record_eager)
    data = handler.decode([1.5, -2.0, 3.0])
    launch = DeviceExecutor(CPU).launch(handler, graphed_replica, data)
    assert launch.graph is not None
    np.testing.assert_array_equal(np.stack(launch.wait()[0]), [3.0, -4.0, 6.0])


def test_a_batch_larger_than_every_graph_runs_eagerly() -> None:
    handler = small()
    replica, plain = graphed(handler, limit=4)
    data = rows(6)
    launch = DeviceExecutor(CPU).launch(handler, replica, data)
    assert launch.graph is None
    np.testing.assert_allclose(np.stack(launch.wait()[0]), eager(plain, data), **SAME)


def test_the_buffers_are_free_again_when_the_split_fails() -> None:
    class Short(TensorHandler):
        def split(self, outputs: object, n: int) -> list[object]:
            return []

    handler = Short("short", lambda d: mlp_module((8, 3)).to(d).eval(), (8,))
    replica, _ = graphed(handler)
    launch = DeviceExecutor(CPU).launch(handler, replica, rows(2))
    buffers = launch.graph
    with pytest.raises(RuntimeError):
        launch.wait()
    assert buffers is not None and not buffers.busy


class MinusMean(torch.nn.Module):
    """Each row less the batch's mean: rows that depend on each other."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=0, keepdim=True)


class Pair(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x


@pytest.mark.parametrize(("build", "reason"), [
    (lambda d: MinusMean(), "differ with other rows"),
    (lambda d: Pair(), "one tensor with a row per item"),
])
def test_a_model_the_graphs_would_change_is_refused(build: object, reason: str) -> None:
    with pytest.raises(NotGraphable, match=reason):
        graphed(small(build))


def test_graphs_that_run_out_of_memory_stop_at_a_smaller_batch() -> None:
    """The largest bucket out of memory: the limit halves until the graphs fit, and larger
    batches run eagerly; out of memory at one row, the model is refused."""
    def fits_four(replica: Replica, device_in: torch.Tensor,
                  sizes: list[int]) -> dict[int, Recorded]:
        if max(sizes) > 4:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return record_eager(replica, device_in, sizes)

    handler = small()
    plain = handler.load(CPU)
    with torch.inference_mode():
        replica = capture(handler, plain, CPU, 16, handler.decode(rows(2)), fits_four)
    assert replica.sizes == [1, 2, 4]
    executor = DeviceExecutor(CPU)
    for n, graphed_batch in ((4, True), (9, False)):
        data = rows(n, seed=n)
        launch = executor.launch(handler, replica, data)
        assert (launch.graph is not None) is graphed_batch
        np.testing.assert_allclose(np.stack(launch.wait()[0]), eager(plain, data), **SAME)

    def fits_none(replica: Replica, device_in: torch.Tensor,
                  sizes: list[int]) -> dict[int, Recorded]:
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(NotGraphable, match="OutOfMemoryError"), torch.inference_mode():
        capture(handler, plain, CPU, 16, handler.decode(rows(2)), fits_none)


def test_items_without_one_declared_shape_are_refused() -> None:
    handler = TensorHandler("free", lambda d: torch.nn.Identity(), None)
    with pytest.raises(NotGraphable, match="one declared shape"):
        capture(handler, handler.load(CPU), CPU, 4, [np.zeros(3, np.float32)], record_eager)


def test_a_capture_that_fails_names_the_error() -> None:
    def broken(replica: Replica, device_in: torch.Tensor, sizes: list[int]) -> dict[int, Recorded]:
        raise RuntimeError("operation not permitted when stream is capturing")

    handler = small()
    with pytest.raises(NotGraphable, match="could not be captured.*not permitted"):
        capture(handler, handler.load(CPU), CPU, 4, handler.decode(rows(1)), broken)


def test_on_the_cpu_the_setting_is_noted_and_the_model_runs_eagerly(
        caplog: pytest.LogCaptureFixture) -> None:
    handler = small()
    with caplog.at_level(logging.INFO, logger="batchserve.warmup"):
        warm = warm_replica(handler, CPU, 8, graphs=True)
    assert not isinstance(warm.replica, GraphedReplica)
    assert "cuda_graphs applies to CUDA devices only" in caplog.text


def test_on_the_cpu_the_default_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """``auto`` is the default: a CPU server does not note a setting nobody gave."""
    with caplog.at_level(logging.DEBUG, logger="batchserve.warmup"):
        warm = warm_replica(small(), CPU, 8, graphs="auto")
    assert not isinstance(warm.replica, GraphedReplica)
    assert "graphs" not in caplog.text.lower()


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("n", [1, 3, 100, 256])
def test_cuda_graphs_match_the_eager_forward(n: int) -> None:
    from app.models.builtin import mlp_handler

    handler = mlp_handler()
    device = torch.device("cuda", 0)
    warm = warm_replica(handler, device, 256, DeviceExecutor(device), graphs=True)
    assert isinstance(warm.replica, GraphedReplica)
    assert warm.replica.sizes == buckets(256)
    executor = DeviceExecutor(device)
    data = list(np.random.default_rng(n).standard_normal((n, 512)).astype(np.float32))
    launches = [executor.launch(handler, warm.replica, data) for _ in range(2)]  # both in flight
    expected = eager(handler.load(CPU), data)
    for launch in launches:
        assert launch.graph is not None and launch.pending
        results, seconds = launch.wait()
        assert launch.graph is None
        assert seconds > 0
        np.testing.assert_allclose(np.stack(results), expected, rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(("graphs", "level"), [("auto", logging.INFO), (True, logging.WARNING)])
def test_a_model_that_does_not_qualify_runs_eagerly_with_its_reason(
        graphs: bool | str, level: int, caplog: pytest.LogCaptureFixture) -> None:
    """Rows that depend on each other: the capture's check refuses the model. Under the
    default (auto) the log says so at info level; asked for (true), it warns."""
    handler = TensorHandler("minus-mean", lambda d: MinusMean(), (8,), examples=rows(3))
    device = torch.device("cuda", 0)
    with caplog.at_level(logging.INFO, logger="batchserve.warmup"):
        warm = warm_replica(handler, device, 8, DeviceExecutor(device), graphs=graphs)
    assert not isinstance(warm.replica, GraphedReplica)
    refusals = [r for r in caplog.records if "served without CUDA graphs" in r.getMessage()]
    assert [r.levelno for r in refusals] == [level]


@pytest.mark.gpu
@gpu
def test_cuda_graphs_widen_bfloat16_outputs() -> None:
    class Bf16(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x).bfloat16()

    handler = TensorHandler("bf16", lambda d: Bf16(mlp_module((8, 3)).to(d).eval()), (8,))
    device = torch.device("cuda", 0)
    warm = warm_replica(handler, device, 8, DeviceExecutor(device), graphs=True)
    assert isinstance(warm.replica, GraphedReplica)
    results, _ = DeviceExecutor(device).launch(handler, warm.replica, rows(3)).wait()
    assert np.stack(results).dtype == np.float32
