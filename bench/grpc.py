"""``python -m bench.grpc``: the Open Inference Protocol over gRPC (ModelInfer calls, and
ModelStreamInfer: perf_analyzer's ``--streaming``) against HTTP with binary tensors.

One server per workload serving both protocols; Triton's perf_analyzer (``make tools``) drives it
over each in turn at each concurrency, rotating which goes first from round to round, so all
meet the same machine: requests per second, p50 and p99 (perf_analyzer's own figures, one
request of one row each, zeros as data), each gRPC way's ratio to HTTP in each round, and the
server process's CPU per request answered, which does not depend on how fast the client on the same
cores is. perf_analyzer's stability check is off (this box never holds still): the rounds and
their medians stand in for it.

    python -m bench.grpc --workloads linear,mlp --concurrency 1,8,64 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import statistics
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.run import cpu_seconds, scrape, server_flags, server_process

ROOT = Path(__file__).resolve().parents[1]
PERF_ANALYZER = ROOT / ".tools" / "perf_analyzer" / "perf_analyzer"
PROTOCOLS = ("http", "grpc", "stream")  # stream: gRPC's ModelStreamInfer


@dataclass
class Point:
    workload: str
    protocol: str
    concurrency: int
    req_s: float
    p50_ms: float
    p99_ms: float
    server_us: float = 0.0  # the server process's CPU per request answered (all its threads)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def perf_analyzer(model: str, protocol: str, target: str, concurrency: int,
                  window_ms: int) -> Point:
    formats = ["--input-tensor-format", "binary", "--output-tensor-format", "binary"] \
        if protocol == "http" else ["--streaming"] if protocol == "stream" else []
    proc = subprocess.run(
        [str(PERF_ANALYZER), "-m", model, "-u", target, "-i", label(protocol), *formats,
         "--input-data", "zero",  # random bytes hold NaNs, which are refused
         "--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms),
         "--stability-percentage", "1000", "--max-trials", "3"],
        capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"perf_analyzer failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    out = proc.stdout
    req_s = float(re.findall(r"Throughput: ([\d.]+) infer/sec", out)[-1])
    p50 = float(re.findall(r"p50 latency: (\d+) usec", out)[-1]) / 1000
    p99 = float(re.findall(r"p99 latency: (\d+) usec", out)[-1]) / 1000
    return Point(model, protocol, concurrency, req_s, p50, p99)


def run(workloads: list[str], concurrencies: list[int], rounds: int, window_ms: int
        ) -> list[Point]:
    points = []
    for workload in workloads:
        grpc_port = free_port()
        flags = [*server_flags(workload, 64), "--grpc-port", str(grpc_port)]
        with server_process(flags) as (url, pid):
            targets = {"http": url.removeprefix("http://"), "grpc": f"127.0.0.1:{grpc_port}"}
            for r in range(rounds):
                for concurrency in concurrencies:
                    order = PROTOCOLS[r % 3:] + PROTOCOLS[:r % 3]
                    for protocol in order:
                        counted = {"protocol": label(protocol)}
                        (before,) = scrape(url, "batchserve_requests_total", **counted)
                        cpu = cpu_seconds(pid)
                        point = perf_analyzer(workload, protocol, targets[label(protocol)],
                                              concurrency, window_ms)
                        (after,) = scrape(url, "batchserve_requests_total", **counted)
                        point.server_us = (cpu_seconds(pid) - cpu) / max(1.0, after - before) * 1e6
                        print(json.dumps(asdict(point)), flush=True)
                        points.append(point)
    return points


def label(protocol: str) -> str:
    """The protocol as perf_analyzer's ``-i`` and the metrics' label name it."""
    return "grpc" if protocol == "stream" else protocol


def against_http(runs: dict[str, list[Point]], protocol: str) -> str:
    """``protocol``'s median req/s, and the median of its rounds' ratios to HTTP's, each after."""
    ratios = [g.req_s / h.req_s for h, g in zip(runs["http"], runs[protocol], strict=True)]
    rounds = ", ".join(f"{r:.2f}" for r in ratios)
    req_s = statistics.median(p.req_s for p in runs[protocol])
    return f"{req_s:,.0f}, {statistics.median(ratios):.2f} x ({rounds})"


def table(points: list[Point]) -> str:
    """Medians over the rounds; a ratio is the median of each round's own (the runs of a round
    went back to back), with the rounds' ratios after it."""
    lines = ["| workload | c | HTTP binary req/s | gRPC req/s, / HTTP (rounds) | gRPC stream "
             "req/s, / HTTP (rounds) | p50 / p99 ms: HTTP; gRPC; stream | server CPU us a "
             "request: HTTP, gRPC, stream |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for workload, c in sorted({(p.workload, p.concurrency) for p in points}):
        runs = {protocol: [p for p in points if (p.workload, p.concurrency, p.protocol)
                           == (workload, c, protocol)] for protocol in PROTOCOLS}
        med = {protocol: [statistics.median(getattr(p, field) for p in mine)
                          for field in ("req_s", "p50_ms", "p99_ms", "server_us")]
               for protocol, mine in runs.items()}
        tails = "; ".join(f"{m[1]:.2f} / {m[2]:.2f}" for m in med.values())
        cpu = ", ".join(f"{m[3]:.0f}" for m in med.values())
        lines.append(f"| {workload} | {c} | {med['http'][0]:,.0f} | {against_http(runs, 'grpc')} | "
                     f"{against_http(runs, 'stream')} | {tails} | {cpu} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="linear,mlp")
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=2000)
    args = parser.parse_args()
    if not PERF_ANALYZER.exists():
        raise SystemExit("perf_analyzer is not here: make tools fetches it")
    points = run(args.workloads.split(","), [int(c) for c in args.concurrency.split(",")],
                 args.rounds, args.window_ms)
    print(table(points))


if __name__ == "__main__":
    main()
