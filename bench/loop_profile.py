"""What the event loop does per request: cProfile on the server's main thread, steady state only.

``python -m bench.loop_profile --workload mlp --concurrency 8``: starts batchserve under this
module (``--serve``), drives it with wrk as ``python -m bench`` does, turns the profiler on
(SIGUSR1) after a warm-up and off (SIGUSR2) after ``--seconds``, and prints each function's calls
and microseconds per request, own time first. Start-up and warm-up are not in it, so the counts
are exact per-request figures; the times are inflated by cProfile (most for code that makes many
small calls), so compare them with each other, not with ``loop us`` from ``python -m bench``.
Only the event loop's thread is profiled; the device thread is not.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.run import body_file, instance_for, run_wrk, server_flags, server_process


def serve(out: str, argv: list[str]) -> int:
    """Run ``batchserve`` (``argv``) with the profiler switched by SIGUSR1 / SIGUSR2."""
    profile = cProfile.Profile()

    def stop(*_: object) -> None:
        profile.disable()
        profile.dump_stats(out + ".part")
        os.replace(out + ".part", out)  # whole, or not there yet

    signal.signal(signal.SIGUSR1, lambda *_: profile.enable())
    signal.signal(signal.SIGUSR2, stop)
    from app.cli import main

    return main(argv)


def short(path: str) -> str:
    """A code file's path from its package root: site-packages, the standard library or here."""
    path = re.sub(r"^.*/(site-packages|lib/python3\.\d+)/", "", path)
    return os.path.relpath(path) if path.startswith(os.getcwd()) else path


def report(stats_path: str, requests: int, top: int) -> str:
    rows = []
    stats = pstats.Stats(stats_path).stats  # type: ignore[attr-defined]
    for (file, line, name), (_, calls, own, total, _) in stats.items():
        rows.append((calls / requests, own / requests * 1e6, total / requests * 1e6,
                     f"{short(file)}:{line}({name})"))
    rows.sort(key=lambda r: -r[1])
    lines = [f"{'calls':>7} {'own us':>7} {'cum us':>7}  per request ({requests} requests)"]
    lines += [f"{c:7.2f} {o:7.2f} {t:7.2f}  {where}" for c, o, t, where in rows[:top]]
    lines.append(f"all functions: {sum(r[0] for r in rows):.1f} calls and "
                 f"{sum(r[1] for r in rows):.1f} us of own time a request")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve(argv[1], argv[2:])
    parser = argparse.ArgumentParser(prog="python -m bench.loop_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="mlp", choices=["linear", "mlp", "minilm"])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0, help="profiled wrk run")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--top", type=int, default=60, help="functions printed")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "loop.prof")
        flags = server_flags(args.workload, args.max_batch_size)
        launcher = ("-m", "bench.loop_profile", "--serve", out)
        with body_file([instance_for(args.workload, 0)]) as body, \
                server_process(flags, launcher=launcher) as (url, pid):
            run_wrk(url, body, args.concurrency, 2)  # warm-up, not profiled
            os.kill(pid, signal.SIGUSR1)
            result = run_wrk(url, body, args.concurrency, args.seconds)
            os.kill(pid, signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not os.path.exists(out) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not os.path.exists(out):
                raise SystemExit("bench.loop_profile: the server wrote no profile")
        print(report(out, result["requests"], args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
