"""The device process's front ends: start N, replace one that dies, stop them all on drain.

Each front end is ``python -m app.frontend.entry`` with its listening socket (app/listening.py;
a replacement gets its predecessor's) and one end of a socketpair (its link, served by
``Bridge``) inherited, and the settings pickled on its standard input. Runs on the device
process's event loop.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import pickle
import socket
import subprocess
import sys
import time

from app.bridge import Bridge, Heartbeat
from app.config import Settings
from app.draining import DRAIN, END_DRAIN
from app.errors import os_reason
from app.links import connect
from app.process import usable_cores
from app.tasks import Background

log = logging.getLogger("batchserve.frontends")

RESTART_DELAY_S = 1.0
# What each front end runs (``python -m``); bench/switch.py runs another for an A/B.
FRONTEND_MODULE = "app.frontend.entry"


# The most front ends ``auto`` starts: past about 8 each sends smaller messages, which cost the
# one device process more a request than the extra front ends save (docs/benchmarks.md: on a
# 16-core H200, 8 the best or within 10 % of it on every workload, 14 0.79 x on mlp JSON).
AUTO_LIMIT = 8


def frontend_count(setting: int | str, cores: int | None = None) -> int:
    """How many front ends ``frontends`` means with ``cores`` (default: those this process may
    use, ``usable_cores``): ``auto`` is 1 up to 4 cores (the model, not the event loop, is the
    limit there), else cores - 2, two cores left to the device process, and at most
    ``AUTO_LIMIT`` (docs/frontends.md)."""
    if setting != "auto":
        return int(setting)
    cores = cores if cores is not None else usable_cores()
    return 1 if cores <= 4 else min(cores - 2, AUTO_LIMIT)


def judge(beats: dict[int, Heartbeat], now: float, late: bool, limit_s: float
          ) -> list[tuple[int, float]]:
    """The front ends (index, seconds silent) heard from once and silent for ``limit_s`` since,
    each judged once; those silent for a third of it are asked to answer. After a ``late``
    pass every clock starts again at ``now``."""
    hung = []
    for index, beat in beats.items():
        if beat.heard is None:
            continue
        if late:
            beat.heard = now
        silent = now - beat.heard
        if silent >= limit_s:
            beat.heard = None  # its replacement gets a new one
            hung.append((index, silent))
        elif silent >= limit_s / 3 and beat.ask is not None:
            beat.ask()
    return hung


class Frontends:
    def __init__(self, settings: Settings, listeners: list[socket.socket],
                 bridge: Bridge) -> None:
        self.settings = settings
        self.listeners = listeners  # one a front end, by index
        self.bridge = bridge
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.beats: dict[int, Heartbeat] = {}  # when each was last heard from
        self.stopping = False
        self._tasks = Background(log)

    def start(self) -> None:
        for index in range(len(self.listeners)):
            self._spawn(index)
        self._tasks.start(self._watch_hangs(), "the watch for hung front ends")

    @property
    def alive(self) -> bool:
        return any(p.poll() is None for p in self.processes.values())

    def stop(self) -> None:
        """Every front end asked to drain (``DRAIN``): each refuses new requests and answers
        what it holds; asked again (a second signal, the drain's time over), to end its drain
        (``END_DRAIN``), as a second signal ends a process's own."""
        ask = END_DRAIN if self.stopping else DRAIN
        self.stopping = True
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(ask)
        # None is started again: each listening socket is its front end's alone now, and leaves
        # the SO_REUSEPORT group when that front end stops taking connections. Kept open here,
        # a stopped front end's socket went on taking its share of new connections, which no
        # one accepted: they hung till their clients gave up.
        for sock in set(self.listeners):
            sock.close()

    async def wait(self, timeout_s: float) -> None:
        """Until every front end has exited (killed after ``timeout_s``)."""
        for process in self.processes.values():
            try:
                await asyncio.to_thread(process.wait, timeout_s)
            except subprocess.TimeoutExpired:
                log.error("front end %d did not stop within %.0fs; killing it", process.pid,
                          timeout_s)
                process.kill()
        self.bridge.close()

    def _spawn(self, index: int) -> None:
        ours, theirs = socket.socketpair()
        # A listening socket passed as descriptor 0 to 2 (``--fd 0``, inetd's way) goes to the
        # front end as another number: its descriptor 0 is the pipe of its settings.
        listen_fd = fcntl.fcntl(self.listeners[index].fileno(), fcntl.F_DUPFD_CLOEXEC, 3)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", FRONTEND_MODULE,
                 "--listen-fd", str(listen_fd), "--link-fd", str(theirs.fileno())],
                stdin=subprocess.PIPE, pass_fds=(listen_fd, theirs.fileno()))
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
            os.close(listen_fd)
        assert process.stdin is not None
        process.stdin.write(pickle.dumps(self.settings))
        process.stdin.close()
        self.processes[index] = process
        self.beats[index] = beat = Heartbeat()
        self._tasks.start(self._link(ours, beat), f"front end {index}'s link")
        self._tasks.start(self._watch(index, process), f"the watch on front end {index}")

    async def _link(self, sock: socket.socket, beat: Heartbeat) -> None:
        await self.bridge.serve(*await connect(sock), beat)

    async def _watch_hangs(self) -> None:
        """Every sixth of ``frontend_timeout_s``, ``judge`` the front ends and kill those it
        finds hung (``_watch`` replaces them). A pass that came over a sixth of the limit late
        (the device process's own loop was held up, and their answers may be unread) restarts
        every clock instead (docs/frontends.md)."""
        limit = self.settings.frontend_timeout_s
        step = limit / 6
        last = time.monotonic()
        while not self.stopping:
            await asyncio.sleep(step)
            now = time.monotonic()
            late, last = now - last > 2 * step, now
            for index, silent in judge(self.beats, now, late, limit):
                self._kill_hung(self.processes[index], index, silent)

    def _kill_hung(self, process: subprocess.Popen[bytes], index: int, silent_s: float) -> None:
        if self.stopping or process.poll() is not None:
            return
        log.error("front end %d (pid %d) has not answered for %.0fs; killing it", index,
                  process.pid, silent_s)
        process.kill()

    async def _watch(self, index: int, process: subprocess.Popen[bytes]) -> None:
        code = await asyncio.to_thread(process.wait)
        if self.stopping:
            return
        log.error("front end %d (pid %d) exited with %d; starting another in %.0fs", index,
                  process.pid, code, RESTART_DELAY_S)
        await asyncio.sleep(RESTART_DELAY_S)
        while not self.stopping:
            try:
                self._spawn(index)
            except OSError as exc:  # no fork for now (a pids or memory limit): try again
                log.error("front end %d could not be started (%s); trying again in %.0fs",
                          index, os_reason(exc), RESTART_DELAY_S)
                await asyncio.sleep(RESTART_DELAY_S)
            else:
                self.bridge.service.metrics.frontend_restarts.inc()
                return
