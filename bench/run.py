"""``python -m bench``: the server against its own ceiling and against itself unbatched.

For a workload (linear, mlp, minilm) it measures, in one run:
- ``offline``: the model called in-process in a loop (collate, forward, split) at the batch size
  each concurrency can fill, the ceiling on this machine;
- ``batchserve``: the server (subprocess, loopback) under wrk at each concurrency;
- ``unbatched``: the same server with max_batch_size=1.
Every server process gets the same settings (torch threads, batch wait), and all are up at once.
Answers are checked against the model called directly before any load is sent.

This machine's speed drifts within minutes, so each concurrency's offline point and its servers'
points are taken back to back, and ``--rounds N`` repeats the whole sweep, the servers' order
reversed every other round: every ratio is then the median of the rounds' own ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from app.devices import resolve_devices

HERE = Path(__file__).resolve().parent
TEXTS = [
    "A man is eating food.", "The new movie is awesome.", "A cheetah chases prey.",
    "Dynamic batching pays off.", "How do I bake bread at home?", "Stocks rose on Friday.",
    "The cat sat on the mat.", "Where is the nearest station?",
]


@dataclass
class Point:
    config: str
    concurrency: int
    req_s: float
    items_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    errors: int
    mean_batch: float
    server_cpu: float  # cores used by the server process, averaged over the run
    loop_us: float  # CPU of the server's main (event-loop) thread per request, microseconds
    sm_util: float | None = None  # mean GPU SM utilisation (%), CUDA devices only
    round: int = 0
    offline_items_s: float = 0.0  # offline at the batch this concurrency fills, taken just before


@dataclass
class Report:
    workload: str
    settings: dict[str, Any]
    offline_items_s: float  # at max_batch_size (the median over rounds)
    points: list[Point] = field(default_factory=list)
    offline_by_batch: dict[int, float] = field(default_factory=dict)  # medians over rounds
    machine: dict[str, Any] = field(default_factory=dict)


def instance_for(workload: str, i: int) -> Any:
    if workload == "minilm":
        return TEXTS[i % len(TEXTS)]
    size = 4 if workload == "linear" else 512
    rng = np.random.default_rng(i)
    return [round(float(v), 4) for v in rng.standard_normal(size)]


def offline_items_s(workload: str, batch: int, seconds: float, distinct: int,
                    device: torch.device) -> float:
    """Items/s of collate + copy in + forward + copy out + split at ``batch`` on ``device``, one
    call after another in this process (torch threads set): the server's own device code
    (app/transfer.py) without the server.

    The batch holds the same instances the load generator sends (``distinct`` of them, repeated),
    so for text the padded length matches what the server computes."""
    from app.models.registry import load_handler
    from app.transfer import DeviceExecutor

    handler = load_handler(workload)
    executor = DeviceExecutor(device)
    replica = handler.load(device)
    items = handler.decode([instance_for(workload, i % distinct) for i in range(batch)])
    runs: list[float] = []
    deadline = time.perf_counter() + seconds
    for _ in range(3):
        executor.launch(handler, replica, items).wait()  # warm-up
    while time.perf_counter() < deadline or len(runs) < 5:
        t0 = time.perf_counter()
        executor.launch(handler, replica, items).wait()
        runs.append(time.perf_counter() - t0)
    return batch / statistics.median(runs)


class SmSampler:
    """Mean GPU (SM) utilisation over a window, sampled every 100 ms with NVML (nvidia-ml-py)."""

    def __init__(self, devices: str) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handles: list[Any] = []
        if "cuda" not in devices:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            indices = {torch.device(d.strip()).index or 0 for d in devices.split(",")}
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in sorted(indices)]
        except Exception as exc:  # noqa: BLE001 - a benchmark without NVML still runs
            print(f"  (no SM utilisation: {exc})", flush=True)

    def __enter__(self) -> SmSampler:
        if self._handles:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        import pynvml

        while not self._stop.wait(0.1):
            self.samples.extend(pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.samples) if self.samples else None


def check_answers(url: str, workload: str, model: str | None = None) -> None:
    """The server's answers to ``workload``'s first instances against its model (or ``model``,
    where the server was given another) called directly."""
    from app.models.registry import load_handler

    handler = load_handler(model or workload)
    replica = handler.load(torch.device("cpu"))
    instances = [instance_for(workload, i) for i in range(4)]
    with torch.inference_mode():
        want = handler.split(replica(handler.collate(handler.decode(instances))), 4)
    got = httpx.post(url + "/predict", json={"instances": instances}, timeout=60).json()
    error = max(float(np.abs(np.asarray(g) - np.asarray(w)).max())
                for g, w in zip(got["predictions"], want, strict=True))
    if error > 1e-4:
        raise SystemExit(f"bench: the server's answers differ from the model's by {error}")
    print(f"  answers match the model called directly (max abs diff {error:.2e})", flush=True)


def server_flags(workload: str, max_batch: int, devices: str = "cpu", max_wait_ms: float = 5.0,
                 torch_threads: int = 1, frontends: int = 1) -> list[str]:
    """The flags every benchmark serves ``workload`` with (a queue no load here fills); one
    process unless ``frontends`` says otherwise (bench.frontends)."""
    return ["--model", workload, "--devices", devices, "--max-batch-size", str(max_batch),
            "--max-wait-ms", str(max_wait_ms), "--torch-threads", str(torch_threads),
            "--queue-capacity", "4096", "--max-instances", "256", "--frontends", str(frontends)]


@contextmanager
def server(workload: str, max_batch: int, args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    flags = server_flags(workload, max_batch, args.devices, args.max_wait_ms, args.torch_threads,
                         args.frontends)
    with server_process(flags) as started:
        yield started


@contextmanager
def server_process(flags: list[str], cwd: str | None = None,
                   launcher: tuple[str, ...] = ("-m", "app"),
                   times: dict[str, float] | None = None) -> Iterator[tuple[str, int]]:
    """``batchserve serve FLAGS`` on a free loopback port, ready: (url, pid). ``cwd``: the
    checkout whose server runs (default: this one); ``launcher``: what runs it, after the
    Python interpreter (a module that wraps the CLI, as bench.loop_profile does); ``times``:
    see ``listening``."""
    cmd = [sys.executable, *launcher, "serve", "--log-level", "warning", *flags]
    env = {"HF_HUB_OFFLINE": "1", "BATCHSERVE_GRPC_PORT": "0"}  # gRPC: only where flags ask
    with listening(cmd, "/health_check", env, cwd=cwd, times=times) as started:
        yield started


@contextmanager
def listening(cmd: list[str], ready_path: str, env: dict[str, str],
              inherit: bool = True, cwd: str | None = None,
              times: dict[str, float] | None = None) -> Iterator[tuple[str, int]]:
    """``cmd`` serving on a free loopback port, with ``env`` added to the environment: (url,
    pid) once ``GET ready_path`` answers 200; terminated on exit. With ``inherit`` the bound
    socket is passed (``--fd N``, as batchserve takes it); else the port is (``--port N``):
    uvicorn's own ``--fd`` takes any socket for a Unix one and leaves Nagle's algorithm on.
    ``times`` gets the seconds from the start to the first answer of any status
    (``answered``: the server up, its model perhaps still loading) and to the 200
    (``ready``)."""
    import socket

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # as the server's own: its front ends each get a socket beside it (app/listening.py)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    if inherit:
        where, fds = ["--fd", str(sock.fileno())], [sock.fileno()]
    else:
        sock.close()  # the server binds the port itself
        where, fds = ["--port", str(port)], []
    proc = subprocess.Popen([*cmd, *where], pass_fds=fds, env={**os.environ, **env}, cwd=cwd)
    sock.close()
    url = f"http://127.0.0.1:{port}"
    times = {} if times is None else times
    try:
        started = time.monotonic()
        deadline = started + 120
        while True:
            try:
                status = httpx.get(url + ready_path, timeout=2).status_code
                times.setdefault("answered", time.monotonic() - started)
                if status == 200:
                    times["ready"] = time.monotonic() - started
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("bench: the server did not become ready")
            time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(60)


@contextmanager
def body_file(instances: list[Any]) -> Iterator[str]:
    """A temporary file holding the request body ``{"instances": instances}``, for wrk."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"instances": instances}, f)
    try:
        yield f.name
    finally:
        os.unlink(f.name)


def cpu_times(pid: int, thread: int | None = None) -> tuple[float, float]:
    """CPU seconds of process ``pid``, or of its thread ``thread`` (the main thread's id is
    pid): in user space, and in the kernel."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """CPU time of process ``pid``, or of its thread ``thread``, user and kernel together."""
    return sum(cpu_times(pid, thread))


def scrape(url: str, *names: str, **labels: str) -> list[float]:
    """For each of ``names``, the sum of its samples whose labels include ``labels``, all from one
    read of /metrics: a histogram's sum and count then describe the same batches."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples
               if labels.items() <= s.labels.items()]
    return [sum(float(s.value) for s in samples if s.name == name) for name in names]


def batch_totals(url: str) -> tuple[float, float]:
    total, count = scrape(url, "batchserve_batch_size_sum", "batchserve_batch_size_count")
    return total, count


BODY_ENV, BODIES_ENV = "BENCH_BODY_FILE", "BENCH_BODIES_FILE"  # read by bench/post.lua


# ``python -c ON_CORES "0,1" CMD...``: CMD on those cores.
ON_CORES = ("import os, sys; os.sched_setaffinity(0, map(int, sys.argv[1].split(','))); "
            "os.execvp(sys.argv[2], sys.argv[2:])")


def run_wrk(url: str, body_file: str, concurrency: int, seconds: float,
            path: str = "/predict", many: bool = False, threads: int = 1,
            env: dict[str, str] | None = None, cpus: str | None = None) -> dict[str, Any]:
    """wrk with bench/post.lua: the one body in ``body_file``, or with ``many`` one of its lines
    per request; its JSON summary. ``env``: more for post.lua (BENCH_HEADER_LENGTH); ``cpus``:
    the cores wrk runs on ("0,1,2"), set by a Python that then becomes wrk (no taskset needed
    on a bare GPU box: the cores carry over the exec). The summary's ``cpu_s``: wrk's CPU
    seconds, user and system (is the client the bound?)."""
    cmd = ["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{max(1, round(seconds))}s",
           "--timeout", "30s", "-s", str(HERE / "post.lua"), url + path]
    if cpus is not None:
        cmd = [sys.executable, "-c", ON_CORES, cpus, *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, BODIES_ENV if many else BODY_ENV: body_file,
                                 **(env or {})})
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)  # wrk's own CPU, not other children's
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, out)
    line = next(ln for ln in out.splitlines() if ln.startswith("BENCH_JSON "))
    result: dict[str, Any] = json.loads(line.removeprefix("BENCH_JSON "))
    result["cpu_s"] = usage.ru_utime + usage.ru_stime
    return result


def answered_s(r: dict[str, Any]) -> float:
    """Requests per second answered with success in a ``run_wrk`` result: wrk's count less the
    answers it saw with a status of 400 or more (a refusal is not throughput)."""
    return float((r["requests"] - r["http_errors"]) / (r["duration_us"] / 1e6))


def measure(config: str, url: str, pid: int, body_file: str, concurrency: int,
            args: argparse.Namespace, round_: int, offline: float) -> Point:
    run_wrk(url, body_file, concurrency, max(1.0, args.seconds / 5))  # warm the path up
    sum0, count0 = batch_totals(url)
    loop0, cpu0, t0 = cpu_seconds(pid, pid), cpu_seconds(pid), time.monotonic()
    with SmSampler(args.devices) as sm:
        r = run_wrk(url, body_file, concurrency, args.seconds)
    loop1, cpu1, t1 = cpu_seconds(pid, pid), cpu_seconds(pid), time.monotonic()
    sum1, count1 = batch_totals(url)
    req_s = answered_s(r)
    return Point(
        config, concurrency, req_s, req_s * args.instances, r["p50_us"] / 1000,
        r["p90_us"] / 1000, r["p99_us"] / 1000, r["http_errors"] + r["socket_errors"],
        (sum1 - sum0) / max(1.0, count1 - count0), (cpu1 - cpu0) / (t1 - t0),
        (loop1 - loop0) / max(1, r["requests"]) * 1e6, sm.mean, round_, offline,
    )


def rounds_of(report: Report, config: str, concurrency: int) -> list[Point]:
    return [p for p in report.points if p.config == config and p.concurrency == concurrency]


def ratio_line(what: str, ratios: list[float]) -> str:
    """``what``: the median of the rounds' ratios, and each round's when there are several."""
    line = f"{what}: {statistics.median(ratios):.3f} x"
    if len(ratios) > 1:
        line += f" (rounds: {', '.join(f'{r:.3f}' for r in ratios)})"
    return line


def over_unbatched(report: Report, concurrency: int, value: Callable[[Point], float]
                   ) -> list[float]:
    """Each round's batchserve ``value`` over unbatched's at ``concurrency`` (none if either is
    missing)."""
    ours = rounds_of(report, "batchserve", concurrency)
    theirs = rounds_of(report, "unbatched", concurrency)
    if not (ours and theirs):
        return []
    return [value(b) / value(u) for b, u in zip(ours, theirs, strict=True)]


def ratio_lines(report: Report) -> list[str]:
    """The ratios the targets are stated in, each from points of the same round."""
    concurrencies = sorted({p.concurrency for p in report.points})
    lines = []
    for c in concurrencies:
        batch = report.settings["batch_for"].get(str(c))
        ratios = [p.items_s / p.offline_items_s for p in rounds_of(report, "batchserve", c)]
        if ratios:
            lines.append(ratio_line(f"batchserve c={c}: items/s over offline at batch {batch}",
                                    ratios))
    top = concurrencies[-1] if concurrencies else 1
    if top > 1 and (ratios := over_unbatched(report, top, lambda p: p.items_s)):
        lines.append(ratio_line(f"batchserve c={top}: items/s over unbatched", ratios))
    if ratios := over_unbatched(report, 1, lambda p: p.p50_ms):
        lines.append(ratio_line("batchserve c=1: p50 over unbatched p50", ratios))
    return lines


def table(report: Report) -> str:
    several = any(p.round for p in report.points)
    head = (f"{'config':<11}{'conc':>5}" + (f"{'round':>6}" if several else "")
            + f"{'req/s':>10}{'items/s':>10}{'p50 ms':>9}{'p90 ms':>9}"
            f"{'p99 ms':>9}{'errors':>8}{'batch':>7}{'cpu':>6}{'loop us':>8}"
            + (f"{'SM':>7}" if any(p.sm_util is not None for p in report.points) else ""))
    rows = [head, "-" * len(head)]
    rows += [f"{'offline b' + str(b):<11}{'-':>5}" + (f"{'-':>6}" if several else "")
             + f"{'-':>10}{v:>10.0f}" for b, v in sorted(report.offline_by_batch.items())]
    for p in sorted(report.points, key=lambda p: (p.config, p.concurrency, p.round)):
        rows.append(f"{p.config:<11}{p.concurrency:>5}" + (f"{p.round:>6}" if several else "")
                    + f"{p.req_s:>10.0f}{p.items_s:>10.0f}"
                    f"{p.p50_ms:>9.2f}{p.p90_ms:>9.2f}{p.p99_ms:>9.2f}{p.errors:>8}"
                    f"{p.mean_batch:>7.1f}{p.server_cpu:>6.2f}{p.loop_us:>8.0f}"
                    + (f"{p.sm_util:>6.0f}%" if p.sm_util is not None else ""))
    return "\n".join(rows + [""] + ratio_lines(report))


def plot(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    concurrencies = sorted({p.concurrency for p in report.points})
    for config in ("batchserve", "unbatched"):
        pts = {c: rounds_of(report, config, c) for c in concurrencies}
        cs = [c for c in concurrencies if pts[c]]
        ax1.plot(cs, [statistics.median(p.items_s for p in pts[c]) for c in cs], "o-",
                 label=config)
        ax2.plot(cs, [statistics.median(p.p99_ms for p in pts[c]) for c in cs], "o-",
                 label=config)
    ax1.axhline(report.offline_items_s, color="grey", ls="--", label="offline")
    for ax, title in ((ax1, "items/s"), (ax2, "p99 latency (ms, median of rounds)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_title(f"{report.workload}: {title}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run(args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=["linear", "mlp", "minilm"], default="mlp")
    parser.add_argument("--concurrency", default="1,8,64", help="comma list (default 1,8,64)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per measured point")
    parser.add_argument("--devices", default="cpu",
                        help="the server's devices: cpu, cpu,cpu, cuda, cuda:0,cuda:1 (cpu)")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--instances", type=int, default=1, help="instances per request")
    parser.add_argument("--frontends", type=int, default=1,
                        help="the server's front ends (1: one process)")
    parser.add_argument("--configs", default="batchserve,unbatched")
    parser.add_argument("--rounds", type=int, default=1,
                        help="repeat the sweep; each ratio is the median of the rounds' (1)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--jobs", type=int, default=0,
                        help="instead of the sweep: job-queue mode (Redis) with this many jobs, "
                             "one worker then two")
    parser.add_argument("--soak-minutes", type=float, default=0.0,
                        help="instead of the sweep: measure capacity, then hold a share of it "
                             "this long, recording RSS and p99 over time")
    parser.add_argument("--soak-share", type=float, default=0.8, help="share of capacity (0.8)")
    parser.add_argument("--soak-instances", type=int, default=8,
                        help="instances per soak request (keeps the client's request rate low)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    if shutil.which("wrk") is None:
        print("bench: needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print("bench: --rounds must be at least 1", file=sys.stderr)
        return 2
    torch.set_num_threads(args.torch_threads)
    if args.soak_minutes > 0:
        return run_soak(args)
    if args.jobs > 0:
        from bench.jobs import run_jobs

        return run_jobs(args, instance_for(args.workload, 0))
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    settings = {"max_batch_size": args.max_batch_size, "max_wait_ms": args.max_wait_ms,
                "torch_threads": args.torch_threads, "instances_per_request": args.instances,
                "seconds_per_point": args.seconds, "devices": args.devices,
                "rounds": args.rounds}
    # Offline at the batch size each concurrency can fill: min(concurrency x instances, max).
    batch_for = {str(c): min(c * args.instances, args.max_batch_size) for c in concurrencies}
    settings["batch_for"] = batch_for
    device = resolve_devices(args.devices)[0]  # "cuda" is cuda:0, as the server resolves it
    offline_s = max(2.0, args.seconds / 2)
    offline_rounds: dict[int, list[float]] = {}

    def offline(batch: int) -> float:
        print(f"[{args.workload}] offline: model in-process at batch {batch} ...", flush=True)
        items_s = offline_items_s(args.workload, batch, offline_s, args.instances, device)
        offline_rounds.setdefault(batch, []).append(items_s)
        print(f"  {items_s:.0f} items/s", flush=True)
        return items_s

    report = Report(args.workload, settings, 0.0,
                    machine={"cpus": os.cpu_count(), "torch": torch.__version__,
                             "python": sys.version.split()[0]})
    with body_file([instance_for(args.workload, i) for i in range(args.instances)]) as body, \
            ExitStack() as stack:
        servers = {}
        for config in args.configs.split(","):
            max_batch = 1 if config == "unbatched" else args.max_batch_size
            servers[config] = stack.enter_context(server(args.workload, max_batch, args))
            check_answers(servers[config][0], args.workload)
        if args.max_batch_size not in batch_for.values():
            offline(args.max_batch_size)  # the plot's ceiling
        for round_ in range(args.rounds):
            for c in concurrencies:
                ceiling = offline(batch_for[str(c)])
                # Odd rounds reverse the order, so that no server always runs first.
                order = list(servers.items())[::-1 if round_ % 2 else 1]
                for config, (url, pid) in order:
                    print(f"[{args.workload}] {config} concurrency {c} ({args.seconds:.0f}s"
                          f"{f', round {round_ + 1} of {args.rounds}' if args.rounds > 1 else ''})"
                          " ...", flush=True)
                    point = measure(config, url, pid, body, c, args, round_, ceiling)
                    report.points.append(point)
                    print(f"  {point.req_s:.0f} req/s, p50 {point.p50_ms:.2f} ms, "
                          f"p99 {point.p99_ms:.2f} ms, batch {point.mean_batch:.1f}, "
                          f"errors {point.errors}", flush=True)
    report.offline_by_batch = {b: statistics.median(v) for b, v in sorted(offline_rounds.items())}
    report.offline_items_s = report.offline_by_batch[args.max_batch_size]
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = args.out / f"{args.workload}-{stamp}"
    base.with_suffix(".json").write_text(json.dumps(asdict(report), indent=2))
    print("\n" + table(report))
    try:
        plot(report, base.with_suffix(".png"))
        print(f"\nwrote {base}.json and {base}.png")
    except ImportError:
        print(f"\nwrote {base}.json (install matplotlib for the plot)")
    return 0


def run_soak(args: argparse.Namespace) -> int:
    from bench.soak import soak

    instance = instance_for(args.workload, 0)
    with body_file([instance] * args.soak_instances) as body, \
            server(args.workload, args.max_batch_size, args) as (url, pid):
        check_answers(url, args.workload)
        print(f"[{args.workload}] capacity: wrk, concurrency 64, {args.seconds:.0f}s ...",
              flush=True)
        run_wrk(url, body, 64, max(1.0, args.seconds / 5))  # warm the path up
        r = run_wrk(url, body, 64, args.seconds)
        capacity = answered_s(r) * args.soak_instances
        report = soak(args, url, pid, capacity, instance)
    return 0 if report.windows else 1


if __name__ == "__main__":
    sys.exit(main())
