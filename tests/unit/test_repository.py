"""ModelRepository with real device threads: a folder of models, versions, load and unload."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import shutil
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from app import process
from app.errors import DeadlineExceeded, InvalidInput, ModelError, NotFound, Unavailable
from app.process import freeze_startup_objects
from app.runtime import InferenceService, build_service
from app.served import ServedModel
from app.worker import WorkerState
from tests.conftest import WAIT_S, make_settings, sample, wait_until
from tests.fakes import GatedLoadHandler, GatedWide, SlowBuild, export_scale
from tests.holders import holders

# A load's config naming no setting: the answer names the one it resembles.
TYPO = re.escape("unknown settings max_batch_sise (did you mean max_batch_size?)")
pytestmark = pytest.mark.asyncio


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Scale(k) programs for k = 1, 2, 3, made once for the whole session."""
    root = tmp_path_factory.mktemp("exported")
    return {k: export_scale(root / f"scale{k}.pt2", float(k)) for k in (1, 2, 3)}


def add_version(repo: Path, name: str, version: int, program: Path) -> None:
    (repo / name / str(version)).mkdir(parents=True, exist_ok=True)
    shutil.copy(program, repo / name / str(version) / "model.pt2")


def write_config(repo: Path, name: str, text: str) -> None:
    (repo / name).mkdir(parents=True, exist_ok=True)
    (repo / name / "config.toml").write_text(text)


@asynccontextmanager
async def serving(repo: Path, **overrides: Any) -> AsyncIterator[InferenceService]:
    settings = make_settings(model_repository=str(repo), **overrides)
    service = build_service(settings)
    await service.start()
    try:
        await wait_until(lambda: not service.repository.starting, "start-up loads done")
        yield service
    finally:
        await service.stop(timeout_s=30)


async def call(service: InferenceService, name: str | None, values: list[Any],
               version: str | None = None) -> list[float]:
    model = service.repository.get(name, version)
    items = await model.decode(values)
    results = await model.result(model.enqueue(items, time.monotonic() + 30))
    return [float(r) if not hasattr(r, "tolist") else r.tolist() for r in results]


async def test_every_model_loads_with_its_own_settings(tmp_path: Path,
                                                       exported: dict[int, Path]) -> None:
    write_config(tmp_path, "echo", 'model = "tests.fakes:EchoHandler"\nmax_batch_size = 4\n')
    write_config(tmp_path, "small", 'model = "linear"\nqueue_capacity = 32\ncuda_graphs = false\n')
    write_config(tmp_path, "tiny", 'model = "linear"\nqueue_capacity = 8\n')
    add_version(tmp_path, "scale", 1, exported[1])
    add_version(tmp_path, "scale", 2, exported[2])
    async with serving(tmp_path, queue_capacity=64, max_instances=16) as service:
        repo = service.repository
        assert repo.names() == ["echo", "scale", "small", "tiny"]
        assert await call(service, "echo", [1, 2]) == [2.0, 4.0]
        assert await call(service, "scale", [[1, 1, 1]]) == [[2.0, 2.0, 2.0]]  # newest: v2
        with pytest.raises(NotFound, match="no version '1'"):
            repo.get("scale", "1")  # only the newest serves by default
        echo, small = repo.get("echo"), repo.get("small")
        assert echo.batch_limit == 4 and echo.settings.queue_capacity == 64  # the server's
        assert (small.settings.queue_capacity, small.settings.max_instances) == (32, 16)
        assert (small.settings.cuda_graphs, echo.settings.cuda_graphs) == (False, "auto")
        with pytest.raises(NotFound, match="name one"):
            repo.get(None)  # several models and no default_model
        index = {e["name"]: e for e in repo.index()}
        assert [index[n]["state"] for n in ("echo", "scale", "small")] == ["READY"] * 3
        # max_instances set for the whole server (16) cannot fit tiny's own queue (8)
        assert index["tiny"]["state"] == "UNAVAILABLE"
        assert "max_instances (16) exceeds queue_capacity (8)" in index["tiny"]["reason"]


async def test_a_model_that_cannot_load_is_unavailable_the_others_serve(tmp_path: Path) -> None:
    write_config(tmp_path, "good", 'model = "tests.fakes:EchoHandler"\n')
    write_config(tmp_path, "broken", 'model = "tests.fakes:BrokenLoadHandler"\n')
    write_config(tmp_path, "typo", 'model = "linear"\nmax_batch_sise = 3\n')
    write_config(tmp_path, "clash", 'model = "linear"\nqueue_capacity = 4\nmax_instances = 9\n')
    (tmp_path / "empty").mkdir()
    async with serving(tmp_path) as service:
        index = {e["name"]: e for e in service.repository.index()}
        assert index["good"]["state"] == "READY"
        assert "weights are corrupt" in index["broken"]["reason"]
        assert index["typo"]["reason"].endswith(
            "unknown settings max_batch_sise (did you mean max_batch_size?)")
        assert "max_instances (9) exceeds queue_capacity (4)" in index["clash"]["reason"]
        assert "no model" in index["empty"]["reason"]
        assert all(index[n]["state"] == "UNAVAILABLE" for n in ("broken", "typo", "clash"))
        assert await call(service, "good", [3]) == [6.0]
        with pytest.raises(Unavailable, match="could not be loaded: RuntimeError"):
            service.repository.get("broken")
        assert service.status == "ready" and not service.load_failed


async def test_a_load_or_unload_through_the_api_never_stops_the_server(tmp_path: Path) -> None:
    """Nothing serving after a client's failed load, or after it unloaded the last model, is
    not a failed start: the server stays up (it exited, at one bad request)."""
    write_config(tmp_path, "other", 'model = "linear"\n')
    write_config(tmp_path, "bad", 'model = "tests.fakes:raising_factory"\n')
    async with serving(tmp_path, model_control_mode="explicit") as service:
        with pytest.raises(InvalidInput, match="no weights here") as refused:
            await service.repository.load("bad")
        assert refused.value.message.count("failed to load") == 1  # said once, not nested
        assert not service.load_failed and service.status == "ready"
        await service.repository.load("other")
        await service.repository.unload("other")
        assert not service.load_failed and service.status == "ready"


async def test_a_loads_config_cannot_name_the_code_to_run(tmp_path: Path) -> None:
    """``model`` names a module and callable to import and call, or a file: a request may tune
    a model's settings, not choose what runs in the server."""
    write_config(tmp_path, "other", 'model = "linear"\n')
    async with serving(tmp_path, model_control_mode="explicit", load_model=["other"]) as service:
        with pytest.raises(InvalidInput, match="a load's config cannot set 'model'"):
            await service.repository.load("other", {"model": "tests.fakes:raising_factory"})
        await service.repository.load("other", {"max_batch_size": 2})
        assert service.repository.get("other").settings.max_batch_size == 2


async def test_names_that_are_nothing_leave_nothing_behind(tmp_path: Path) -> None:
    """A client may send any name to load or unload: none of them is kept (a lock was kept for
    each, for the life of the server)."""
    write_config(tmp_path, "other", 'model = "linear"\n')
    async with serving(tmp_path, model_control_mode="explicit") as service:
        repo = service.repository
        for i in range(100):
            with pytest.raises(InvalidInput, match="no such model in the repository"):
                await repo.load(f"nope{i}")
            await repo.unload(f"gone{i}")
        assert repo._locks == {} and repo.failed == {}
        assert [e["name"] for e in repo.index()] == ["other"]


async def test_a_start_up_set_that_all_fails_stops_the_server(tmp_path: Path) -> None:
    write_config(tmp_path, "bad", 'model = "tests.fakes:raising_factory"\n')
    async with serving(tmp_path) as service:
        assert service.load_failed and service.status == "unhealthy"


async def test_a_model_whose_folder_went_stays_in_the_index_while_it_serves(
        tmp_path: Path) -> None:
    write_config(tmp_path, "other", 'model = "linear"\n')
    async with serving(tmp_path, model_control_mode="explicit", load_model=["other"]) as service:
        shutil.rmtree(tmp_path / "other")
        with pytest.raises(InvalidInput, match="no such model in the repository"):
            await service.repository.load("other")
        assert [(e["name"], e["state"]) for e in service.repository.index()] == [
            ("other", "READY")]
        await service.repository.unload("other")
        assert service.repository.index() == []


async def test_explicit_mode_loads_on_request_and_unload_drains(tmp_path: Path) -> None:
    write_config(tmp_path, "echo", 'model = "tests.fakes:GatedHandler"\n')
    write_config(tmp_path, "other", 'model = "linear"\n')
    async with serving(tmp_path, model_control_mode="explicit", load_model=["other"]) as service:
        repo = service.repository
        assert [(e["name"], e["state"]) for e in repo.index()] == [
            ("echo", "UNAVAILABLE"), ("other", "READY")]
        with pytest.raises(NotFound):
            repo.get("echo")
        await repo.load("echo")
        model = repo.get("echo")
        first = asyncio.create_task(call(service, "echo", [1]))
        await wait_until(model.handler.entered.is_set, "on the device")  # type: ignore[attr-defined]
        queued = asyncio.create_task(call(service, "echo", [2, 3]))
        await wait_until(lambda: model.queue.depth == 2, "queued")
        unloading = asyncio.create_task(repo.unload("echo"))
        await wait_until(lambda: model.health == "unloading", "unloading")
        with pytest.raises(Unavailable, match="unloading"):
            model.check_admissible(1)
        model.handler.gate.set()  # type: ignore[attr-defined]
        assert await first == [2.0] and await queued == [4.0, 6.0]  # admitted: all answered
        await unloading
        with pytest.raises(NotFound):
            repo.get("echo")
        assert not any(w.holds(model) for w in service.workers)
        assert repo.index()[0] == {"name": "echo", "version": "", "state": "UNAVAILABLE",
                                   "reason": "unloaded"}


async def test_a_model_whose_device_thread_died_can_be_unloaded(tmp_path: Path) -> None:
    """The detach a dead thread would have run runs where it is asked (app/bell.py's Mailbox):
    the unload ends (it waited for ever), and the restarted thread serves the other model."""
    write_config(tmp_path, "crasher", 'model = "tests.fakes:CrashingHandler"\n')
    write_config(tmp_path, "other", 'model = "tests.fakes:EchoHandler"\n')
    async with serving(tmp_path, model_control_mode="explicit",
                       load_model=["crasher", "other"]) as service:
        dead = service.workers[0]
        crasher = service.repository.get("crasher")
        with pytest.raises(ModelError):
            await call(service, "crasher", [666])
        await wait_until(lambda: dead.state is WorkerState.FAILED, "thread dead")
        await asyncio.wait_for(service.repository.unload("crasher"), WAIT_S)
        assert not dead.holds(crasher)
        await wait_until(lambda: service.status == "ready", "restarted")
        assert not any(w.holds(crasher) for w in service.workers)
        assert await call(service, "other", [4]) == [8.0]


@asynccontextmanager
async def stuck(repo: Path, deadline_s: float = 30.0, **overrides: Any
                ) -> AsyncIterator[tuple[InferenceService, ServedModel, asyncio.Task[list[float]]]]:
    """A server (explicit control, ``echo`` not loaded) whose device thread is stuck in model
    ``gated``'s call on one request (its answer: the task) with this ``deadline_s``. The test
    opens ``gated.handler.gate`` to let the call return; it opens on the way out in any case."""
    write_config(repo, "gated", 'model = "tests.fakes:GatedHandler"\n')
    write_config(repo, "echo", 'model = "tests.fakes:EchoHandler"\n')
    async with serving(repo, model_control_mode="explicit", load_model=["gated"],
                       device_timeout_s=1, **overrides) as service:
        gated = service.repository.get("gated")
        request = gated.enqueue(await gated.decode([1]), time.monotonic() + deadline_s)
        answer = asyncio.create_task(gated.result(request))
        try:
            await wait_until(lambda: not service.live, "stuck seen")
            yield service, gated, answer
        finally:
            gated.handler.gate.set()


async def test_a_model_whose_device_thread_is_stuck_can_be_unloaded(tmp_path: Path) -> None:
    """An unload does not wait for a stuck call (app/stall.py) to return: the model is gone from
    the repository once its requests are answered (the stuck one at its deadline); the thread
    lets the replica go when the call returns."""
    async with stuck(tmp_path, deadline_s=1) as (service, gated, answer):
        with pytest.raises(DeadlineExceeded):
            await answer
        unload = asyncio.create_task(service.repository.unload("gated"))
        await wait_until(unload.done, "unloaded while the call is stuck")
        await unload
        assert not gated.handler.gate.is_set()
        with pytest.raises(NotFound):
            service.repository.get("gated")
        gated.handler.gate.set()
        await wait_until(lambda: service.live, "the call returned")
        await wait_until(lambda: not service.workers[0].holds(gated), "replica let go")


async def test_a_load_onto_a_stuck_device_thread_fails_at_once(tmp_path: Path) -> None:
    """A load that needs a device thread stuck in a call fails with why (it waited for the
    call); once the call returns, the load succeeds."""
    async with stuck(tmp_path) as (service, gated, answer):
        load = asyncio.create_task(service.repository.load("echo"))
        await wait_until(load.done, "load refused while the call is stuck")
        with pytest.raises(InvalidInput, match="device thread cpu is stuck in a call"):
            await load
        gated.handler.gate.set()
        assert [float(x) for x in await answer] == [2.0]
        await wait_until(lambda: service.live, "the call returned")
        await service.repository.load("echo")
        assert await call(service, "echo", [4]) == [8.0]


async def test_a_load_that_fails_on_one_device_holds_no_replica_on_another(
        tmp_path: Path) -> None:
    """Two device threads, one stuck in a call: a load fails there at once and attaches on the
    other; the failed load lets that replica go too."""
    async with stuck(tmp_path, devices="cpu,cpu") as (service, gated, answer):
        with pytest.raises(InvalidInput, match="is stuck in a call"):
            await service.repository.load("echo")
        held = [m.name for w in service.workers for m in w._slots]
        assert sorted(held) == ["gated", "gated"]
        gated.handler.gate.set()
        assert [float(x) for x in await answer] == [2.0]


async def test_a_model_whose_code_builds_slowly_leaves_the_server_serving(
        tmp_path: Path) -> None:
    """A model's code is built (imported, its factory called: weights read, a program loaded)
    off the event loop: while it builds, the other models answer, health answers, and a
    request for it is told it is loading (so is the index); the load answers once it serves."""
    write_config(tmp_path, "lin", 'model = "linear"\n')
    write_config(tmp_path, "slow", 'model = "tests.fakes:slow_build"\n')
    SlowBuild.reset()
    async with serving(tmp_path, model_control_mode="explicit", load_model=["lin"]) as service:
        try:
            load = asyncio.create_task(service.repository.load("slow"))
            await wait_until(SlowBuild.entered.is_set, "the factory called")
            assert len(await call(service, "lin", [[1.0, 2.0, 3.0, 4.0]])) == 1
            assert service.status == "ready"
            with pytest.raises(Unavailable, match="'slow' is loading"):
                service.repository.get("slow")
            assert {"name": "slow", "version": "", "state": "LOADING",
                    "reason": ""} in service.repository.index()
            assert states(service, "slow")["LOADING"] == 1  # as the metric says
            assert not SlowBuild.timed_out.is_set()  # all the above while the factory waited
        finally:
            SlowBuild.gate.set()
        await load
        assert await call(service, "slow", [[1.0, 2.0]]) == [[2.0, 4.0]]


async def test_a_load_under_way_when_the_server_drains_is_abandoned_at_once(
        tmp_path: Path) -> None:
    """The drain begins while a model's code builds: its load is answered 503 draining without
    waiting for the build (which may never end), and a load asked during the drain is refused
    the same way."""
    write_config(tmp_path, "lin", 'model = "linear"\n')
    write_config(tmp_path, "slow", 'model = "tests.fakes:slow_build"\n')
    SlowBuild.reset()
    async with serving(tmp_path, model_control_mode="explicit") as service:
        try:
            load = asyncio.create_task(service.repository.load("slow"))
            await wait_until(SlowBuild.entered.is_set, "the factory called")
            service.begin_drain()
            with pytest.raises(Unavailable, match="shutting down: the load of 'slow' was"):
                await load
            with pytest.raises(Unavailable, match="the load of 'lin' was abandoned"):
                await service.repository.load("lin")
            assert not SlowBuild.timed_out.is_set()  # all while the factory waited
            assert service.repository.index() == [
                {"name": "lin", "version": "", "state": "UNAVAILABLE", "reason": "unloaded"},
                {"name": "slow", "version": "", "state": "UNAVAILABLE", "reason": "unloaded"}]
        finally:
            SlowBuild.gate.set()


@asynccontextmanager
async def unload_behind_a_start_up_load(
        tmp_path: Path) -> AsyncIterator[tuple[InferenceService, asyncio.Task[None]]]:
    """A server whose start-up load of ``slow`` waits in its factory (SlowBuild), and an unload
    of ``slow`` asked meanwhile, which waits for it."""
    write_config(tmp_path, "slow", 'model = "tests.fakes:slow_build"\n')
    SlowBuild.reset()
    service = build_service(make_settings(model_repository=str(tmp_path),
                                          model_control_mode="explicit", load_model=["slow"]))
    await service.start()
    try:
        await wait_until(SlowBuild.entered.is_set, "the factory called")
        unload = asyncio.create_task(service.repository.unload("slow"))
        await asyncio.sleep(0.3)
        assert not unload.done()  # it waits for the start-up load
        yield service, unload
    finally:
        SlowBuild.gate.set()
        await service.stop(timeout_s=30)


async def test_an_unload_asked_during_a_start_up_load_waits_for_it_then_unloads(
        tmp_path: Path) -> None:
    """A start-up load holds its name's lock as any load does: an unload asked meanwhile waits,
    then unloads the model (it returned at once and the model came up serving after it)."""
    async with unload_behind_a_start_up_load(tmp_path) as (service, unload):
        SlowBuild.gate.set()
        await unload
        assert service.repository.index() == [
            {"name": "slow", "version": "", "state": "UNAVAILABLE", "reason": "unloaded"}]
        with pytest.raises(NotFound):
            service.repository.get("slow")


async def test_an_unload_waiting_for_a_start_up_load_is_abandoned_when_the_server_drains(
        tmp_path: Path) -> None:
    """The start-up load's code may never finish building: once the drain begins, the unload
    waiting for it is answered 503 at once."""
    async with unload_behind_a_start_up_load(tmp_path) as (service, unload):
        service.begin_drain()
        with pytest.raises(Unavailable, match="shutting down: the unload of 'slow' was"):
            await unload
        assert not SlowBuild.timed_out.is_set()  # all while the factory waited


async def test_a_load_whose_device_thread_died_meanwhile_is_served_by_its_successor(
        tmp_path: Path) -> None:
    """The device thread dies while a model loads: the model attaches to the thread that
    replaced it, not to the dead one (where it was never served)."""
    write_config(tmp_path, "crasher", 'model = "tests.fakes:CrashingHandler"\n')
    write_config(tmp_path, "slow", 'model = "tests.fakes:GatedLoadHandler"\n')
    GatedLoadHandler.gate.clear()
    GatedLoadHandler.entered.clear()
    async with serving(tmp_path, model_control_mode="explicit",
                       load_model=["crasher"]) as service:
        dead = service.workers[0]
        try:
            load = asyncio.create_task(service.repository.load("slow"))
            await wait_until(GatedLoadHandler.entered.is_set, "loading")
            with pytest.raises(ModelError):
                await call(service, "crasher", [666])
            await wait_until(lambda: dead not in service.workers, "restarted")
        finally:
            GatedLoadHandler.gate.set()
        await load
        assert await call(service, "slow", [2]) == [4.0]
        assert not dead.holds(service.repository.get("slow"))


async def test_a_model_unloaded_while_a_restarted_thread_warms_it_is_not_attached(
        tmp_path: Path) -> None:
    """A device thread dies; while its successor warms the models it served, one of them is
    unloaded: that one is not attached once warm (it was, held for good with nothing to serve)."""
    write_config(tmp_path, "crasher", 'model = "tests.fakes:CrashingHandler"\n')
    write_config(tmp_path, "slow", 'model = "tests.fakes:GatedLoadHandler"\n')
    GatedLoadHandler.gate.set()
    async with serving(tmp_path, model_control_mode="explicit",
                       load_model=["crasher", "slow"]) as service:
        slow = service.repository.get("slow")
        dead = service.workers[0]
        GatedLoadHandler.gate.clear()
        GatedLoadHandler.entered.clear()
        try:
            with pytest.raises(ModelError):
                await call(service, "crasher", [666])
            await wait_until(GatedLoadHandler.entered.is_set, "the successor warms slow")
            await service.repository.unload("slow")
        finally:
            GatedLoadHandler.gate.set()
        await service._background.wait()  # the successor's attaches have ended
        assert dead not in service.workers
        await wait_until(lambda: not any(w.holds(slow) for w in service.workers), "let go")
        assert await call(service, "crasher", [3]) == [6.0]


async def test_a_dead_device_thread_lets_its_replicas_go_before_they_load_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device thread that died holds no replica once a new thread replaces it: its models
    load again there beside nothing of the dead one's (on a GPU: not twice their memory)."""
    write_config(tmp_path, "crasher", 'model = "tests.fakes:CrashingHandler"\n')
    write_config(tmp_path, "slow", 'model = "tests.fakes:GatedLoadHandler"\n')
    GatedLoadHandler.gate.set()
    # A log record pytest keeps would keep the dead thread's frames, and a replica with them.
    monkeypatch.setattr(logging.getLogger("batchserve.worker"), "propagate", False)
    async with serving(tmp_path, model_control_mode="explicit",
                       load_model=["crasher", "slow"]) as service:
        slow = service.repository.get("slow")
        replica = weakref.ref(service.workers[0].replica_of(slow))
        dead = weakref.ref(service.workers[0])
        GatedLoadHandler.gate.clear()
        GatedLoadHandler.entered.clear()
        try:
            with pytest.raises(ModelError):
                await call(service, "crasher", [666])
            await wait_until(lambda: dead() not in service.workers, "restarted")
            await wait_until(GatedLoadHandler.entered.is_set, "slow loading again")
            gc.collect()
            assert replica() is None, holders(replica())
        finally:
            GatedLoadHandler.gate.set()
        # Held by the new thread, then marked served on the loop: admitted from then on.
        await wait_until(lambda: service.workers[0].holds(slow) and not slow.stranded,
                         "slow back")
        assert await call(service, "slow", [4]) == [8.0]


async def test_a_model_a_restarted_thread_cannot_take_back_fails_liveness(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A restarted device thread whose re-attach of a model fails: one error line, and the
    server is not live while that model, refused for good, is loaded; the others serve."""
    write_config(tmp_path, "crasher", 'model = "tests.fakes:LoadsOnceHandler"\n')
    write_config(tmp_path, "other", 'model = "tests.fakes:EchoHandler"\n')
    async with serving(tmp_path, model_control_mode="explicit",
                       load_model=["crasher", "other"]) as service:
        dead = service.workers[0]
        with pytest.raises(ModelError):
            await call(service, "crasher", [666])
        await wait_until(lambda: dead not in service.workers, "restarted")
        await wait_until(lambda: not service.live, "not live")
        assert ("model crasher's attach to the restarted cpu failed: RuntimeError: device "
                "memory is gone") in caplog.text
        other = service.repository.get("other")
        await wait_until(lambda: not other.stranded, "other taken back")
        assert await call(service, "other", [4]) == [8.0]
        with pytest.raises(Unavailable):
            await call(service, "crasher", [1])
        await service.repository.unload("crasher")
        assert service.live


async def test_a_model_a_restarted_thread_could_not_take_back_is_let_go_once_unloaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a model a restarted thread could not take back is unloaded, nothing holds it."""
    write_config(tmp_path, "crasher", 'model = "tests.fakes:LoadsOnceHandler"\n')
    for name in ("batchserve.worker", "batchserve.service"):  # records kept hold tracebacks
        monkeypatch.setattr(logging.getLogger(name), "propagate", False)
    async with serving(tmp_path, model_control_mode="explicit",
                       load_model=["crasher"]) as service:
        with pytest.raises(ModelError):
            await call(service, "crasher", [666])
        await wait_until(lambda: not service.live, "not live")
        lost = weakref.ref(service.repository.get("crasher"))
        await service.repository.unload("crasher")
        gc.collect()
        assert lost() is None, holders(lost())


async def test_a_model_unloaded_while_its_attach_waits_for_a_batch_is_let_go(
        tmp_path: Path) -> None:
    """A restarted thread is given a model's attach while it runs a batch, and the model is
    unloaded before the thread gets to it: once attached, the model is let go again."""
    write_config(tmp_path, "crasher", 'model = "tests.fakes:CrashingHandler"\n')
    write_config(tmp_path, "gated", 'model = "tests.fakes:GatedHandler"\n')
    write_config(tmp_path, "slow", 'model = "tests.fakes:GatedLoadHandler"\n')
    GatedLoadHandler.gate.set()
    async with serving(tmp_path, model_control_mode="explicit",
                       load_model=["crasher", "gated"]) as service:
        # Loaded last, so attached last: the restarted thread warms it after gated.
        await service.repository.load("slow")
        slow, gated = service.repository.get("slow"), service.repository.get("gated")
        dead = service.workers[0]
        GatedLoadHandler.gate.clear()
        try:
            with pytest.raises(ModelError):
                await call(service, "crasher", [666])
            await wait_until(lambda: dead not in service.workers and service.workers[0].holds(gated)
                             and not gated.stranded, "gated on the new thread")
            fresh = service.workers[0]
            batch = asyncio.create_task(call(service, "gated", [1]))
            await wait_until(gated.handler.entered.is_set, "the new thread in a batch")
            GatedLoadHandler.gate.set()
            await wait_until(lambda: bool(fresh._commands), "slow's attach given")
            await service.repository.unload("slow")
        finally:
            GatedLoadHandler.gate.set()
            gated.handler.gate.set()
        assert await batch == [2.0]
        await service._background.wait()  # the attach is done; the thread lets it go next
        await wait_until(lambda: not fresh._commands and not fresh.holds(slow), "let go")


async def test_none_mode_refuses_load_and_unload(tmp_path: Path) -> None:
    write_config(tmp_path, "echo", 'model = "tests.fakes:EchoHandler"\n')
    async with serving(tmp_path) as service:
        for action in (service.repository.load("echo"), service.repository.unload("echo")):
            with pytest.raises(InvalidInput, match="model-control-mode none"):
                await action


async def test_a_new_version_takes_over_without_losing_a_request(
        tmp_path: Path, exported: dict[int, Path]) -> None:
    add_version(tmp_path, "scale", 1, exported[1])
    async with serving(tmp_path, model_control_mode="explicit", load_model=["scale"]) as service:
        repo = service.repository
        old = repo.get("scale")
        answers: list[list[Any]] = []
        stop = asyncio.Event()

        async def traffic() -> None:
            while not stop.is_set():
                answers.append(await call(service, "scale", [[1, 1, 1]]))

        clients = [asyncio.create_task(traffic()) for _ in range(4)]
        await wait_until(lambda: len(answers) > 20, "traffic on v1")
        add_version(tmp_path, "scale", 2, exported[2])
        await repo.load("scale")  # answers once v2 is ready and v1 has drained
        assert repo.get("scale").version == "2" and old.state.value == "UNLOADING"
        count = len(answers)
        await wait_until(lambda: len(answers) > count + 20, "traffic on v2")
        stop.set()
        await asyncio.gather(*clients)
    seen = {tuple(a[0]) for a in answers}
    assert seen == {(1.0, 1.0, 1.0), (2.0, 2.0, 2.0)}  # v1 then v2, nothing else, no error
    first_v2 = next(i for i, a in enumerate(answers) if a[0][0] == 2.0)
    assert all(a[0][0] == 2.0 for a in answers[first_v2 + 8:])  # traffic moved and stayed


async def test_the_version_replaced_serves_till_the_front_ends_route_past_it(
        tmp_path: Path, exported: dict[int, Path]) -> None:
    """A new version takes the default traffic (``moves`` counts it) at once; the one it
    replaces drains only once ``before_retire``'s waits end (the front ends holding the new
    snapshot, app/bridge.py): till then what was routed to it is answered, not refused."""
    add_version(tmp_path, "scale", 1, exported[1])
    async with serving(tmp_path, model_control_mode="explicit", load_model=["scale"]) as service:
        repo = service.repository
        entered, routed = asyncio.Event(), asyncio.Event()

        async def front_ends_routed() -> None:
            entered.set()
            await routed.wait()

        service.before_retire.append(front_ends_routed)
        add_version(tmp_path, "scale", 2, exported[2])
        moves = repo.moves
        load = asyncio.create_task(repo.load("scale"))
        await wait_until(entered.is_set, "the load waiting for the front ends")
        assert repo.moves == moves + 1 and repo.get("scale").version == "2"
        assert await call(service, "scale", [[1, 1, 1]], version="1") == [[1.0, 1.0, 1.0]]
        assert not load.done()
        routed.set()
        await load
        with pytest.raises(NotFound):
            repo.get("scale", "1")


async def test_a_load_with_config_reloads_with_those_settings(tmp_path: Path) -> None:
    write_config(tmp_path, "echo", 'model = "tests.fakes:EchoHandler"\n')
    async with serving(tmp_path, model_control_mode="explicit", load_model=["echo"]) as service:
        repo = service.repository
        await repo.load("echo", {"max_batch_size": 3})
        assert repo.get("echo").batch_limit == 3
        with pytest.raises(InvalidInput, match=TYPO):
            await repo.load("echo", {"max_batch_sise": 3})
        assert repo.get("echo").batch_limit == 3  # the failed reload left it serving
        with pytest.raises(InvalidInput, match="no such model"):
            await repo.load("nope")
        assert repo.names() == ["echo"]  # a name that is not there is not remembered


async def test_the_single_model_setting_is_a_repository_of_one() -> None:
    settings = make_settings(model="linear", model_control_mode="explicit",
                             load_model=["linear"], queue_capacity=64)
    service = build_service(settings)
    await service.start()
    try:
        repo = service.repository
        await wait_until(lambda: not repo.starting, "start-up loads done")
        with pytest.raises(InvalidInput, match="no such model; this server serves 'linear'"):
            await repo.load("0")
        assert repo.names() == ["linear"]
        await repo.load("linear", {"max_batch_size": 3})
        reloaded = repo.get("linear")
        assert reloaded.batch_limit == 3 and reloaded.settings.queue_capacity == 64
        with pytest.raises(InvalidInput, match=TYPO):
            await repo.load("linear", {"max_batch_sise": 3})
        assert repo.get("linear") is reloaded  # the failed reload left it serving
        assert len(await call(service, "linear", [[1.0, 2.0, 3.0, 4.0]])) == 1
        await repo.unload("0")  # not loaded: nothing to do, as for any name
        assert repo.names() == ["linear"]
    finally:
        await service.stop(timeout_s=30)


async def test_per_model_metrics_carry_the_model(tmp_path: Path) -> None:
    write_config(tmp_path, "a", 'model = "tests.fakes:EchoHandler"\n')
    write_config(tmp_path, "b", 'model = "tests.fakes:EchoHandler"\n')
    async with serving(tmp_path) as service:
        await call(service, "a", [1, 2])
        await call(service, "b", [3])
        registry = service.metrics.registry
        await asyncio.sleep(0)  # a batch is counted once its answers are out (ServedModel.deliver)
        assert sample(registry, "batchserve_batch_size_sum", model="a") == 2
        assert sample(registry, "batchserve_batch_size_sum", model="b") == 1
        assert sample(registry, "batchserve_model_state", model="a", state="READY") == 1


def states(service: InferenceService, name: str) -> dict[str, float]:
    """``batchserve_model_state`` of ``name``'s version 1, by state."""
    return {state: sample(service.metrics.registry, "batchserve_model_state", model=name,
                          version="1", state=state)
            for state in ("LOADING", "READY", "UNLOADING", "UNAVAILABLE")}


async def test_an_unloaded_version_reads_unavailable_and_no_gauge_reads_it(
        tmp_path: Path) -> None:
    """A reload's gauges read the new object; once the model is unloaded its state metric says
    UNAVAILABLE (as the repository index does), its per-device gauges (batch limit, cost
    curve) are gone, and nothing holds it."""
    write_config(tmp_path, "a", 'model = "linear"\n')
    async with serving(tmp_path, model_control_mode="explicit") as service:
        registry = service.metrics.registry
        await service.repository.load("a")
        assert len(await call(service, "a", [[1.0, 2.0, 3.0, 4.0]])) == 1

        def gauges() -> list[str]:
            return [s.name for f in registry.collect() if f.type == "gauge"
                    and f.name != "batchserve_model_state" for s in f.samples
                    if s.labels.get("model") == "a"]

        first = weakref.ref(service.repository.get("a"))
        await service.repository.load("a", {})  # a reload: another object serves version 1
        gc.collect()
        assert first() is None, holders(first())
        assert states(service, "a")["READY"] == 1
        assert {"batchserve_effective_batch_limit", "batchserve_cost_seconds"} <= set(gauges())
        gone = weakref.ref(service.repository.get("a"))
        await service.repository.unload("a")
        assert states(service, "a") == {"LOADING": 0, "READY": 0, "UNLOADING": 0,
                                         "UNAVAILABLE": 1}
        assert gauges() == []
        gc.collect()
        assert gone() is None, holders(gone())


@pytest.fixture
def frozen_start(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process froze its start-up objects, as a serving one does once ready."""
    thresholds = gc.get_threshold()
    monkeypatch.setattr(process, "_startup_frozen", False)
    freeze_startup_objects()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("frozen_start")
async def test_where_start_up_froze_an_unloaded_model_is_collected(tmp_path: Path) -> None:
    """A serving process refreezes its heap after an unload: the unloaded model, which its
    unload's frames held until the end, is collected then, not frozen with what lives on."""
    write_config(tmp_path, "a", 'model = "linear"\n')
    async with serving(tmp_path, model_control_mode="explicit") as service:
        await service.repository.load("a")
        assert len(await call(service, "a", [[1.0, 2.0, 3.0, 4.0]])) == 1
        gone = weakref.ref(service.repository.get("a"))
        await service.repository.unload("a")
        await asyncio.sleep(0)  # the refreeze's turn
        gc.collect()
        assert gone() is None, holders(gone())


async def test_a_model_unloaded_while_its_cost_is_measured_leaves_no_gauge(
        tmp_path: Path) -> None:
    """A model without warm-up examples has its cost measured after its first request; if it
    is unloaded meanwhile, the measurement's end exports no cost gauge of it."""
    write_config(tmp_path, "wide", 'model = "tests.fakes:gated_wide"\n')
    GatedWide.gate.clear()
    GatedWide.entered.clear()
    async with serving(tmp_path, model_control_mode="explicit") as service:
        try:
            await service.repository.load("wide")
            assert await call(service, "wide", [[1.0, 2.0]]) == [[2.0, 4.0]]
            await wait_until(GatedWide.entered.is_set, "measuring")
            await service.repository.unload("wide")
        finally:
            GatedWide.gate.set()
        await service._background.wait()
        assert sample(service.metrics.registry, "batchserve_cost_seconds", model="wide") == 0


async def test_each_served_version_has_its_gauges_and_a_retired_one_leaves_none(
        tmp_path: Path, exported: dict[int, Path]) -> None:
    """Two versions of a name served: each has its own per-device gauges (batch limit, cost
    curve); once version 1 is retired, its series are gone, version 2's stay, and nothing holds
    the retired version."""
    add_version(tmp_path, "scale", 1, exported[1])
    add_version(tmp_path, "scale", 2, exported[2])
    write_config(tmp_path, "scale", "versions = [1, 2]\n")
    async with serving(tmp_path, model_control_mode="explicit", load_model=["scale"]) as service:
        repo = service.repository

        def versions(gauge: str) -> set[str]:
            return {s.labels["version"] for f in service.metrics.registry.collect()
                    for s in f.samples if s.name == gauge and s.labels["model"] == "scale"}

        for gauge in ("batchserve_effective_batch_limit", "batchserve_cost_seconds"):
            assert versions(gauge) == {"1", "2"}
        old = weakref.ref(repo.get("scale", "1"))
        await repo.load("scale", {"versions": [2]})
        assert repo.index() == [{"name": "scale", "version": "2", "state": "READY", "reason": ""}]
        gc.collect()
        assert old() is None, holders(old())
        for gauge in ("batchserve_effective_batch_limit", "batchserve_cost_seconds"):
            assert versions(gauge) == {"2"}
        assert sample(service.metrics.registry, "batchserve_effective_batch_limit",
                      model="scale", version="2") == repo.get("scale", "2").batch_limit
        assert states(service, "scale")["UNAVAILABLE"] == 1  # version 1's


async def test_a_failed_load_reads_unavailable_and_a_failed_reload_ready(tmp_path: Path) -> None:
    """A version whose load failed reads UNAVAILABLE; one whose reload failed reads READY, the
    version before serving on."""
    async with stuck(tmp_path) as (service, gated, answer):
        with pytest.raises(InvalidInput, match="is stuck in a call"):
            await service.repository.load("echo")
        assert states(service, "echo") == {"LOADING": 0, "READY": 0, "UNLOADING": 0,
                                            "UNAVAILABLE": 1}
        with pytest.raises(InvalidInput, match="is stuck in a call"):
            await service.repository.load("gated", {})
        assert service.repository.get("gated") is gated
        assert states(service, "gated") == {"LOADING": 0, "READY": 1, "UNLOADING": 0,
                                             "UNAVAILABLE": 0}
        gated.handler.gate.set()
        assert [float(x) for x in await answer] == [2.0]


async def test_a_version_whose_code_fails_to_build_reads_unavailable(tmp_path: Path) -> None:
    """A model whose factory raises: its load fails saying why, and its state metric reads
    UNAVAILABLE (it read LOADING while its code built), as the index does."""
    write_config(tmp_path, "broken", 'model = "tests.fakes:raising_factory"\n')
    async with serving(tmp_path, model_control_mode="explicit") as service:
        with pytest.raises(InvalidInput, match="raised RuntimeError: no weights here"):
            await service.repository.load("broken")
        assert states(service, "broken") == {"LOADING": 0, "READY": 0, "UNLOADING": 0,
                                              "UNAVAILABLE": 1}
        assert service.repository.index()[0]["state"] == "UNAVAILABLE"


def cuda_tensors() -> list[tuple[tuple[int, ...], list[str]]]:
    """The CUDA tensors of 1 MB or more still alive, each with what refers to it: what a
    failing memory check shows."""
    found = []
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.is_cuda and obj.nbytes >= 2**20:
            found.append((tuple(obj.shape), [type(r).__name__ for r in gc.get_referrers(obj)]))
    return found


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graphs", ["false", "true"])
async def test_two_models_on_one_gpu_and_unload_frees_its_memory(tmp_path: Path,
                                                                  graphs: str) -> None:
    """mlp (~76 MB of float32 weights) and linear share one GPU's device thread; unloading mlp
    gives its memory back (torch.cuda.memory_allocated), load after load, with its CUDA graphs
    too. mlp's first load and batches leave 33 MiB for good with no CUDA tensor alive (on an
    H100, 2026-11-28: before 34.6 MB, loaded 110.4 MB, the weights' 75.8 MB exactly, after the
    unload 69.2 MB): a cuBLAS workspace, which torch keeps for each stream it has run a product
    on (a probe there: 32.3 MiB for a product on a new stream, kept after the stream is gone,
    freed only by torch._C._cuda_clearCublasWorkspaces). So ``before`` is taken after a first
    load, batches and unload, and every load after must give all of its memory back; earlier
    tests' garbage is collected first."""
    write_config(tmp_path, "mlp", f'model = "mlp"\ncuda_graphs = {graphs}\n')
    write_config(tmp_path, "lin", 'model = "linear"\n')

    async def load_serve_unload(service: InferenceService) -> int:
        """mlp loaded, serving beside linear, unloaded: the memory it held while loaded."""
        await service.repository.load("mlp")
        loaded = torch.cuda.memory_allocated()
        pairs = await asyncio.gather(*(asyncio.gather(
            call(service, "mlp", [[float(i)] * 512]), call(service, "lin", [[1.0, 2, 3, 4]]))
            for i in range(50)))
        assert all(len(m[0]) == 16 and len(lin[0]) == 2 for m, lin in pairs)
        await service.repository.unload("mlp")
        gc.collect()
        torch.cuda.synchronize()
        return loaded

    async with serving(tmp_path, devices="cuda", model_control_mode="explicit",
                       load_model=["lin"]) as service:
        assert len(service.workers) == 1
        assert await call(service, "lin", [[1.0, 2, 3, 4]])
        await load_serve_unload(service)
        before = torch.cuda.memory_allocated()
        for _ in range(2):
            loaded = await load_serve_unload(service)
            assert loaded - before > 50 * 2**20
            assert torch.cuda.memory_allocated() - before < 2**20, (before, loaded,
                                                                     cuda_tensors())
        assert await call(service, "lin", [[1.0, 2, 3, 4]])  # the other model serves on

async def test_a_load_whose_config_quotes_a_megabyte_records_a_kilobyte(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A load's config is a client's: a reason quoting a key of 100,000 characters is cut
    (``bounded``) where it is kept, in the index, and in the log line."""
    write_config(tmp_path, "broken", 'model = "tests.fakes:raising_factory"\n')
    async with serving(tmp_path, model_control_mode="explicit") as service:
        with caplog.at_level(logging.ERROR, logger="batchserve.models"), \
                pytest.raises(InvalidInput, match="unknown settings kkkk"):
            await service.repository.load("broken", {"k" * 100_000: 1})
        [entry] = service.repository.index()
        assert entry["state"] == "UNAVAILABLE" and entry["reason"].startswith("unknown settings")
        assert 1_000 < len(entry["reason"]) < 1_100
        assert [len(r.getMessage()) < 1_200 for r in caplog.records] == [True]
