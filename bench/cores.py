"""``python -m bench.cores``: how fast one core runs Python alone and with every core busy.

A front end's CPU a request was 127-139 us on the H200 box and 81 on the 2-core CPU box at as
many requests a message (docs/frontends.md): the same code. Whether that box's cores slow each
other down (SMT siblings shown as cores, a shared frequency budget) decides whether more front
ends can add throughput there. Each process runs rounds of a front end's kind of work for
``--seconds``: parse mlp's JSON body (C, allocating) and a little plain Python (calls, dicts,
attributes); the rounds a second of one process alone, then of K at once, K = each of
``--processes`` (default: half the cores and all of them, and every online CPU where a quota
or the affinity allows fewer).

First it prints the CPU quota on this process's cgroups (``docker --cpus``, a Kubernetes CPU
limit: the usable cores count it) and their throttling counters; ``--cgroup`` prints only
those, to compare after a run: a quota the whole box shares (the server, wrk) shows as
throttled periods there, not as any one process's CPU.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import time

from app.process import cgroup_files, usable_cores


def _body() -> bytes:
    rng = random.Random(0)
    return json.dumps({"instances": [[round(rng.uniform(-1, 1), 6) for _ in range(512)]]}).encode()


class _Request:
    def __init__(self, headers: dict[bytes, bytes]) -> None:
        self.headers = headers
        self.status = 0


def _python(n: int) -> int:
    total = 0
    for i in range(n):
        request = _Request({b"content-type": b"application/json", b"x-id": b"%d" % i})
        request.status = 200 if request.headers.get(b"content-type") else 400
        total += request.status
    return total


def _spin(seconds: float, start: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    body = _body()
    while time.monotonic() < start:
        pass
    n, end = 0, start + seconds
    while time.monotonic() < end:
        json.loads(body)
        _python(20)
        n += 1
    out.put(n / seconds)


def rates(k: int, seconds: float) -> list[float]:
    """Rounds a second of each of ``k`` processes started together."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = time.monotonic() + 1.0 + 0.05 * k  # all spawned before any starts
    procs = [ctx.Process(target=_spin, args=(seconds, start, out)) for _ in range(k)]
    for p in procs:
        p.start()
    got = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return got


def cpu_cgroup() -> str:
    """The CPU quota files (v2 ``cpu.max``; v1 ``cpu.cfs_quota_us``, -1: none) and throttling
    counters on this process's cgroups, nearest first, one line each."""
    found = [*cgroup_files("cpu.max", "cpu", "cpu.cfs_quota_us"),
             *cgroup_files("cpu.stat", "cpu", "cpu.stat")]
    lines = [f"{path}: {' '.join(text.split())}" for path, text in found
             if path.name != "cpu.stat" or "throttled" in text]
    return "\n".join(lines) or "no CPU cgroup files"


def main() -> None:
    cores, online = usable_cores(), os.cpu_count() or 1
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--processes", default=",".join(str(k) for k in sorted(
        {max(1, cores // 2), cores, online})), help="comma list of K (half the cores, all of "
        "them, and every online CPU)")
    parser.add_argument("--cgroup", action="store_true",
                        help="print the CPU quota and throttling counters only")
    args = parser.parse_args()
    print(cpu_cgroup())
    if args.cgroup:
        return
    alone = rates(1, args.seconds)[0]
    print(f"== {cores} usable cores ({online} online); one process alone: "
          f"{alone:,.0f} rounds/s")
    for k in (int(x) for x in args.processes.split(",")):
        got = rates(k, args.seconds)
        print(f"{k:3d} at once: each {statistics.median(got):,.0f} rounds/s (median; least "
              f"{min(got):,.0f}), {statistics.median(got) / alone:.2f} x alone")


if __name__ == "__main__":
    main()
