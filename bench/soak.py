"""``python -m bench --soak-minutes N``: a long run at a fixed share of measured capacity.

1. Start the server (same settings as the sweep) and measure its capacity with wrk (closed loop,
   concurrency 64) in items/s.
2. Offer ``soak_share`` (80 %) of that, open loop, from an asyncio client: requests of
   ``soak_instances`` instances each, so the client sends few requests and stays off the
   server's CPU.
3. Every window (10 s) record the server's RSS (with ``--frontends N``, its processes' together)
   and the window's p50/p99 and errors.
Targets (issue 5): RSS growth under 5 % after warm-up, p99 drift under 20 %, both comparing the
median of the first three windows after warm-up with the median of the last three.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

JSON = {"content-type": "application/json"}


@dataclass
class Window:
    t_s: float
    rss_mib: float
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float


@dataclass
class SoakReport:
    workload: str
    capacity_items_s: float
    offered_items_s: float
    instances_per_request: int
    warmup_s: float
    windows: list[Window] = field(default_factory=list)
    rss_growth: float = 0.0
    p99_drift: float = 0.0


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid`` and its children (a split server's front ends)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    total = 0.0
    for each in [pid, *map(int, children)]:
        try:
            lines = Path(f"/proc/{each}/status").read_text().splitlines()
        except FileNotFoundError:  # a front end replaced meanwhile
            continue
        total += sum(int(line.split()[1]) for line in lines if line.startswith("VmRSS:")) / 1024
    return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def open_loop(url: str, body: bytes, rate: float, seconds: float, pid: int,
                    window_s: float) -> list[Window]:
    """Send ``rate`` requests/s for ``seconds`` whatever the answers; one Window per window_s."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    windows: list[Window] = []
    latencies: list[float] = []
    errors = 0
    start = time.monotonic()

    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one() -> None:
            nonlocal errors
            t0 = time.monotonic()
            try:
                r = await client.post("/predict", content=body, headers=JSON)
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            latencies.append(time.monotonic() - t0)
            errors += not ok

        tasks: set[asyncio.Task[None]] = set()
        next_window = start + window_s
        i = 0
        while (now := time.monotonic()) < start + seconds:
            if now >= next_window:
                done, latencies[:] = list(latencies), []
                windows.append(Window(round(now - start, 1), rss_mib(pid), len(done), errors,
                                      percentile(done, 0.5) * 1000, percentile(done, 0.99) * 1000))
                print(f"  t={now - start:5.0f}s rss {windows[-1].rss_mib:7.1f} MiB "
                      f"p99 {windows[-1].p99_ms:7.2f} ms errors {errors}", flush=True)
                errors = 0
                next_window += window_s
            # Always yield, so the requests already sent run even when this client falls
            # behind the rate (each window's request count then shows it).
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        if tasks:
            await asyncio.gather(*tasks)
    return windows


def drift(windows: list[Window], attr: str) -> float:
    """(median of the last three windows) / (median of the first three) - 1."""
    if len(windows) < 6:
        return float("nan")
    first = statistics.median(getattr(w, attr) for w in windows[:3])
    last = statistics.median(getattr(w, attr) for w in windows[-3:])
    return last / first - 1 if first else float("nan")


def plot(report: SoakReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ts = [w.t_s for w in report.windows]
    ax1.plot(ts, [w.rss_mib for w in report.windows], "o-")
    ax1.set_title(f"{report.workload} soak: server RSS (MiB)")
    ax2.plot(ts, [w.p99_ms for w in report.windows], "o-", label="p99")
    ax2.plot(ts, [w.p50_ms for w in report.windows], "o-", label="p50")
    ax2.set_title("latency per window (ms)")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.axvline(report.warmup_s, color="grey", ls="--")
        ax.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def soak(args: argparse.Namespace, url: str, pid: int, capacity_items_s: float,
         instance: Any) -> SoakReport:
    n = args.soak_instances
    offered = capacity_items_s * args.soak_share
    warmup_s = 60.0
    report = SoakReport(args.workload, capacity_items_s, offered, n, warmup_s)
    print(f"[{args.workload}] soak: {offered:.0f} items/s ({args.soak_share:.0%} of "
          f"{capacity_items_s:.0f}) for {args.soak_minutes:g} min, {n} instances a request",
          flush=True)
    body = json.dumps({"instances": [instance] * n}).encode()  # encoded once: a light client
    windows = asyncio.run(open_loop(url, body, offered / n, args.soak_minutes * 60, pid, 10.0))
    report.windows = windows
    after = [w for w in windows if w.t_s > warmup_s]
    report.rss_growth = drift(after, "rss_mib")
    report.p99_drift = drift(after, "p99_ms")
    print(f"\nRSS growth after warm-up: {report.rss_growth:+.1%} (target < 5%)\n"
          f"p99 drift after warm-up: {report.p99_drift:+.1%} (target < 20%)\n"
          f"errors: {sum(w.errors for w in windows)} of {sum(w.requests for w in windows)}",
          flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.out / f"soak-{args.workload}-{time.strftime('%Y%m%d-%H%M%S')}"
    base.with_suffix(".json").write_text(json.dumps(asdict(report), indent=2))
    plot(report, base.with_suffix(".png"))
    print(f"wrote {base}.json and {base}.png")
    return report
