"""``python -m bench.peers``: batchserve against the Python peers on the same workload.

``linear`` (nn.Linear(4, 2): serving overhead alone) with one JSON instance a request, batches of
up to 32 within 5 ms, one torch thread, each server as its default runs it on this machine:
batchserve (one process; and with ``--frontends 2``), Mosec and LitServe (bench/peers/, run in
``--peers-python``'s environment, where ``pip install -c constraints.txt mosec litserve torch``
put them: they are not our dependencies). All are up at once; wrk runs against each in turn,
rounds alternating the order; the table gives the medians and each over batchserve per round.

    python -m bench.peers --peers-python /tmp/peers/bin/python --concurrency 64 --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

from bench.run import answered_s, body_file, listening, run_wrk, server_flags, server_process

HERE = Path(__file__).resolve().parent
PEERS = {  # name: (script, path of the predict route, path that answers 200 when ready)
    "mosec": ("mosec_linear.py", "/inference", "/"),
    "litserve": ("litserve_linear.py", "/predict", "/health"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers-python", required=True,
                        help="a Python whose environment has mosec, litserve and torch")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    servers: dict[str, tuple[str, str]] = {}  # name: (url, predict path)
    with contextlib.ExitStack() as stack, body_file([[1.0, 2.0, 3.0, 4.0]]) as body:
        for frontends in (1, 2):
            url, _ = stack.enter_context(server_process(server_flags("linear", 32,
                                                                     frontends=frontends)))
            servers["batchserve" if frontends == 1 else "batchserve --frontends 2"] = (
                url, "/predict")
        for name, (script, path, ready) in PEERS.items():
            cmd = [args.peers_python, str(HERE / "peers" / script)]
            if name == "mosec":
                cmd += ["--address", "127.0.0.1", "--log-level", "error"]
            url, _ = stack.enter_context(listening(cmd, ready, {}, inherit=False))
            servers[name] = (url, path)
        names = list(servers)
        runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                url, path = servers[name]
                result = run_wrk(url, body, args.concurrency, 2.0, path)  # warm-up
                result = run_wrk(url, body, args.concurrency, args.seconds, path)
                point = {"req_s": answered_s(result), "p50_ms": result["p50_us"] / 1000,
                         "p99_ms": result["p99_us"] / 1000,
                         "errors": result["http_errors"] + result["socket_errors"]}
                runs[name].append(point)
                print(name, point, file=sys.stderr, flush=True)
    print(f"| server (c={args.concurrency}) | req/s | p50 ms | p99 ms | errors | "
          "over batchserve (rounds) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in names:
        ratios = [p["req_s"] / b["req_s"] for p, b in zip(runs[name], runs["batchserve"],
                                                           strict=True)]
        med = {k: statistics.median(p[k] for p in runs[name]) for k in ("req_s", "p50_ms",
                                                                         "p99_ms")}
        errors = sum(int(p["errors"]) for p in runs[name])
        print(f"| {name} | {med['req_s']:,.0f} | {med['p50_ms']:.2f} | {med['p99_ms']:.2f} | "
              f"{errors} | {statistics.median(ratios):.2f} x "
              f"({', '.join(f'{x:.2f}' for x in ratios)}) |")


if __name__ == "__main__":
    main()
