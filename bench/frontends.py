"""``python -m bench.frontends``: throughput and tail latency against the number of front ends.

For each N of ``--frontends``, one server with ``--frontends N`` under wrk at each
``--concurrency``, one after another in this run: requests and items per second, p50 and p99,
errors, the mean batch, the cores the whole server used (device process and front ends), the
CPU the device process's event loop spent per request (with N=1, the one process's loop), the
GPU's busy share where the devices are CUDA, where a request's time went in the server (from
/metrics), and the CPU a request of the front ends together (``fe us``; with N=1 the one
process) and of the device process (``dev us``): which side bounds a curve that stops rising;
and the requests a message from the front ends carried (``req/msg``), which sets most of what
a request costs the device process; the least and most busy front end's cores (``fe
cores``: uneven when the connections are); and wrk's cores, its threads together (``wrk
cores``: near ``--threads``, the client is the bound); and the front ends' share of their CPU
in the kernel (``fe sys``: the reads, writes and wake-ups that bench.instructions' counts leave
out). ``--offline`` adds the model called in-process at the max batch (bench.run's ceiling),
before the curve and after it, and the ratios against the higher reading. ``--base DIR`` runs
each point on that checkout too, in turn with this build, and gives this build's ratio to it
(an A/B on a lent GPU: bench.carry --base packs the base). ``--pin-device-cores K`` keeps the
device process's threads on K cores of their own and the front ends and wrk off them
(``pin``).

    python -m bench.frontends --workload linear --frontends 1,2 --concurrency 64
    python -m bench.frontends --workload mlp --instances 32 --binary --devices cuda \\
        --max-batch-size 256 --frontends 1,4,14 --concurrency 256 --offline

Bodies: ``--instances`` per request as /predict JSON, or with ``--binary`` one v2 infer request
whose tensor travels as binary data (Triton's binary tensor extension).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.devices import resolve_devices
from bench.run import (
    SmSampler,
    answered_s,
    check_answers,
    cpu_seconds,
    cpu_times,
    instance_for,
    offline_items_s,
    run_wrk,
    scrape,
    server_flags,
    server_process,
)


@dataclass
class Point:
    frontends: int
    concurrency: int
    req_s: float
    items_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    mean_batch: float
    server_cpu: float
    device_loop_us: float  # the device process's event-loop CPU per request
    sm_util: float | None
    # Where a request's time went, server side (means from /metrics): arrival to answer, enqueue
    # to batch start (a row's), and a batch's collate to results; the rest is outside the queue.
    server_ms: float = 0.0
    queue_ms: float = 0.0
    batch_ms: float = 0.0
    # CPU per request: the front ends' together (with N=1 the one process's), and the device
    # process's: which side a curve's flat end is bound by.
    frontend_us: float = 0.0
    device_us: float = 0.0
    # Requests a message from the front ends to the device process carried (what sets most of
    # a request's cost there: docs/frontends.md); 0 with one process.
    per_message: float = 0.0
    # The least and the most busy front end, in cores: an uneven spread of the connections
    # shows as one near 1.0 while another idles (docs/frontends.md, "Listening sockets").
    frontend_cores: tuple[float, float] = (0.0, 0.0)
    # wrk's cores, all its threads together: near its thread count, the client is the bound.
    client_cores: float = 0.0
    # The front ends' share of their CPU in the kernel (with N=1 the one process's): reading,
    # writing and waking across sockets, which the instruction counts (bench.instructions)
    # leave out. With two front ends on the CPU box, c=64: 0.14 on mlp, 0.09-0.11 its stand-in.
    frontend_kernel: float = 0.0
    build: str = "this"  # or "base": the checkout of --base


STAGES = ("batchserve_batch_size", "batchserve_request_duration_seconds",
          "batchserve_queue_wait_seconds", "batchserve_batch_compute_seconds")


def stage_totals(url: str) -> list[float]:
    """Each of ``STAGES``' sum and count, from one read of /metrics; then the requests and the
    messages from the front ends (a pair of the same form: ``means`` gives requests a
    message)."""
    return scrape(url, *(f"{name}_{part}" for name in STAGES for part in ("sum", "count")),
                  "batchserve_requests_total", "batchserve_frontend_messages_total")


def means(before: list[float], after: list[float]) -> list[float]:
    """Each stage's mean over what happened between two ``stage_totals``."""
    deltas = [b - a for a, b in zip(before, after, strict=True)]
    return [deltas[i] / max(1.0, deltas[i + 1]) for i in range(0, len(deltas), 2)]


def tree(pid: int) -> list[int]:
    """``pid`` and its child processes (the front ends)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(int(c) for c in children)]


def pin(pids: list[int], device_cores: int) -> str:
    """Every thread of the device process (``pids[0]``) onto the last ``device_cores`` of the
    cores this process may use, the front ends' onto the others: whether the device process
    costs more a request beside busy front ends (19-20 us on the H200 at N=8, against 12.9
    alone: docs/benchmarks.md) because they take its cores. Threads started later inherit
    their starter's cores. Returns the others ("0,1,2"), for wrk."""
    cores = sorted(os.sched_getaffinity(0))
    device, rest = cores[-device_cores:], cores[:-device_cores]
    for i, pid in enumerate(pids):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):  # a thread that has ended
                os.sched_setaffinity(int(task.name), device if i == 0 else rest)
    listed = ",".join(map(str, rest))
    print(f"  pinned: the device process on cores {','.join(map(str, device))}, the front "
          f"ends and wrk on {listed}", flush=True)
    return listed


def per_process_times(pids: list[int]) -> list[tuple[float, float]]:
    """Each process's CPU seconds so far, in user space and in the kernel (0 for one that has
    gone)."""
    times = []
    for pid in pids:
        try:
            times.append(cpu_times(pid))
        except (FileNotFoundError, ProcessLookupError):
            times.append((0.0, 0.0))
    return times


def per_process_cpu(pids: list[int]) -> list[float]:
    """Each process's CPU seconds so far (0 for one that has gone)."""
    return [sum(times) for times in per_process_times(pids)]


def kernel_share(before: list[tuple[float, float]], after: list[tuple[float, float]]) -> float:
    """The share of the processes' CPU between two ``per_process_times`` spent in the kernel."""
    user, kernel = (sum(b[i] - a[i] for a, b in zip(before, after, strict=True)) for i in (0, 1))
    return kernel / (user + kernel) if user + kernel > 0 else 0.0


@contextmanager
def body(workload: str, instances: int, binary: bool) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(body file, path, extra environment for post.lua) for one request of ``instances``."""
    rows = [instance_for(workload, i) for i in range(instances)]
    if binary:
        data = np.asarray(rows, dtype=np.float32).tobytes()
        head = json.dumps({
            "inputs": [{"name": "INPUT0", "shape": [instances, len(rows[0])], "datatype": "FP32",
                        "parameters": {"binary_data_size": len(data)}}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }).encode()
        content, path = head + data, f"/v2/models/{workload}/infer"
        env = {"BENCH_HEADER_LENGTH": str(len(head))}
    else:
        content, path, env = json.dumps({"instances": rows}).encode(), "/predict", {}
    with tempfile.NamedTemporaryFile("wb", suffix=".body", delete=False) as f:
        f.write(content)
    try:
        yield f.name, path, env
    finally:
        os.unlink(f.name)


PROFILE_HZ = 250  # py-spy's samples a second (``profiled``)


def profiled_s(seconds: float) -> int:
    """How long ``profiled`` samples a block of ``seconds``."""
    return max(1, int(seconds) - 1)


@contextmanager
def profiled(into: Path | None, pid: int, seconds: float, name: str) -> Iterator[None]:
    """py-spy's samples of process ``pid`` while the block runs, each thread's while it holds
    the GIL (how the device process's event loop and device threads share it), as
    ``into/name.txt`` (py-spy's raw format, one stack a line); nothing without ``into`` or
    py-spy."""
    beside = Path(sys.executable).parent / "py-spy"  # a virtual environment's, not on PATH
    spy = shutil.which("py-spy") or (str(beside) if beside.exists() else None)
    if spy is None or into is None:
        yield
        return
    into.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--duration",
                             str(profiled_s(seconds)), "--rate", str(PROFILE_HZ), "--threads",
                             "--gil", "--format", "raw", "--nonblocking",
                             "--output", str(into / f"{name}.txt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield
    finally:
        _, err = proc.communicate(timeout=60)
        if proc.returncode:
            print(f"  py-spy: {err.strip().splitlines()[-1] if err.strip() else proc.returncode}",
                  flush=True)


def switched(args: argparse.Namespace) -> bool:
    """Whether the server runs with bench/switch.py's settings."""
    return any(value is not None and value is not False for value in (
        args.switch_interval_us, args.launch_switch_us, args.spinning_sync, args.napping_waits,
        args.gil_free_writes))


def wait_for_frontends(url: str, count: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if count == 1 or scrape(url, "batchserve_frontends_connected")[0] >= count:
            return
        time.sleep(0.2)
    raise SystemExit(f"bench: {count} front ends did not connect")


def measure(args: argparse.Namespace, frontends: int, check: bool,
            base: Path | None = None) -> list[Point]:
    """Each concurrency's point at ``frontends``, on this build or the checkout ``base``."""
    flags = [*server_flags(args.workload, args.max_batch_size, args.devices, args.max_wait_ms,
                           args.torch_threads, frontends),
             "--queue-capacity", str(args.queue_capacity)]
    flags += ["--cuda-graphs", args.cuda_graphs]
    if args.model is not None:  # the same model as another setting (a module:callable)
        flags += ["--model", args.model, "--model-name", args.workload]
    points = []
    launcher: tuple[str, ...] = ("-m", "app")
    if switched(args):
        launcher = ("-m", "bench.switch", *(str(us) if us is not None else "-" for us in (
            args.switch_interval_us, args.launch_switch_us)),
            "spinning" if args.spinning_sync else "napping" if args.napping_waits else "-",
            "gil-free" if args.gil_free_writes else "-")
    started, times = time.monotonic(), dict[str, float]()
    with server_process(flags, str(base) if base else None, launcher, times) as (url, pid), body(
            args.workload, args.instances, args.binary) as (path_file, path, env):
        wait_for_frontends(url, frontends)
        # A server's start, a part of a run's time: up (its front ends answering), then its
        # model loaded and warm (a text model's CUDA graphs are captured in that part)
        print(f"  served {time.monotonic() - started:.1f} s after its start (answered after "
              f"{times['answered']:.1f} s, ready after {times['ready']:.1f})", flush=True)
        if check:
            check_answers(url, args.workload, args.model)
        cpus = pin(tree(pid), args.pin_device_cores) if args.pin_device_cores else None
        for c in args.concurrency:
            run_wrk(url, path_file, c, args.warmup_s, path, threads=min(c, args.threads),
                    env=env, cpus=cpus)
            totals0 = stage_totals(url)
            pids = tree(pid)  # the device process, then the front ends
            times0, t0, loop0 = per_process_times(pids), time.monotonic(), cpu_seconds(pid, pid)
            with SmSampler(args.devices) as sm:
                r = run_wrk(url, path_file, c, args.seconds, path, threads=min(c, args.threads),
                            env=env, cpus=cpus)
            times1, t1, loop1 = per_process_times(pids), time.monotonic(), cpu_seconds(pid, pid)
            each0, each1 = ([sum(t) for t in times] for times in (times0, times1))
            cpu0, cpu1, dev0, dev1 = sum(each0), sum(each1), each0[0], each1[0]
            fe = slice(1 if frontends > 1 else 0, None)  # with one process, that process
            each = [(c1 - c0) / (t1 - t0) for c0, c1 in zip(each0[1:], each1[1:],
                                                             strict=True)] or [0.0]
            batch, server_s, queue_s, batch_s, per_message = means(totals0, stage_totals(url))
            per_message = per_message if frontends > 1 else 0.0  # one process: no messages
            req_s = answered_s(r)
            answered = req_s * (t1 - t0)  # none: no CPU a request (nan), not all of it
            per_request = 1e6 / answered if answered >= 1 else float("nan")  # us per CPU s
            device_us = (dev1 - dev0) * per_request if frontends > 1 else 0.0
            point = Point(frontends, c, req_s, req_s * args.instances, r["p50_us"] / 1000,
                          r["p99_us"] / 1000, r["http_errors"] + r["socket_errors"],
                          batch, (cpu1 - cpu0) / (t1 - t0),
                          (loop1 - loop0) * per_request, sm.mean,
                          server_s * 1e3, queue_s * 1e3, batch_s * 1e3,
                          (cpu1 - cpu0) * per_request - device_us, device_us, per_message,
                          (min(each), max(each)), r["cpu_s"] / (t1 - t0),
                          kernel_share(times0[fe], times1[fe]), "base" if base else "this")
            print(row(point), flush=True)
            points.append(point)
            if args.profile is not None:
                profile_point(args, f"{args.workload}-n{frontends}-c{c}", pids,
                              functools.partial(run_wrk, url, path_file, c, args.seconds, path,
                                                threads=min(c, args.threads), env=env,
                                                cpus=cpus))
    return points


def profile_point(args: argparse.Namespace, name: str, pids: list[int],
                  load: Callable[[], dict[str, Any]]) -> None:
    """py-spy's samples of the device process and of a front end (the last started: what it
    spends a request on, docs/frontends.md) under the same ``load`` again, after the measured
    run: py-spy takes CPU beside what it records, so the point's figures come from a run
    without it. Its rate is printed, to relate the samples to requests."""
    with profiled(args.profile, pids[0], args.seconds, f"device-{name}"), profiled(
            args.profile if len(pids) > 1 else None, pids[-1], args.seconds, f"frontend-{name}"):
        r = load()
    print(f"  profiled in a run of its own: {answered_s(r):,.0f} req/s", flush=True)


HEAD = (f"{'front ends':>10}{'conc':>6}{'req/s':>10}{'items/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'errors':>8}{'batch':>7}{'cores':>7}{'loop us':>8}{'GPU busy':>9}"
        f"{'srv ms':>8}{'queue ms':>9}{'batch ms':>9}{'fe us':>7}{'dev us':>7}{'req/msg':>8}"
        f"{'fe cores':>11}{'wrk cores':>10}{'fe sys':>7}")


def row(p: Point) -> str:
    sm = f"{p.sm_util:>8.0f}%" if p.sm_util is not None else f"{'-':>9}"
    label = f"{p.frontends}{' base' if p.build == 'base' else ''}"
    return (f"{label:>10}{p.concurrency:>6}{p.req_s:>10.0f}{p.items_s:>10.0f}"
            f"{p.p50_ms:>9.2f}{p.p99_ms:>9.2f}{p.errors:>8}{p.mean_batch:>7.1f}"
            f"{p.server_cpu:>7.2f}{p.device_loop_us:>8.1f}{sm}"
            f"{p.server_ms:>8.2f}{p.queue_ms:>9.2f}{p.batch_ms:>9.2f}"
            f"{p.frontend_us:>7.0f}{p.device_us:>7.0f}"
            + (f"{p.per_message:>8.1f}" if p.per_message else f"{'-':>8}")
            + (f"{p.frontend_cores[0]:>6.2f}-{p.frontend_cores[1]:.2f}" if p.per_message
               else f"{'-':>11}")
            + f"{p.client_cores:>10.2f}{p.frontend_kernel:>7.2f}")


def alone(args: argparse.Namespace, when: str) -> float:
    """The model alone at the batch limit (``offline_items_s``), printed."""
    device = resolve_devices(args.devices)[0]
    items_s = offline_items_s(args.workload, args.max_batch_size, 3.0, 8, device)
    print(f"offline at batch {args.max_batch_size}, {when}: {items_s:,.0f} items/s", flush=True)
    return items_s


def summary(points: list[Point], counts: list[int], concurrency: list[int],
            offline: float | None) -> None:
    """Each point's median over the rounds; each N against the first, and with --base this
    build against the base, as the median of the rounds' ratios."""
    def at(build: str, n: int, c: int) -> list[Point]:
        return [q for q in points if (q.build, q.frontends, q.concurrency) == (build, n, c)]

    def ratio(label: str, before: list[Point], after: list[Point]) -> None:
        ratios = [b.items_s / a.items_s for a, b in zip(before, after, strict=True)]
        print(f"  {label}: {statistics.median(ratios):.3f} x"
              + (f" (rounds: {', '.join(f'{r:.3f}' for r in ratios)})" if len(ratios) > 1
                 else ""))

    builds = sorted({q.build for q in points}, reverse=True)  # this, then base
    print("medians:")
    for build in builds:
        for n in counts:
            for c in concurrency:
                mine = at(build, n, c)
                items_s = statistics.median(q.items_s for q in mine)
                print(f"  {build} N={n} c={c}: {items_s:,.0f} items/s, p99 "
                      f"{statistics.median(q.p99_ms for q in mine):.2f} ms"
                      + (f", {items_s / offline:.3f} x offline" if offline else ""))
    for n in counts[1:]:
        for c in concurrency:
            ratio(f"c={c}: N={n} over N={counts[0]}", at("this", counts[0], c), at("this", n, c))
    if "base" in builds:
        for n in counts:
            for c in concurrency:
                ratio(f"c={c}, N={n}: this build over the base", at("base", n, c),
                      at("this", n, c))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=["linear", "mlp", "minilm"], default="linear")
    p.add_argument("--frontends", default="1,2", help="comma list of N (1,2)")
    p.add_argument("--concurrency", default="64", help="comma list (64)")
    p.add_argument("--seconds", type=float, default=5.0, help="per measured point (5)")
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=1, help="repeat the curve, N in turn (1)")
    p.add_argument("--devices", default="cpu")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--instances", type=int, default=1, help="instances per request (1)")
    p.add_argument("--queue-capacity", type=int, default=4096,
                   help="items (4096; above concurrency x instances, so nothing is refused)")
    p.add_argument("--binary", action="store_true", help="v2 infer with a binary tensor")
    p.add_argument("--cuda-graphs", choices=["auto", "true", "false"], default="auto",
                   help="the server's cuda_graphs (auto, its default; docs/cuda-graphs.md)")
    p.add_argument("--threads", type=int, default=1, help="wrk threads (1)")
    p.add_argument("--offline", action="store_true", help="the model alone at the max batch")
    p.add_argument("--model", default=None,
                   help="serve the workload's model given this way (app.models.builtin:"
                        "mlp_module: the mlp as a bare module; bench.device:mlp_stand_in: its "
                        "inputs and outputs through one layer); requests are the workload's")
    p.add_argument("--switch-interval-us", type=float, default=None,
                   help="the device process's GIL switch interval, below the server's 100 us "
                        "(bench/switch.py)")
    p.add_argument("--launch-switch-us", type=float, default=None,
                   help="its interval while a device thread launches and waits for a CUDA "
                        "batch, instead of the server's 5 us (100: none shorter; "
                        "bench/switch.py)")
    p.add_argument("--spinning-sync", action="store_true",
                   help="the device threads wait for a CUDA batch spinning (CUDA's default), "
                        "not asleep as the server's do (bench/switch.py)")
    p.add_argument("--napping-waits", action="store_true",
                   help="with a batch in flight and nothing queued, the device threads nap on "
                        "their bell before waiting for it (bench/nap.py)")
    p.add_argument("--gil-free-writes", action="store_true",
                   help="the device process writes to the front ends with os.writev, which "
                        "lets the GIL go during the call (bench/switch.py)")
    p.add_argument("--pin-device-cores", type=int, default=0, metavar="K",
                   help="the device process's threads on the last K cores, the front ends and "
                        "wrk on the others (0: where the kernel puts them)")
    p.add_argument("--base", type=Path, default=None,
                   help="a checkout to A/B against: each point on it, then on this build, the "
                        "order turned each round (bench.carry --base packs one for the GPU)")
    p.add_argument("--out", type=Path, default=None, help="write the points here as JSON")
    p.add_argument("--profile", type=Path, default=None,
                   help="record the device process and a front end with py-spy at each point, "
                        "in a run after the measured one, into this folder")
    args = p.parse_args(argv)
    if args.base is not None and switched(args):
        p.error("--base runs the base's own server: not with bench/switch.py's settings")
    if args.base is not None and not (args.base / "app" / "__main__.py").is_file():
        p.error(f"--base {args.base}: no batchserve checkout there (app/__main__.py)")
    usable = len(os.sched_getaffinity(0))
    if not 0 <= args.pin_device_cores < usable:
        p.error(f"--pin-device-cores {args.pin_device_cores}: from 0 to one less than the "
                f"{usable} cores this process may use")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    counts = [int(n) for n in args.frontends.split(",")]
    print(f"== {args.workload}, {args.instances} instance(s) a request"
          f"{' as v2 binary' if args.binary else ''}, max batch {args.max_batch_size}, "
          f"devices {args.devices}, {os.cpu_count()} cores", flush=True)
    readings: list[float] = []  # the model alone, before the curve and after it
    if args.offline:
        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)
        readings.append(alone(args, "before the curve"))
    print(HEAD, flush=True)
    points: list[Point] = []
    builds = [args.base, None] if args.base else [None]  # an A/B: the base first, in turn
    for round_ in range(args.rounds):
        for n in counts if round_ % 2 == 0 else counts[::-1]:
            for build in builds if round_ % 2 == 0 else builds[::-1]:
                points.extend(measure(args, n, check=not points, base=build))
    if args.offline:
        readings.append(alone(args, "after it"))
    # The higher reading: one model-alone figure moved by a third between readings on the
    # H200, and a ratio against the lower would flatter the server.
    offline = max(readings) if readings else None
    if args.rounds > 1 or len(counts) > 1 or args.base:
        summary(points, counts, args.concurrency, offline)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"settings": vars(args), "offline_items_s": offline,
                                        "offline_readings": readings,
                                        "points": [asdict(q) for q in points]},
                                       indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
