"""app/transfer.py: the same results through the CPU path and, where there is a GPU, through the
pipelined CUDA path (streams, events, pinned host memory)."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from app.models.builtin import mlp_handler
from app.models.tensor import TensorHandler
from app.process import launching
from app.transfer import DeviceExecutor

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def rows(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return list(rng.standard_normal((n, 512)).astype(np.float32))


def reference(handler: TensorHandler, data: list[np.ndarray]) -> np.ndarray:
    with torch.inference_mode():
        return handler.load(torch.device("cpu"))(torch.from_numpy(np.stack(data))).numpy()


def test_cpu_launch_is_complete_at_once() -> None:
    handler = mlp_handler()
    executor = DeviceExecutor(torch.device("cpu"))
    replica = handler.load(torch.device("cpu"))
    data = rows(5)
    launch = executor.launch(handler, replica, data)
    assert not launch.pending
    results, seconds = launch.wait()
    assert seconds > 0
    np.testing.assert_allclose(np.stack(results), reference(handler, data), rtol=1e-5)


def openmp() -> ctypes.CDLL:
    """The OpenMP runtime torch computes with (loaded already: this opens the same copy)."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch is not built with OpenMP")
    found = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    if not found:
        pytest.skip("torch's OpenMP runtime is not a file beside it")
    return ctypes.CDLL(str(found[0]))


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: every count is 1")
def test_an_executor_thread_computes_with_the_torch_thread_setting() -> None:
    """torch.set_num_threads(1) on one thread, an executor made on another: MKL called from the
    executor's thread must use one OpenMP thread, not one per core (before its first large
    batch, ATen had not told that thread's OpenMP runtime yet)."""
    runtime = openmp()
    before = torch.get_num_threads()
    seen: list[int] = []

    def device_thread() -> None:
        DeviceExecutor(torch.device("cpu"))
        seen.append(runtime.omp_get_max_threads())

    torch.set_num_threads(1)
    try:
        thread = threading.Thread(target=device_thread)
        thread.start()
        thread.join()
    finally:
        torch.set_num_threads(before)
    assert seen == [1]


@pytest.mark.gpu
@gpu
def test_cuda_launches_overlap_and_match_the_cpu() -> None:
    handler = mlp_handler()
    device = torch.device("cuda", 0)
    executor = DeviceExecutor(device)
    replica = handler.load(device)
    batches = [rows(64, seed) for seed in range(8)]
    launches = [executor.launch(handler, replica, data) for data in batches]  # all in flight
    assert all(launch.pending for launch in launches)
    for data, launch in zip(batches, launches, strict=True):
        results, seconds = launch.wait()
        assert seconds > 0
        np.testing.assert_allclose(np.stack(results), reference(handler, data),
                                   rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@gpu
def test_a_cuda_wait_sleeps_while_the_batch_computes() -> None:
    """The device thread's wait for a batch leaves its core to the others (app/transfer.py):
    CUDA's default with one context would spin through the whole batch."""
    cycles = [0]

    def forward(batch: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(cycles[0])  # type: ignore[no-untyped-call]
        return batch * 2

    handler = TensorHandler("slow", lambda d: forward, (4,))
    executor = DeviceExecutor(torch.device("cuda", 0))
    # a first batch makes the executor's pinned host and device blocks: allocating them can
    # wait for the device, which would time the batch inside ``launch``, not ``wait``
    executor.launch(handler, forward, [np.ones(4, np.float32)]).wait()
    cycles[0] = 1_000_000_000  # ~0.5 s
    launch = executor.launch(handler, forward, [np.ones(4, np.float32)])
    wall, cpu = time.perf_counter(), time.thread_time()
    results, _ = launch.wait()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    np.testing.assert_array_equal(results[0], np.full(4, 2, np.float32))
    assert wall > 0.05
    assert cpu < wall / 4


def interval_seen(device: torch.device) -> tuple[float, float]:
    """The GIL switch interval inside a forward launched on ``device``, and after its wait."""
    seen: list[float] = []

    def forward(batch: torch.Tensor) -> torch.Tensor:
        seen.append(sys.getswitchinterval())
        return batch * 2

    handler = TensorHandler("twice", lambda d: forward, (4,))
    launch = DeviceExecutor(device).launch(handler, forward, [np.ones(4, np.float32)])
    launch.wait()
    return seen[0], sys.getswitchinterval()


def test_a_cpu_launch_keeps_the_switch_interval() -> None:
    """On the CPU an op computes for long enough that the interval hardly matters
    (app/process.py): the process's own holds."""
    before = sys.getswitchinterval()
    assert interval_seen(torch.device("cpu")) == (before, before)


@pytest.mark.gpu
@gpu
def test_a_cuda_launch_runs_at_the_short_switch_interval() -> None:
    before = sys.getswitchinterval()
    inside, after = interval_seen(torch.device("cuda", 0))
    # Python keeps the interval in whole microseconds: 5e-6 reads back as 4.9999999999999996e-06
    assert inside == pytest.approx(min(before, launching.interval_s))
    assert after == pytest.approx(before)
