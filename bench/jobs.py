"""``python -m bench --jobs N``: job-queue mode throughput with one and with two workers.

Starts redis-server on a free loopback port and ``batchserve worker`` processes (same settings as
the HTTP sweep), enqueues N jobs of ``--instances`` instances each with the Python client, and
measures from the first enqueue to the last result. Workers are started and ready (their consumer
group exists and a warm-up job is answered) before the clock starts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from app.jobs.client import submit


@contextmanager
def redis_server() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workdir = tempfile.mkdtemp()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        for _ in range(200):
            try:
                redis.Redis.from_url(url).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def workers(url: str, n: int, args: argparse.Namespace) -> Iterator[None]:
    cmd = [sys.executable, "-m", "app", "worker", "--redis-url", url, "--model", args.workload,
           "--devices", "cpu", "--max-batch-size", str(args.max_batch_size), "--max-wait-ms",
           str(args.max_wait_ms), "--torch-threads", str(args.torch_threads),
           "--max-instances", "256", "--log-level", "warning"]
    procs = [subprocess.Popen(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)


def run_jobs(args: argparse.Namespace, instance: Any) -> int:
    if shutil.which("redis-server") is None:
        print("bench: --jobs needs redis-server (apt-get install redis-server)", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"workload": args.workload, "jobs": args.jobs,
                              "instances_per_job": args.instances, "points": []}
    job = [instance] * args.instances
    for n in (1, 2):
        with redis_server() as url, workers(url, n, args):
            client = redis.Redis.from_url(url)
            while len(client.keys("batchserve:worker:*")) < n:
                time.sleep(0.1)  # each worker announces itself once its model is loaded
            submit(url, [job] * (8 * n), timeout_s=300)  # warm-up
            print(f"[{args.workload}] jobs: {n} worker(s), {args.jobs} jobs ...", flush=True)
            t0 = time.perf_counter()
            results = submit(url, [job] * args.jobs, timeout_s=600)
            seconds = time.perf_counter() - t0
        errors = sum(r["status"] != "ok" for r in results)
        point = {"workers": n, "seconds": seconds, "jobs_s": args.jobs / seconds,
                 "items_s": args.jobs * args.instances / seconds, "errors": errors}
        report["points"].append(point)
        print(f"  {point['jobs_s']:.0f} jobs/s, {point['items_s']:.0f} items/s, "
              f"errors {errors}", flush=True)
    one, two = (p["jobs_s"] for p in report["points"])
    print(f"\ntwo workers: {two / one:.2f} x one worker")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"jobs-{args.workload}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 0
