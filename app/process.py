"""Process-wide tuning, done by the entry points (``batchserve serve`` and ``worker``), and the
shorter GIL switch interval of a CUDA launch (``launching``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import os
import resource
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from loky import cpu_count

GIL_SWITCH_INTERVAL_S = 0.0001
# While a device thread launches a CUDA batch and waits for it (app/transfer.py).
LAUNCH_SWITCH_INTERVAL_S = 0.000005
# While a model loads into a serving process, what exists is frozen this often (``refrozen``).
LOADING_FREEZE_S = 0.1

log = logging.getLogger("batchserve")


def usable_cores() -> int:
    """The cores this process may use: the machine's, fewer where its CPU affinity (taskset,
    ``docker --cpuset-cpus``) or a cgroup CPU quota (``docker --cpus``, a Kubernetes CPU
    limit, a systemd unit's ``CPUQuota``) allows fewer, a quota of 2.5 CPUs counting 3.
    ``os.cpu_count`` sees the host's; loky's reads the quota where a container shows its
    cgroup as the root, ``cpu_quota`` on the process's own cgroups and those above."""
    cores = int(cpu_count(only_physical_cores=False))
    quota = cpu_quota()
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


# Where cgroups are mounted, and where this process's own are named: v2's line "0::/path", v1's
# "N:memory:/path".
CGROUP_ROOT = Path("/sys/fs/cgroup")
OWN_CGROUPS = Path("/proc/self/cgroup")


def cgroup_files(v2_name: str, controller: str, v1_name: str) -> list[tuple[Path, str]]:
    """(path, text) of each ``v2_name`` (cgroup v2) and each ``v1_name`` of ``controller``'s
    hierarchy (v1) on this process's own cgroups and those above them, nearest first: a limit
    may be set on any of them."""
    try:
        lines = OWN_CGROUPS.read_text().splitlines()
    except OSError:
        lines = []
    own = {kind: path for kinds, path in (line.split(":", 2)[1:] for line in lines
                                          if line.count(":") >= 2) for kind in kinds.split(",")}
    found = []
    for kind, mounted, name in (("", CGROUP_ROOT, v2_name),
                                (controller, CGROUP_ROOT / controller, v1_name)):
        where = mounted / own.get(kind, "/").lstrip("/")
        for folder in (where, *where.parents):
            if not folder.is_relative_to(mounted):
                break
            try:
                found.append((folder / name, (folder / name).read_text().strip()))
            except OSError:
                continue
    return found


def cpu_quota() -> float | None:
    """The fewest CPUs a quota on this process's cgroups allows (v2 ``cpu.max`` "150000
    100000": 1.5; v1 ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``); None without one."""
    quotas = []
    for path, text in cgroup_files("cpu.max", "cpu", "cpu.cfs_quota_us"):
        limit, _, period = text.partition(" ")
        if path.name != "cpu.max":
            try:
                period = (path.parent / "cpu.cfs_period_us").read_text().strip()
            except OSError:
                continue
        if limit.isdigit() and period.isdigit() and int(period) > 0:  # "max", -1: no quota
            quotas.append(int(limit) / int(period))
    return min(quotas, default=None)


def memory_bytes() -> int:
    """The memory this process may use: the machine's, or less under a cgroup memory limit
    (``docker --memory``, a Kubernetes memory limit, a systemd unit's ``MemoryMax``) on its
    own cgroup or one above it, which the machine's figure does not see."""
    most = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for _, text in cgroup_files("memory.max", "memory", "memory.limit_in_bytes"):
        if text.isdigit():  # v2 says "max" where there is no limit, v1 a huge number
            most = min(most, int(text))
    return most


def tune_for_serving() -> None:
    """Device threads release the GIL inside every torch op and must win it back from the event
    loop afterwards, waiting up to one switch interval per op. Next to a thread that holds the
    GIL, a batch of 32 of the eager MLP took 103 ms at CPython's default 5 ms, 40 at 1 ms and 29
    at 0.1 ms (24.7 alone; ``python -m bench.gil_switch``)."""
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))


# Files a serving process holds open beside its clients' connections: its loop's, its logs',
# the links to the front ends, a model's files while it loads.
OWN_FILES = 256


def fit_open_files(max_connections: int, grpc: bool = False) -> int:
    """Raise this process's soft limit on open files, which the front ends it starts inherit,
    to what ``max_connections`` connections (as many again with ``grpc``: its listener takes
    that many of its own) and ``OWN_FILES`` need, as far as the hard limit lets it; never
    lower it. Containers often start with a soft limit of 1024 under a far
    higher hard one: there, a flood of connections ran out of descriptors before
    ``max_connections``, and uvloop closed the connections it could not take unanswered
    instead of refusing them 503. Where the hard limit is too low, a warning says so. Returns
    the soft limit."""
    listeners = 2 if grpc else 1
    needed = max_connections * listeners + OWN_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    if hard != resource.RLIM_INFINITY and hard < needed:
        log.warning("open files are limited to %d a process, fewer than max_connections (%d)%s "
                    "and the server's own %d need: past about %d connections, new ones are "
                    "closed unanswered instead of refused; raise the limit (docker run "
                    "--ulimit nofile=N) or lower max_connections", hard, max_connections,
                    " for each of HTTP and gRPC" if grpc else "", OWN_FILES,
                    max(hard - OWN_FILES, 0))
        needed = hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return needed


def fit_torch_threads() -> None:
    """In a process that computes (not a front end, which never imports torch): torch sizes
    its thread pool by the CPU affinity alone, so under a CPU quota it would run more threads
    than the quota pays for, and they would be throttled in turn. A torch_threads setting is
    applied after this (app/runtime.py) and wins."""
    import torch

    torch.set_num_threads(min(torch.get_num_threads(), usable_cores()))


def one_torch_thread() -> None:
    """In a front end whose model handler brought torch in (a handler of the user's, whose
    decode may use it): one intra-op thread, as the front ends share the cores; torch would
    start one a core in each."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


# Container objects made and not yet freed that set off a young collection once serving
# (CPython's default 700). A request leaves no garbage for the collector (tested), but the
# requests in flight hold objects: a front end with 128 of them ran a young collection every
# 30 requests, and the collections took 10-15 us a request, finding nothing; with this, none
# ran (docs/benchmarks.md, "Garbage collection").
YOUNG_COLLECTION_AT = 10_000

# Whether this process froze its start-up objects (``freeze_startup_objects``): not whether
# anything is frozen, as CPython 3.12 starts with objects of its own frozen (375 of them).
_startup_frozen = False


def freeze_startup_objects() -> None:
    """Move everything alive once the models are warm (torch, the models, modules: ~200k
    objects) out of the collector's reach, so full collections scan only request garbage; over
    the whole heap each took 70-100 ms, stalling the event loop (docs/benchmarks.md,
    "Tried and measured, not kept"). What was frozen before is collected with the rest first:
    nothing frozen is garbage. From then on a young collection waits for
    ``YOUNG_COLLECTION_AT`` new objects."""
    global _startup_frozen
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_AT, *gc.get_threshold()[1:])
    _startup_frozen = True


def refreeze() -> int | None:
    """In a process that froze its start-up objects, once a model is loaded or unloaded: the
    same again, so that what a load left alive (its replicas, and the libraries its code
    imported: 213,000 objects for MiniLM loaded into a server started on another model) is out
    of the collector's reach too, and what an unload left as garbage is collected. Otherwise
    each full collection scans a loaded model's objects again, 107-144 ms here with the GIL
    held, and under load they keep coming (one in 20 s at 400 requests a second on the CPU
    box, more at higher rates: ``python -m bench.gc_pauses``). This one full collection
    (223-327 ms there: the whole heap) comes once a change. Returns how many objects are
    frozen; None where nothing was frozen at start-up (tests, tools), which it leaves so."""
    if not _startup_frozen:
        return None
    freeze_startup_objects()
    return gc.get_freeze_count()


@contextlib.contextmanager
def refrozen(what: str, loop: asyncio.AbstractEventLoop | None = None) -> Iterator[None]:
    """Around a model's load (an unload has ``refreeze_soon``): ``refreeze`` once it is over,
    however it ends, logged (debug) as ``what``; with ``loop`` (a load on a loader thread, the
    loop serving on), ``freezing`` while it runs. Both only once the process has frozen its
    start-up objects, which may happen while a load runs (one asked for as the server says it
    is ready); nothing in tests and tools, which never do."""
    try:
        with freezing(loop) if loop is not None else contextlib.nullcontext():
            yield
    finally:
        _refreeze_logged(what)


def refreeze_soon(what: str, loop: asyncio.AbstractEventLoop) -> None:
    """After a model's unload: ``refreeze`` once the loop's current step is over, logged
    (debug) as ``what``. By then the frames that held the model (the unload's) are gone, so
    its garbage is collected; frozen while they held it, it would stay out of the collector's
    reach until the next load or unload."""
    loop.call_soon(_refreeze_logged, what)


def _refreeze_logged(what: str) -> None:
    frozen = refreeze()
    if frozen is not None:
        log.debug("after %s: %d objects frozen", what, frozen)


@contextlib.contextmanager
def freezing(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """While a model's code or replica is built on another thread: what exists is frozen every
    LOADING_FREEZE_S, so that the full collections its allocations set off scan only what came
    since, not all the build has made so far (for MiniLM: none came, against four of 19-124
    ms); the ``refreeze`` that ends the load (``refrozen``) collects whatever of it is garbage,
    and what the requests in flight at a tick left as cyclic garbage since (held until then)."""
    ticking: asyncio.TimerHandle | None = None

    def tick() -> None:
        nonlocal ticking
        if _startup_frozen:
            gc.freeze()
        ticking = loop.call_later(LOADING_FREEZE_S, tick)

    ticking = loop.call_later(LOADING_FREEZE_S, tick)
    try:
        yield
    finally:
        assert ticking is not None
        ticking.cancel()


class ShortSwitch:
    """While any thread is inside (a context manager, for any number of threads at once), the
    process's GIL switch interval is at most ``interval_s``; the one before comes back when
    the last leaves.

    A CUDA batch's launch and wait let the GIL go at each torch call (an event, a copy, a
    replay: microseconds each) and win it back from the event loop each time, which a busy loop
    holds until the waiter has waited a whole interval. Shortening it for the whole process
    would also cut the loop's and the device thread's Python work into slices that pass the GIL
    back and forth (on the CPU box, 5 us for the whole device process served 0.55-1.06 x the
    requests a second of 100 us: docs/benchmarks.md); only the launch and the wait, where a
    device thread runs a few microseconds between two calls that let the GIL go, take it."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._inside = 0
        self._before = 0.0

    def __enter__(self) -> None:
        with self._lock:
            if not self._inside:
                self._before = sys.getswitchinterval()
                sys.setswitchinterval(min(self._before, self.interval_s))
            self._inside += 1

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        with self._lock:
            self._inside -= 1
            if not self._inside:
                sys.setswitchinterval(self._before)


launching = ShortSwitch(LAUNCH_SWITCH_INTERVAL_S)
