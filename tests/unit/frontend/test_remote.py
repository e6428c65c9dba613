"""A front end's models (app/frontend/remote.py): the device process's handlers, sent without
their module (``ModelHandler.for_frontends``), decode in a process that never imports torch;
a front end makes each handler once, off its event loop, says what it lacks, and resolves a
request's model as the device process's repository would."""

from __future__ import annotations

import asyncio
import pickle
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import torch

from app.config import BatchSettings
from app.errors import NotFound, Unavailable
from app.frontend import handlers, remote
from app.frontend.remote import RemoteRepository
from app.models.base import ModelHandler, sendable
from app.models.registry import load_handler
from app.snapshot import ModelEntry, Snapshot
from tests.conftest import WAIT_S, wait_until
from tests.fakes import EchoHandler

# Runs in a fresh interpreter where ``import torch`` fails: everything a front end imports,
# then each handler sent to it (or built there, where none is) decodes a request of two rows.
# Prints each model setting and the shapes it decoded to.
WITHOUT_TORCH = """
import pickle, sys
sys.modules["torch"] = None
import app.frontend.entry
from app.models.registry import load_handler
from app.models.tensor import TensorHandler
for spec, sent in pickle.load(sys.stdin.buffer):
    handler = pickle.loads(sent) if sent else load_handler(spec)
    rows = [[0.5] * 512] * 2 if spec.startswith("app.") or spec == "mlp" else [[1, 2, 3, 4]] * 2
    decoded = handler.decode(["one sentence", "two"] if spec == "minilm" else rows)
    print(spec, [tuple(item.shape) for item in decoded])
"""


def model_files(folder: Path) -> list[str]:
    """``nn.Linear(4, 2)`` as a TorchScript file and as a torch.export program."""
    scripted, exported = folder / "linear.pt", folder / "linear.pt2"
    torch.jit.script(torch.nn.Linear(4, 2)).save(str(scripted))
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2), (torch.randn(2, 4),),
                                          dynamic_shapes=({0: torch.export.Dim("batch")},)),
                      str(exported))
    return [str(scripted), str(exported)]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
def test_handlers_sent_to_a_front_end_decode_where_torch_cannot_be_imported(
        tmp_path: Path) -> None:
    specs = ["linear", "mlp", "app.models.builtin:mlp_module", *model_files(tmp_path), "minilm"]
    sent = [(spec, sendable(load_handler(spec))) for spec in specs]
    assert [handler is None for _, handler in sent] == [False] * 5 + [True]
    run = subprocess.run([sys.executable, "-c", WITHOUT_TORCH], input=pickle.dumps(sent),
                         capture_output=True, timeout=120)
    assert run.returncode == 0, run.stderr.decode()
    shapes = {line.split(" ", 1)[0]: line.split(" ", 1)[1]
              for line in run.stdout.decode().splitlines()}
    assert shapes[specs[0]] == shapes[specs[3]] == shapes[specs[4]] == "[(4,), (4,)]"
    assert shapes[specs[1]] == shapes[specs[2]] == "[(512,), (512,)]"
    assert shapes["minilm"].startswith("[(") and len(eval(shapes["minilm"])) == 2


def test_a_handler_sent_has_no_module_and_decodes_as_the_devices_does() -> None:
    """mlp's module is 19 M parameters (76 MB); what a front end is sent is a few KB."""
    handler = load_handler("app.models.builtin:mlp_module")
    pickled = sendable(handler)
    assert pickled is not None and len(pickled) < 10_000
    sent = pickle.loads(pickled)
    rows = [[float(i)] * 512 for i in range(3)]
    for mine, theirs in zip(sent.decode(rows), handler.decode(rows), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert vars(sent).keys() == vars(handler).keys()
    assert all(getattr(sent, k) == getattr(handler, k) for k in vars(handler)
               if k not in ("_build", "_examples"))
    with pytest.raises(RuntimeError, match="no module"):
        sent.load(torch.device("cpu"))
    assert handler.load(torch.device("cpu"))(torch.zeros(1, 512)).shape == (1, 16)


def entry(spec: str, handler: bytes | None) -> ModelEntry:
    return ModelEntry("m", "1", spec, BatchSettings(), "ready", None, handler)


class Service:
    """What RemoteRepository needs of a front end's service: the link's snapshot."""

    def __init__(self, *entries: ModelEntry) -> None:
        self.loop = self.pool = None
        self.link = SimpleNamespace(snapshot=snap(*entries))


def snap(*entries: ModelEntry) -> Snapshot:
    return Snapshot(served={e.name: {e.version: e} for e in entries},
                    current={e.name: e.version for e in entries},
                    names=[e.name for e in entries])


@pytest.mark.asyncio
async def test_a_handler_sent_again_in_a_later_snapshot_is_read_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = entry("linear", sendable(load_handler("linear")))
    service = Service(first)
    repository = RemoteRepository(service)  # type: ignore[arg-type]
    making = repository.update(service.link.snapshot)
    assert making is not None
    await making
    handler = repository.get("m").handler
    reads: list[bytes] = []
    monkeypatch.setattr(handlers.pickle, "loads", lambda data: reads.append(data))
    assert repository.update(service.link.snapshot) is None  # nothing to make
    assert repository.get("m").handler is handler and reads == []
    monkeypatch.undo()
    # a new version's handler is read: its own object
    other = replace(first, handler=sendable(load_handler("mlp")))
    service.link.snapshot = snap(other)
    making = repository.update(service.link.snapshot)
    assert making is not None
    await making
    assert repository.get("m").handler is not handler
    # the first unloaded: its handler is let go (made again if it is loaded again)
    assert list(repository._handlers) == [remote._key(other)]


@pytest.mark.asyncio
async def test_a_handler_is_made_off_the_event_loop_and_its_model_reads_loading_till_then(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing a model's module may take seconds: the front end serves on meanwhile, and
    says the model loads."""
    gate, threads = threading.Event(), []

    def build(spec: str, name: str | None = None) -> ModelHandler:
        threads.append(threading.current_thread().name)
        assert gate.wait(WAIT_S)
        return load_handler(spec, name)

    monkeypatch.setattr(handlers, "load_handler", build)
    service = Service(entry("tests.fakes:EchoHandler", None))
    repository = RemoteRepository(service)  # type: ignore[arg-type]
    making = repository.update(service.link.snapshot)
    assert making is not None
    await wait_until(lambda: threads, "the build begun")
    for _ in range(3):
        await asyncio.sleep(0.01)  # the loop runs: the build is on its own thread
        with pytest.raises(Unavailable) as refused:
            repository.get("m")
        assert refused.value.type == "loading"
    assert repository.update(service.link.snapshot) is not None  # the same build, awaited
    gate.set()
    await making
    assert isinstance(repository.get("m").handler, EchoHandler)
    assert threads == ["build-m"]


@pytest.mark.asyncio
async def test_a_front_end_reports_what_it_cannot_serve_once_started_and_when_it_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing before its start ends (``report``); then what it lacks, and each change: the
    handler being made (loading), made (nothing), failed (unavailable)."""
    gate = threading.Event()

    def build(spec: str, name: str | None = None) -> ModelHandler:
        assert gate.wait(WAIT_S)
        return load_handler(spec, name)

    monkeypatch.setattr(handlers, "load_handler", build)
    service = Service(entry("tests.fakes:EchoHandler", None))
    sent: list[tuple[str, object]] = []
    service.link.send = lambda kind, entry: sent.append((kind, entry))
    repository = RemoteRepository(service)  # type: ignore[arg-type]
    making = repository.update(service.link.snapshot)
    assert making is not None and sent == []
    repository.report()
    repository.report()  # unchanged: not sent again
    assert sent == [("lacking", [("m", "1", "loading")])]
    gate.set()
    await making
    assert sent[1:] == [("lacking", [])]
    failing = replace(entry("tests.fakes:raising_factory", None), version="2")
    service.link.snapshot = snap(failing)
    making = repository.update(service.link.snapshot)
    assert making is not None
    await making
    assert sent[2:] == [("lacking", [("m", "2", "loading")]),
                        ("lacking", [("m", "2", "unavailable")])]


@pytest.mark.asyncio
async def test_a_new_default_version_whose_handler_is_made_leaves_the_one_before_serving(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rolling update (version 2 takes the name's default traffic): while this front end
    makes version 2's handler, a request naming no version goes to version 1, which the device
    process keeps serving till this front end holds the snapshot (app/bridge.py); one naming
    version 2 is told it loads. Each snapshot counts as a move (``moves``)."""
    gate = threading.Event()

    def build(spec: str, name: str | None = None) -> ModelHandler:
        if spec == "tests.fakes:EchoHandler":
            assert gate.wait(WAIT_S)
        return load_handler(spec, name)

    monkeypatch.setattr(handlers, "load_handler", build)
    first = entry("linear", None)
    service = Service(first)
    repository = RemoteRepository(service)  # type: ignore[arg-type]
    await cast(asyncio.Future[Any], repository.update(service.link.snapshot))
    second = replace(first, version="2", spec="tests.fakes:EchoHandler")
    service.link.snapshot = Snapshot(served={"m": {"1": first, "2": second}},
                                     current={"m": "2"}, names=["m"])
    moves = repository.moves
    making = repository.update(service.link.snapshot)
    assert making is not None and repository.moves == moves + 1
    assert repository.get("m").version == "1"
    with pytest.raises(Unavailable, match="builds its handler"):
        repository.get("m", "2")
    gate.set()
    await making
    assert repository.get("m").version == "2" and repository.get("m", "1").version == "1"


@pytest.mark.asyncio
async def test_a_lookup_is_resolved_once_for_a_snapshot_and_again_for_each_new_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A request's (name, version) found among the models is resolved once while the link
    holds the same snapshot and models: again once it holds a new snapshot (the default
    traffic moved, before ``update`` runs) or ``update`` made new models; what is not found is
    resolved each time."""
    first = entry("linear", None)
    second = replace(first, version="2")
    both = {"m": {"1": first, "2": second}}
    service = Service(first)
    service.link.snapshot = Snapshot(served=both, current={"m": "1"}, names=["m"])
    repository = RemoteRepository(service)  # type: ignore[arg-type]
    await cast(asyncio.Future[Any], repository.update(service.link.snapshot))
    picked: list[tuple[str, str | None]] = []
    pick = remote.pick

    def counted(name: str, version: str | None, *rest: Any) -> ModelEntry:
        picked.append((name, version))
        return pick(name, version, *rest)

    monkeypatch.setattr(remote, "pick", counted)
    assert [repository.get("m").version for _ in range(3)] == ["1", "1", "1"]
    assert repository.get("m", "2").version == "2" and repository.get("m", "2").version == "2"
    assert picked == [("m", None), ("m", "2")]
    held = repository.get("m")
    assert repository.update(service.link.snapshot) is None  # new models, the same snapshot
    assert repository.get("m") is repository._models[("m", "1")] is not held
    service.link.snapshot = Snapshot(served=both, current={"m": "2"}, names=["m"])
    assert repository.get("m").version == "2" and picked[2:] == [("m", None), ("m", None)]
    only_first = Snapshot(served={"m": {"1": first}}, current={"m": "1"}, names=["m"])
    service.link.snapshot = only_first
    assert repository.update(only_first) is None  # version 1's handler: made before
    assert repository.get("m").version == "1"
    for _ in range(2):
        with pytest.raises(NotFound, match="no version '2'"):
            repository.get("m", "2")
    assert picked[4:] == [("m", None), ("m", "2"), ("m", "2")]
