"""app/process.py: the process-wide tuning the entry points apply."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import resource
import shutil
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from app import process
from app.process import (
    GIL_SWITCH_INTERVAL_S,
    LOADING_FREEZE_S,
    OWN_FILES,
    YOUNG_COLLECTION_AT,
    ShortSwitch,
    fit_torch_threads,
    freeze_startup_objects,
    refreeze,
    refrozen,
    tune_for_serving,
)


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    interval, threads, thresholds = sys.getswitchinterval(), torch.get_num_threads(), \
        gc.get_threshold()
    monkeypatch.setattr(process, "_startup_frozen", False)  # as the tests' own process
    yield
    sys.setswitchinterval(interval)
    torch.set_num_threads(threads)
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored")
def test_the_switch_interval_is_lowered_never_raised() -> None:
    sys.setswitchinterval(0.005)
    tune_for_serving()
    assert sys.getswitchinterval() == pytest.approx(GIL_SWITCH_INTERVAL_S)
    sys.setswitchinterval(0.00005)
    tune_for_serving()
    assert sys.getswitchinterval() == pytest.approx(0.00005, abs=2e-6)  # whole microseconds


@pytest.mark.usefixtures("restored")
def test_what_is_alive_at_start_up_leaves_the_collectors_reach() -> None:
    kept = [object() for _ in range(1000)]
    freeze_startup_objects()
    assert gc.get_freeze_count() >= len(kept)


@pytest.mark.usefixtures("restored")
def test_once_serving_a_young_collection_waits_for_many_more_new_objects() -> None:
    """The requests in flight hold thousands of objects: at CPython's 700 a front end with 128
    of them ran a young collection every 30 requests, finding nothing."""
    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    freeze_startup_objects()
    gc.callbacks.append(count)
    try:
        in_flight = [[i] for i in range(YOUNG_COLLECTION_AT // 2)]  # lists: tracked objects
    finally:
        gc.callbacks.remove(count)
    assert len(in_flight) == YOUNG_COLLECTION_AT // 2 and started == []


@pytest.mark.usefixtures("restored")
def test_what_a_later_load_leaves_alive_is_frozen_once_start_up_froze() -> None:
    gc.unfreeze()
    loaded = [[i] for i in range(1000)]  # lists: objects the collector tracks
    assert refreeze() is None and gc.get_freeze_count() == 0  # tests, tools
    freeze_startup_objects()
    at_start = gc.get_freeze_count()
    assert at_start >= len(loaded)
    later = [[i] for i in range(1000)]
    ids = {id(x) for x in later}

    def collectable() -> int:
        """How many of ``later`` the collector still scans (frozen ones are in no generation)."""
        return sum(id(o) in ids for g in range(3) for o in gc.get_objects(generation=g))

    assert collectable() == len(later)
    frozen = refreeze()  # its own collection may free objects frozen at start-up since gone
    assert frozen is not None and frozen >= len(later) and collectable() == 0


class Node:
    other: Node | None = None


def frozen_garbage() -> weakref.ref[Node]:
    """A cycle frozen while alive and garbage since: only a freeze's own collection frees it."""
    node = Node()
    node.other = node
    gc.freeze()
    gone = weakref.ref(node)
    del node
    gc.collect()
    assert gone() is not None  # out of the collector's reach
    return gone


@pytest.mark.usefixtures("restored")
def test_a_refreeze_freezes_no_garbage() -> None:
    """Garbage already in the oldest generation (which young collections leave) is collected
    before the freeze, not frozen for good."""
    gc.unfreeze()
    freeze_startup_objects()
    node = Node()
    node.other = node  # a cycle: only a collection frees it
    gc.collect(1)
    gc.collect(1)  # now in the oldest generation
    gone = weakref.ref(node)
    del node
    refreeze()
    assert gone() is None


@pytest.mark.usefixtures("restored")
def test_garbage_frozen_before_is_collected_by_the_next_freeze() -> None:
    """As what only an unloaded model held, frozen at start-up or at its load."""
    gc.unfreeze()
    gone = frozen_garbage()
    freeze_startup_objects()
    assert gone() is None


@pytest.mark.asyncio
@pytest.mark.usefixtures("restored")
async def test_a_load_is_frozen_as_it_goes_and_refrozen_at_the_end(
        caplog: pytest.LogCaptureFixture) -> None:
    """(Which objects are frozen is asked, not the freeze count: objects frozen before, freed
    meanwhile by another thread of the test process, leave it, 4 of them in one clean-clone
    run.)"""
    gc.unfreeze()
    freeze_startup_objects()
    caplog.set_level(logging.DEBUG, "batchserve")
    with refrozen("the load", asyncio.get_running_loop()):
        made = [[i] for i in range(1000)]
        await asyncio.sleep(3 * LOADING_FREEZE_S)  # the loop serves on, its tick too
        collected = {id(o) for o in gc.get_objects()}  # the generations: frozen objects are not
        assert not any(id(x) in collected for x in [made, *made])  # frozen while it runs
        gone = frozen_garbage()
    assert gone() is None  # collected at the end
    assert re.search(r"after the load: \d+ objects frozen", caplog.text)


@pytest.mark.asyncio
@pytest.mark.usefixtures("restored")
async def test_a_failed_load_is_refrozen_too() -> None:
    gc.unfreeze()
    freeze_startup_objects()
    with pytest.raises(RuntimeError), refrozen("a load", asyncio.get_running_loop()):
        gone = frozen_garbage()
        raise RuntimeError("its weights are corrupt")
    assert gone() is None


@pytest.mark.asyncio
@pytest.mark.usefixtures("restored")
async def test_a_load_under_way_when_start_up_freezes_is_refrozen_at_its_end(
        caplog: pytest.LogCaptureFixture) -> None:
    """A load asked for as the server says it is ready may begin before the start-up freeze."""
    gc.unfreeze()
    caplog.set_level(logging.DEBUG, "batchserve")
    with refrozen("the early load", asyncio.get_running_loop()):
        await asyncio.sleep(2 * LOADING_FREEZE_S)
        assert gc.get_freeze_count() == 0  # nothing frozen before the start-up freeze
        freeze_startup_objects()
        made = [[i] for i in range(1000)]
    collected = {id(o) for o in gc.get_objects()}  # the generations: frozen objects are not
    assert not any(id(x) in collected for x in [made, *made])
    assert re.search(r"after the early load: \d+ objects frozen", caplog.text)


@pytest.mark.usefixtures("restored")
def test_objects_python_froze_itself_are_no_start_up_freeze(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CPython 3.12 starts with objects of its own frozen (375): a process that never froze
    its start-up objects (tests, tools) still refreezes nothing, so what it unloads is left
    to the collector, not frozen with it. (What refreeze would freeze is recorded, not the
    freeze count: another thread of the test process may freeze meanwhile.)"""
    gc.unfreeze()
    gc.freeze()  # as 3.12 starts
    froze: list[bool] = []
    monkeypatch.setattr(process, "freeze_startup_objects", lambda: froze.append(True))
    assert refreeze() is None and froze == []


def test_nothing_is_frozen_around_a_load_where_start_up_froze_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    gc.unfreeze()
    caplog.set_level(logging.DEBUG, "batchserve")
    with refrozen("a load in a test"):
        pass
    assert gc.get_freeze_count() == 0 and "objects frozen" not in caplog.text


@pytest.mark.skipif(shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs taskset and two cores")
def test_usable_cores_are_those_the_affinity_allows() -> None:
    """Where ``os.cpu_count`` sees every core of the machine."""
    code = "from app.process import usable_cores; print(usable_cores())"
    pinned = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", code],
                            capture_output=True, text=True, check=True)
    assert pinned.stdout.strip() == "1"
    assert process.usable_cores() == len(os.sched_getaffinity(0))


@pytest.mark.usefixtures("restored")
def test_torch_runs_no_more_threads_than_the_usable_cores(
        monkeypatch: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(2)
    monkeypatch.setattr(process, "usable_cores", lambda: 1)  # a quota of one CPU
    fit_torch_threads()
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    monkeypatch.setattr(process, "usable_cores", lambda: 64)  # never more than torch's own
    fit_torch_threads()
    assert torch.get_num_threads() == 2



@pytest.mark.usefixtures("restored")
def test_a_short_switch_holds_while_any_thread_is_inside() -> None:
    """Two device threads' launches overlap: the interval is short until the last one leaves,
    then the one before comes back; a shorter one set before is kept."""
    sys.setswitchinterval(0.001)
    short = ShortSwitch(0.00001)
    first_in, second_out = threading.Event(), threading.Event()
    seen: list[float] = []

    def other() -> None:
        with short:
            first_in.set()
            second_out.wait(5)
            seen.append(sys.getswitchinterval())

    thread = threading.Thread(target=other)
    with short:
        thread.start()
        assert first_in.wait(5)
        assert sys.getswitchinterval() == pytest.approx(0.00001)
    second_out.set()  # this thread has left; the other is still inside
    thread.join(5)
    assert seen == [pytest.approx(0.00001)]
    assert sys.getswitchinterval() == pytest.approx(0.001)

    sys.setswitchinterval(0.000002)
    with short:
        assert sys.getswitchinterval() == pytest.approx(0.000002)
    assert sys.getswitchinterval() == pytest.approx(0.000002)


@pytest.mark.usefixtures("restored")
def test_a_short_switch_is_left_on_an_error() -> None:
    sys.setswitchinterval(0.001)
    with pytest.raises(RuntimeError), ShortSwitch(0.00001):
        raise RuntimeError("the launch failed")
    assert sys.getswitchinterval() == pytest.approx(0.001)



def _open_files_after_fit(soft: int, hard: int, max_connections: int,
                          grpc: bool = False) -> tuple[list[int], str]:
    """In a process started with these open-file limits: the limits after ``fit_open_files``,
    and what it logged."""
    code = ("import logging, resource\n"
            "from app.process import fit_open_files\n"
            "logging.basicConfig(format='%(message)s')\n"
            f"got = fit_open_files({max_connections}, grpc={grpc})\n"
            "print(got, *resource.getrlimit(resource.RLIMIT_NOFILE))\n")
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
    return [int(v) for v in done.stdout.split()], done.stderr


def _hard_open_files() -> int:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2000:
        pytest.skip(f"needs a hard limit on open files of 2000 or more (here {hard})")
    return 2000


def test_a_low_soft_limit_on_open_files_is_raised_to_what_the_connections_need() -> None:
    """A container's 1024 under a higher hard limit ran out of descriptors before
    max_connections: the server raises its soft limit (the front ends inherit it)."""
    hard = _hard_open_files()
    limits, logged = _open_files_after_fit(100, hard, 1000)
    assert limits == [1000 + OWN_FILES, 1000 + OWN_FILES, hard]
    assert logged == ""


def test_with_grpc_the_open_files_fit_its_connections_too() -> None:
    """gRPC's listener holds up to max_connections connections of its own beside HTTP's."""
    hard = _hard_open_files()
    limits, logged = _open_files_after_fit(100, hard, 500, grpc=True)
    assert limits == [1000 + OWN_FILES, 1000 + OWN_FILES, hard]
    limits, logged = _open_files_after_fit(100, 600, 500, grpc=True)
    assert limits == [600, 600, 600]
    assert "max_connections (500) for each of HTTP and gRPC" in logged


def test_a_soft_limit_on_open_files_is_never_lowered() -> None:
    hard = _hard_open_files()
    assert _open_files_after_fit(1900, hard, 10)[0] == [1900, 1900, hard]


def test_a_hard_limit_too_low_for_max_connections_is_said_at_start() -> None:
    limits, logged = _open_files_after_fit(100, 600, 1000)
    assert limits == [600, 600, 600]
    assert "limited to 600" in logged and "max_connections (1000)" in logged
    assert f"past about {600 - OWN_FILES} connections" in logged


def test_memory_is_the_machines_or_less_under_a_cgroup_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The least of the machine's memory and the limits on this process's cgroup and those
    above it (v2), or v1's limit."""
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    root, own = tmp_path / "cgroup", tmp_path / "self-cgroup"
    unit = root / "system.slice" / "batchserve.service"
    unit.mkdir(parents=True)
    monkeypatch.setattr(process, "CGROUP_ROOT", root)
    monkeypatch.setattr(process, "OWN_CGROUPS", own)
    assert process.memory_bytes() == machine  # no cgroup files at all
    own.write_text("0::/system.slice/batchserve.service\n")
    (root / "memory.max").write_text("max\n")  # v2 without a limit
    assert process.memory_bytes() == machine
    (unit / "memory.max").write_text("536870912\n")  # the unit's MemoryMax=512M
    assert process.memory_bytes() == 536870912
    (root / "system.slice" / "memory.max").write_text("268435456\n")  # the slice's, lower
    assert process.memory_bytes() == 268435456
    own.write_text("0::/\n")  # in its own cgroup namespace: a container's limit is the root's
    (root / "memory.max").write_text("1073741824\n")
    assert process.memory_bytes() == 1073741824
    (root / "memory.max").unlink()
    (unit / "memory.max").unlink()
    (root / "system.slice" / "memory.max").unlink()
    v1 = root / "memory" / "pod" / "box"  # v1: the memory hierarchy's own folder
    v1.mkdir(parents=True)
    own.write_text("4:memory:/pod/box\n1:cpu:/\n0::/\n")
    (root / "memory" / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n")  # no limit
    assert process.memory_bytes() == machine
    (v1.parent / "memory.limit_in_bytes").write_text("734003200\n")
    assert process.memory_bytes() == 734003200


def test_a_v1_hierarchy_of_several_controllers_is_read_nearest_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """v1 mounts cpu and cpuacct as one hierarchy ("2:cpu,cpuacct:/pod/box"): a CPU quota on
    the pod or the box is found by either name."""
    root, own = tmp_path / "cgroup", tmp_path / "self-cgroup"
    box = root / "cpu" / "pod" / "box"
    box.mkdir(parents=True)
    monkeypatch.setattr(process, "CGROUP_ROOT", root)
    monkeypatch.setattr(process, "OWN_CGROUPS", own)
    own.write_text("2:cpu,cpuacct:/pod/box\n0::/\n")
    (box / "cpu.cfs_quota_us").write_text("-1\n")
    (box.parent / "cpu.cfs_quota_us").write_text("800000\n")
    assert process.cgroup_files("cpu.max", "cpu", "cpu.cfs_quota_us") == [
        (box / "cpu.cfs_quota_us", "-1"), (box.parent / "cpu.cfs_quota_us", "800000")]


def test_a_cpu_quota_on_any_own_cgroup_bounds_the_usable_cores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A systemd unit's CPUQuota or a pod's limit on a cgroup above the process counts, also
    where the process does not see its cgroup as the root (loky reads the root's only)."""
    root, own = tmp_path / "cgroup", tmp_path / "self-cgroup"
    unit = root / "system.slice" / "batchserve.service"
    unit.mkdir(parents=True)
    monkeypatch.setattr(process, "CGROUP_ROOT", root)
    monkeypatch.setattr(process, "OWN_CGROUPS", own)
    monkeypatch.setattr(process, "cpu_count", lambda only_physical_cores: 16)
    own.write_text("0::/system.slice/batchserve.service\n")
    (unit / "cpu.max").write_text("max 100000\n")
    assert (process.cpu_quota(), process.usable_cores()) == (None, 16)
    (root / "system.slice" / "cpu.max").write_text("250000 100000\n")  # 2.5 CPUs: 3 cores
    assert (process.cpu_quota(), process.usable_cores()) == (2.5, 3)
    (unit / "cpu.max").write_text("50000 100000\n")  # half a CPU: still one core
    assert (process.cpu_quota(), process.usable_cores()) == (0.5, 1)
    own.write_text("1:cpu,cpuacct:/pod\n0::/nowhere\n")  # v1: the quota over its period
    v1 = root / "cpu" / "pod"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert (process.cpu_quota(), process.usable_cores()) == (None, 16)
    (v1 / "cpu.cfs_quota_us").write_text("400000\n")
    assert (process.cpu_quota(), process.usable_cores()) == (4.0, 4)
