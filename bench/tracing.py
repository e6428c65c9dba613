"""What tracing costs (issue 13): ``python -m bench.tracing``.

`linear` (or ``--model mlp``) at concurrency 64 (wrk), one server with tracing off and one with
it on (every request traced: its server span, queue and device spans, one span per batch;
exported over OTLP/HTTP to a receiver in this process that answers 200 and only counts), in
alternating runs so both see the same machine. Needs wrk and the otel extra.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.run import answered_s, run_wrk, server_process
from tests.otlp import Receiver, receiving

BODIES = {"linear": '{"instances": [[1.0, 2.0, 3.0, 4.0]]}',
          "mlp": json.dumps({"instances": [[0.5] * 512]})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="per measured run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--model", default="linear", choices=["linear", "mlp"])
    parser.add_argument("--sample", type=float, default=None,
                        help="trace this share of requests (OTEL_TRACES_SAMPLER "
                        "parentbased_traceidratio); default: all")
    args = parser.parse_args(argv)
    if args.sample is not None:
        os.environ["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
        os.environ["OTEL_TRACES_SAMPLER_ARG"] = str(args.sample)
    with receiving(decode=False) as sink:
        results = compare(args, sink.url)
    report(results, sink)
    return 0


def compare(args: argparse.Namespace, endpoint: str) -> dict[str, list[dict[str, Any]]]:
    base = ["--model", args.model, "--devices", "cpu", "--torch-threads", "1",
            "--queue-capacity", "4096"]
    configs = {"off": base, "on": [*base, "--otel-endpoint", endpoint]}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "body.json"
        body.write_text(BODIES[args.model])
        for _ in range(args.rounds):
            for name, flags in configs.items():
                with server_process(flags) as (url, _):
                    run_wrk(url, str(body), args.concurrency, 2.0)  # warm up
                    r = run_wrk(url, str(body), args.concurrency, args.seconds)
                results[name].append({"req_s": answered_s(r),
                                      "p50_ms": r["p50_us"] / 1000, "p99_ms": r["p99_us"] / 1000,
                                      "errors": r["http_errors"] + r["socket_errors"]})
    return results


def report(results: dict[str, list[dict[str, Any]]], sink: Receiver) -> None:
    for name, runs in results.items():
        print(f"tracing {name:<3}  req/s {[round(r['req_s']) for r in runs]}, "
              f"p50 ms {[round(r['p50_ms'], 2) for r in runs]}, "
              f"p99 ms {[round(r['p99_ms'], 2) for r in runs]}, "
              f"errors {sum(r['errors'] for r in runs)}")
    ratios = [on["req_s"] / off["req_s"] for on, off in zip(results["on"], results["off"],
                                                              strict=True)]
    p99 = [on["p99_ms"] / off["p99_ms"] for on, off in zip(results["on"], results["off"],
                                                           strict=True)]
    print(f"on / off: req/s {[round(x, 2) for x in ratios]} (median "
          f"{statistics.median(ratios):.2f}), p99 {[round(x, 2) for x in p99]} (median "
          f"{statistics.median(p99):.2f}); the sink took {sink.requests} exports, "
          f"{sink.bytes / 1e6:.1f} MB")


if __name__ == "__main__":
    sys.exit(main())
