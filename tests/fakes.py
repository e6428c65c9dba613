"""Test doubles: a fake clock and queue for the policy, and handlers with controllable behaviour.

The handlers take numbers as instances and return ``2 * x``. Each records every batch it ran.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.errors import InvalidInput
from app.models.base import ModelHandler, Replica, Tensors
from app.pending import PendingItem
from app.supervisor import FRONTEND_MODULE


@dataclass
class FakeClock:
    now: float = 100.0
    naps: int = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.naps += 1


EPSILON_S = 1e-9  # the fake clock adds floats: an arrival due within a nanosecond is due


@dataclass
class FakeQueue:
    """An ItemSource whose items become visible at their arrival time on the fake clock."""

    clock: FakeClock
    arrivals: list[tuple[float, PendingItem]] = field(default_factory=list)

    def add(self, at: float, item: PendingItem) -> None:
        self.arrivals.append((at, item))
        self.arrivals.sort(key=lambda pair: pair[0])

    def nap(self, seconds: float, more: int) -> None:
        """A device thread's nap: until ``more`` items beyond those visible have arrived (the
        targeted wake), or ``seconds`` are up."""
        self.clock.naps += 1
        due = [at for at, _ in self.arrivals if at > self.clock.now + EPSILON_S]
        woken = due[more - 1] if len(due) >= more else float("inf")
        self.clock.now = min(self.clock.now + seconds, max(woken, self.clock.now))

    def take(self, limit: int) -> list[PendingItem]:
        taken = []
        while (len(taken) < limit and self.arrivals
               and self.arrivals[0][0] <= self.clock.now + EPSILON_S):
            taken.append(self.arrivals.pop(0)[1])
        return taken


class EchoHandler(ModelHandler):
    """Numbers in, ``2 * x`` out; ``batches`` records what each model call received."""

    name = "echo"
    input_schema = {"type": "number"}

    def __init__(self) -> None:
        self.batches: list[list[float]] = []
        self._lock = threading.Lock()

    def examples(self) -> list[Any]:
        return []

    def decode(self, instances: list[Any]) -> list[Any]:
        out = []
        for i, x in enumerate(instances):
            # a JSON number, or a v2 row of one number (a numpy scalar)
            if isinstance(x, bool) or not isinstance(x, (int, float, np.number)):
                raise InvalidInput(f"instances[{i}]: expected a number")
            out.append(float(x))
        return out

    def load(self, device: torch.device) -> Replica:
        return self.compute

    def collate(self, items: list[Any]) -> Tensors:
        return torch.tensor(items, dtype=torch.float64)

    def compute(self, batch: torch.Tensor) -> torch.Tensor:
        with self._lock:
            self.batches.append(batch.tolist())
        return batch * 2

    @property
    def seen(self) -> list[float]:
        with self._lock:
            return [x for b in self.batches for x in b]


class GatedHandler(EchoHandler):
    """Blocks every model call until ``gate`` is set; ``entered`` is set when a call starts."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def compute(self, batch: torch.Tensor) -> torch.Tensor:
        self.entered.set()
        if not self.gate.wait(timeout=120):
            raise RuntimeError("gate never opened")
        return super().compute(batch)


class FailingHandler(EchoHandler):
    """Raises on any batch that contains a negative number."""

    def compute(self, batch: torch.Tensor) -> torch.Tensor:
        if (batch < 0).any():
            raise ValueError("negative input /secret/path/model.py")
        return super().compute(batch)


class WrongLengthHandler(EchoHandler):
    def compute(self, batch: torch.Tensor) -> torch.Tensor:
        return super().compute(batch)[:-1]


class Crash(BaseException):
    """Not an Exception: escapes the per-batch error handling and kills the device thread."""


class CrashingHandler(EchoHandler):
    """Kills its device thread on the value 666."""

    def compute(self, batch: torch.Tensor) -> torch.Tensor:
        if (batch == 666).any():
            raise Crash("device thread crash")
        return super().compute(batch)


class LoadsOnceHandler(CrashingHandler):
    """Kills its device thread on 666; loads once, and every load after fails (as a restarted
    thread's re-attach would where the device's memory is gone)."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    def load(self, device: torch.device) -> Replica:
        self.loads += 1
        if self.loads > 1:
            raise RuntimeError("device memory is gone")
        return super().load(device)


class OOMHandler(EchoHandler):
    """Out of device memory above ``fits`` items, or on the value 999 even alone; with
    ``examples``, warmed up (and measured) with them."""

    def __init__(self, fits: int, examples: list[Any] | None = None) -> None:
        super().__init__()
        self.fits = fits
        self.attempts: list[int] = []
        self._examples = examples or []

    def examples(self) -> list[Any]:
        return list(self._examples)

    def compute(self, batch: torch.Tensor) -> torch.Tensor:
        self.attempts.append(len(batch))
        if len(batch) > self.fits or (batch == 999).any():
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return super().compute(batch)


class SlowLoadHandler(EchoHandler):
    """Its load blocks until ``loaded`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded = threading.Event()

    def load(self, device: torch.device) -> Replica:
        if not self.loaded.wait(timeout=60):
            raise RuntimeError("never released")
        return super().load(device)


class BrokenLoadHandler(EchoHandler):
    def load(self, device: torch.device) -> Replica:
        raise RuntimeError("weights are corrupt")


class GatedLoadHandler(EchoHandler):
    """Its load waits until ``gate`` is set (``entered`` set once it waits). Class-level: the
    repository makes the instance; a test clears both before it loads one."""

    gate = threading.Event()
    entered = threading.Event()

    def load(self, device: torch.device) -> Replica:
        GatedLoadHandler.entered.set()
        if not GatedLoadHandler.gate.wait(timeout=120):
            raise RuntimeError("gate never opened")
        return super().load(device)


class GateFileModule(torch.nn.Module):
    """For subprocess servers: a forward waits until the file named by $GATE_FILE exists, except
    for the (negative) warm-up example."""

    input_shape = (2,)
    example_inputs = [[-1.0, -1.0]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = Path(os.environ["GATE_FILE"])
        for _ in range(60_000):
            if (x < 0).all():
                break
            if gate.exists():
                break
            time.sleep(0.001)
        return x * 2


def gate_file_module() -> torch.nn.Module:
    return GateFileModule()


class SleepModule(torch.nn.Module):
    """For subprocess servers: every forward takes $SLEEP_S seconds (default 0.1) whatever the
    batch size, so the server's capacity is small and known: max_batch_size / SLEEP_S items/s."""

    input_shape = (2,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(float(os.environ.get("SLEEP_S", "0.1")))
        return x * 2


def sleep_module() -> torch.nn.Module:
    return SleepModule()


class PoisonModule(torch.nn.Module):
    """For worker processes: the whole process dies (as from a segfault or the OOM killer) on an
    instance containing 666; anything else is doubled."""

    input_shape = (2,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x == 666).any():
            os._exit(3)
        return x * 2


def poison_module() -> torch.nn.Module:
    return PoisonModule()


class CudaFaultModule(torch.nn.Module):
    """For CUDA servers: an instance starting with 666 indexes past a tensor's end, a
    device-side assert that leaves the CUDA context failing every later call; anything else is
    doubled."""

    input_shape = (2,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = (x[:, 0] == 666).long() * 100
        return x * 2 + torch.zeros(1, device=x.device)[index].unsqueeze(1)


def cuda_fault_module() -> torch.nn.Module:
    return CudaFaultModule()


class PairModule(torch.nn.Module):
    """Declares its input but not its output: each item of 3 numbers gives a 2 x 3 array."""

    input_shape = (3,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x, 2 * x], dim=1)


def pair_module() -> torch.nn.Module:
    return PairModule()


class GatedWide(torch.nn.Module):
    """x * 2, whose calls on more than one row wait for ``gate``: a model without warm-up
    examples, whose cost is measured from its first request (batches of 1, 2, 4...), held
    in that measurement."""

    gate = threading.Event()
    entered = threading.Event()  # a call waits at the gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 1:
            self.entered.set()
            self.gate.wait(120)
        return x * 2


def gated_wide() -> torch.nn.Module:
    return GatedWide()


class Widen(torch.nn.Module):
    """Each row's one number as 8,192 (times 0 to 1): about 90 KB of JSON a row answered, for a
    few bytes asked; 256 rows answer more than a loopback socket's buffers hold."""

    input_shape = (1,)
    example_inputs = [[1.0]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.linspace(0, 1, 8192)


def widen() -> torch.nn.Module:
    return Widen()


class SlowBuild:
    """A model factory that waits for ``gate`` (up to ``WAIT_S``; ``timed_out`` set if it never
    opened) before it returns its module: a model whose code takes long to build (weights
    read in its factory, a large program). ``entered`` is set once it waits."""

    WAIT_S = 10.0
    gate = threading.Event()
    entered = threading.Event()
    timed_out = threading.Event()

    @classmethod
    def reset(cls) -> None:
        for event in (cls.gate, cls.entered, cls.timed_out):
            event.clear()


def slow_build() -> torch.nn.Module:
    SlowBuild.entered.set()
    if not SlowBuild.gate.wait(SlowBuild.WAIT_S):
        SlowBuild.timed_out.set()
    return Scale(2.0)


def wait_for_gate_file() -> None:
    """Until the file named by $GATE_FILE exists (ten minutes at most: longer than any test
    waits, so a test whose gate never opens sees a call that does not return)."""
    gate = Path(os.environ["GATE_FILE"])
    deadline = time.monotonic() + 600
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


def gate_file_build() -> torch.nn.Module:
    """For subprocess servers: a factory that returns Scale(2) once the gate file exists: a
    model whose code takes long to build."""
    wait_for_gate_file()
    return Scale(2.0)


class GateFileLoad(EchoHandler):
    """For subprocess servers: its replica loads once the gate file exists (weights on a file
    system that hangs)."""

    def load(self, device: torch.device) -> Replica:
        wait_for_gate_file()
        return super().load(device)


class TorchUntilGateFile(EchoHandler):
    """For subprocess servers: its replica's load computes with torch (whose calls let the GIL
    go) until the gate file exists: a warm-up inside torch when the server is stopped. It
    makes the gate's path with ``.entered`` appended once it begins."""

    def load(self, device: torch.device) -> Replica:
        gate = Path(os.environ["GATE_FILE"])
        Path(f"{gate}.entered").touch()
        deadline = time.monotonic() + 600
        a = torch.ones(128, 128)
        while not gate.exists() and time.monotonic() < deadline:
            for _ in range(100):
                a = torch.mm(a, a).clamp_(-1, 1)
        return super().load(device)


class GateFileDecode(EchoHandler):
    """For subprocess servers: decodes in the decode pool, where a request with a negative
    instance waits for the gate file (a decode stuck on its input)."""

    heavy_decode = True

    def decode(self, instances: list[Any]) -> list[Any]:
        if any(isinstance(x, (int, float)) and x < 0 for x in instances):
            wait_for_gate_file()
        return super().decode(instances)


class GateFileInFrontEnds(EchoHandler):
    """For subprocess servers: built at once in the device process; in a front end (which
    builds its own: it sends none) only once the gate file exists (a model's module slow to
    import there)."""

    def __init__(self) -> None:
        super().__init__()
        main = getattr(sys.modules["__main__"], "__spec__", None)
        if main is not None and main.name == FRONTEND_MODULE:
            wait_for_gate_file()


def raising_factory() -> torch.nn.Module:
    raise RuntimeError("no weights here")


class Scale(torch.nn.Module):
    """x * k: an exported version of a model, told apart from another by its k."""

    def __init__(self, k: float) -> None:
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k


def export_scale(path: Path, k: float, width: int = 3) -> Path:
    """A torch.export program of Scale(k) taking rows of ``width`` numbers, any batch size."""
    program = torch.export.export(Scale(k), (torch.zeros(2, width),),
                                  dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))
    return path


class SlowEchoHandler(EchoHandler):
    """An echo whose every batch takes $SLOW_S seconds (default 0.05) of device time."""

    name = "slow"

    def compute(self, batch: torch.Tensor) -> torch.Tensor:
        time.sleep(float(os.environ.get("SLOW_S", "0.05")))
        return super().compute(batch)


class SteadyHandler(EchoHandler):
    """Every batch takes ``cost_s`` whatever its size, so its cost model is known and flat: it
    has an example, so the warm-up measures it. ``gate`` (open at first) can hold the device."""

    name = "steady"

    def __init__(self, cost_s: float = 0.02) -> None:
        super().__init__()
        self.cost_s = cost_s
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def examples(self) -> list[Any]:
        return [1.0]

    def compute(self, batch: torch.Tensor) -> torch.Tensor:
        self.entered.set()
        if not self.gate.wait(timeout=60):
            raise RuntimeError("gate never opened")
        time.sleep(self.cost_s)
        return super().compute(batch)


class IdsHandler(ModelHandler):
    """A model whose one input is 4 INT64 ids a row (as token ids are): answers their sum, as
    INT64. Its v2 input datatype is INT64, not the tensor models' FP32."""

    name = "ids"
    input_datatype = "INT64"
    input_shape = (4,)
    output_shape = ()

    def decode(self, instances: list[Any]) -> list[Any]:
        rows = [np.asarray(x) for x in instances]
        for i, row in enumerate(rows):
            if row.shape != (4,) or row.dtype.kind not in "iu":
                raise InvalidInput(f"instances[{i}]: expected 4 whole numbers")
        return [row.astype(np.int64) for row in rows]

    def load(self, device: torch.device) -> Replica:
        return lambda batch: batch.sum(dim=1)

    def collate(self, items: list[Any]) -> Tensors:
        return torch.from_numpy(np.stack(items))
