"""``python -m bench.instructions``: the instructions a front end runs a request, counted by
valgrind's callgrind: a measure of small changes that does not move with this box's speed.

The server runs with two front ends (``--frontends 2``), each under callgrind with its counting
off (``--instr-atstart=no``); the device process runs as usual. After a warm-up, counting is
turned on and zeroed in both, ``--requests`` requests go over ``--connections`` keep-alive
connections (spread over the two front ends as the kernel puts them), and the counts are
dumped: their sum over the requests is a front end's instructions a request, its HTTP, parse,
hop and answer. On this box (2026-12-04, mlp) a build read the same within 0.2 % over runs at
one connection (every message one request) and within about 1 % at 32 (messages of several,
as many as timing gives), where requests a second move by a third within an hour.

Instructions are not time: a change that trades instructions for cache misses, or for system
calls (whose kernel side is not counted), shows only in a timed run. Under callgrind a request
takes some 50 times as long: the front ends run with no disconnect watch (each request would
pass its 20 ms and start one, which at the server's pace few do), and what a front end spends a
message is counted at the message sizes callgrind's pace gives. ``--base DIR`` counts another
checkout (a ``git worktree``) in turn, and the ratio. Needs valgrind (``callgrind_control`` on
the PATH).

``--opcodes``: where a front end's Python goes, which callgrind sees only as the interpreter's
loop: each front end counts the bytecodes its event loop's thread runs in each function
(bench/opcodes.py, from a signal after the warm-up to one after the requests), and the functions
that run the most a request are printed with their calls (a coroutine's every resumption is one).
Exact and repeatable like the instructions; C code called from Python (simdjson, numpy, uvloop) is
not in it, and a bytecode's cost varies: a change that runs fewer can run as many instructions. On
mlp (2026-12-04) about 3,600 opcodes and 126 calls a request, uvicorn's ``send`` the most of them
(11 %).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bench.frontends import tree
from bench.opcodes import report
from bench.run import instance_for, server_process

# A front end whose requests start no disconnect watch (the module's docstring says why).
FRONTEND = """
import runpy, app.api.inference
app.api.inference.WATCH_AFTER_S = 3600.0
runpy.run_module("app.frontend.entry", run_name="__main__")
"""

# A front end counting the opcodes its event loop's thread runs in each function, from
# SIGRTMIN+1 to SIGRTMIN+2 (SIGUSR1 and 2 are the server's); then written to BENCH_CALLGRIND_OUT.
OPCODES = """
import json, os, signal
from bench.opcodes import Opcodes
counting = Opcodes()
def stop(*_):
    counting.stop()
    with open(os.environ["BENCH_CALLGRIND_OUT"] + "/fe.%d.json" % os.getpid(), "w") as out:
        json.dump(counting.rows(), out)
signal.signal(signal.SIGRTMIN + 1, lambda *_: counting.start())
signal.signal(signal.SIGRTMIN + 2, stop)
"""


def serve(counting: bool) -> str:
    """Run as ``python -c`` in the server's checkout: its front ends start under callgrind, or
    (``counting``) counting their opcodes."""
    wrap = ("""args = [*args[:at - 1], "-c", {frontend!r}, *args[at + 1:]]""" if counting else
            """args = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--log-file=" + out
                    + "/valgrind.%p", "--callgrind-out-file=" + out + "/fe.%p", *args[:at - 1],
                    "-c", {frontend!r}, *args[at + 1:]]""").format(
        frontend=(OPCODES if counting else "") + FRONTEND)
    return f"""
import os, subprocess, sys
popen = subprocess.Popen
class Counted(popen):
    def __init__(self, args, *rest, **kwargs):
        if isinstance(args, list) and "app.frontend.entry" in args:
            out = os.environ["BENCH_CALLGRIND_OUT"]
            at = args.index("app.frontend.entry")
            {wrap}
        super().__init__(args, *rest, **kwargs)
subprocess.Popen = Counted
from app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def post(port: int, body: bytes, count: int, connections: int) -> int:
    """``count`` POST /predict over ``connections`` keep-alive connections; the 200s."""
    answered = [0] * connections

    def client(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        for _ in range(count // connections):
            connection.request("POST", "/predict", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            answered[index] += response.status == 200
        connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(answered)


def frontends(pid: int) -> list[int]:
    """The server's front ends: its children started by ``serve``'s wrapper."""
    return [child for child in tree(pid)[1:]
            if b"WATCH_AFTER_S" in Path(f"/proc/{child}/cmdline").read_bytes()]


def control(pids: list[int], *flags: str) -> None:
    for pid in pids:
        subprocess.run(["callgrind_control", *flags, str(pid)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def counted(out: Path, dumps: str = "fe.*.*") -> int:
    """The instructions in the dumps ``callgrind_control -d`` wrote (``fe.PID.N``)."""
    total = 0
    for dump in out.glob(dumps):
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                total += int(line.split()[1])
                break
    return total


def measure(args: argparse.Namespace, checkout: Path | None, body: bytes) -> float:
    """A front end's instructions a request, on ``checkout`` (None: this one)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        os.environ["BENCH_CALLGRIND_OUT"] = folder  # the server's environment is this one's
        flags = ["--model", args.workload, "--devices", "cpu", "--max-batch-size", "32",
                 "--frontends", "2", "--frontend-timeout-s", "600", "--torch-threads", "1"]
        with server_process(flags, str(checkout) if checkout else None,
                            ("-c", serve(args.opcodes))) as (url, pid):
            port = int(url.rsplit(":", 1)[1])
            deadline = time.monotonic() + 120
            while len(pids := frontends(pid)) < 2 and time.monotonic() < deadline:
                time.sleep(0.5)
            if len(pids) < 2:  # a build whose front ends are not app.frontend.entry
                raise SystemExit(f"bench: {len(pids)} of the 2 front ends run under valgrind")
            post(port, body, args.connections * 4, args.connections)  # warm-up
            total = 0
            if args.opcodes:
                ok = opcodes(args, out, pids, lambda: post(port, body, args.requests,
                                                           args.connections))
            else:
                control(pids, "-i", "on")
                control(pids, "-z")
                ok = post(port, body, args.requests, args.connections)
                control(pids, "-d")
                total = counted(out)
        if args.keep is not None:  # the measured dumps, for callgrind_annotate
            args.keep.mkdir(parents=True, exist_ok=True)
            for dump in out.glob("fe.*.*"):
                shutil.copy(dump, args.keep / f"{'base-' if checkout else ''}{dump.name}")
    if ok != args.requests:
        raise SystemExit(f"bench: {ok} of {args.requests} requests answered 200")
    return total / int(args.requests)


def opcodes(args: argparse.Namespace, out: Path, pids: list[int], load: Callable[[], int]
            ) -> int:
    """The front ends' opcodes and calls a request by function, printed: counted while
    ``load`` runs (its 200s returned)."""
    for pid in pids:
        os.kill(pid, signal.SIGRTMIN + 1)
    ok = load()
    for pid in pids:
        os.kill(pid, signal.SIGRTMIN + 2)
    deadline = time.monotonic() + 60
    while len(list(out.glob("fe.*.json"))) < len(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    rows = [row for dump in out.glob("fe.*.json") for row in json.loads(dump.read_text())]
    print(report(rows, args.requests, "request", args.top), flush=True)
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("linear", "mlp"), default="mlp")
    parser.add_argument("--requests", type=int, default=640)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base", type=Path, default=None,
                        help="a checkout to count in turn with this one, and the ratio")
    parser.add_argument("--opcodes", action="store_true",
                        help="the Python bytecodes a request by function, not instructions")
    parser.add_argument("--top", type=int, default=40, help="functions --opcodes prints")
    parser.add_argument("--keep", type=Path, default=None,
                        help="copy the measured dumps here (callgrind_annotate FILE: where a "
                             "front end's instructions go, by C function)")
    args = parser.parse_args(argv)
    if not args.opcodes and shutil.which("callgrind_control") is None:
        parser.error("needs valgrind (callgrind_control), e.g. apt-get install valgrind")
    if args.requests % args.connections:
        parser.error("--requests must be a multiple of --connections")
    body = json.dumps({"instances": [instance_for(args.workload, 0)]}).encode()
    if args.opcodes:
        measure(args, None, body)
        return 0
    builds = [args.base, None] if args.base else [None]
    counts: dict[str, list[float]] = {}
    for round_ in range(args.rounds):
        for build in builds if round_ % 2 == 0 else builds[::-1]:
            name = str(build) if build else "this build"
            counts.setdefault(name, []).append(measure(args, build, body))
            print(f"round {round_ + 1}: {name}: {counts[name][-1]:,.0f} instructions a "
                  "request in the front ends", flush=True)
    medians = {name: statistics.median(values) for name, values in counts.items()}
    for name, value in medians.items():
        print(f"{name}: median {value:,.0f}")
    if args.base:
        print(f"this build over the base: {medians['this build'] / medians[str(args.base)]:.3f} x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
