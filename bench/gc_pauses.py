"""Full garbage collections in a serving process: how long each held the GIL, and how often.

``python -m bench.gc_pauses``: a model repository in a temporary folder (``linear`` and
``minilm``); one server process (``--frontends 1``) starts on ``linear`` in explicit mode and
``minilm`` is loaded through the repository API once it is ready (``--at-start``: loaded at
start, with the rest); then wrk sends one sentence a request to ``minilm`` for ``--seconds``,
and every full (oldest-generation) collection the process ran during that load is printed: its
milliseconds and what it collected (and those while minilm loaded). ``--base DIR`` runs the
server of another checkout (a ``git worktree``): the same measure before a change.

A process freezes what is alive once it is ready (app/process.py), so full collections scan
only what came after; a model loaded later brings its own libraries' objects (MiniLM's
transformers: about 213,000), which they scan again unless the load froze them too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import httpx

from bench.run import TEXTS, body_file, run_wrk, server_process

# Run as ``python -c``, so that ``app`` is the server's checkout (its working directory), not
# this one's: each full collection's milliseconds, what it collected and the frozen objects.
SERVE = """
import gc, os, sys, time
out = open(os.environ["BENCH_GC_OUT"], "a", buffering=1)
started = [0.0]
def collected(phase, info):
    if info["generation"] == 2:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            ms = (time.perf_counter() - started[0]) * 1e3
            out.write(f"{ms:.2f} {info['collected']} {gc.get_freeze_count()}\\n")
gc.callbacks.append(collected)
from app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def pauses(log: Path) -> list[tuple[float, int, int]]:
    """(ms, collected, frozen) of each full collection ``log`` holds so far."""
    rows = []
    for line in log.read_text().splitlines():
        ms, collected, frozen = line.split()
        rows.append((float(ms), int(collected), int(frozen)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gc_pauses",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="the load (20)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--at-start", action="store_true", help="load minilm at start")
    parser.add_argument("--base", type=Path, default=None, help="another checkout's server")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        repo, log = Path(tmp) / "models", Path(tmp) / "gc.log"
        for name, model in (("lin", "linear"), ("embed", "minilm")):
            (repo / name).mkdir(parents=True)
            (repo / name / "config.toml").write_text(f'model = "{model}"\n')
        log.touch()
        os.environ["BENCH_GC_OUT"] = str(log)  # the server's environment is this one's
        flags = ["--model-repository", str(repo), "--model-control-mode", "explicit",
                 "--load-model", "lin", "--devices", "cpu", "--frontends", "1"]
        if args.at_start:
            flags += ["--load-model", "embed"]
        cwd = str(args.base.resolve()) if args.base else None
        with server_process(flags, cwd, ("-c", SERVE)) as (url, _), \
                body_file([TEXTS[0]]) as body:
            loading = len(pauses(log))
            if not args.at_start:
                loaded = httpx.post(url + "/v2/repository/models/embed/load", timeout=300)
                loaded.raise_for_status()
            in_load = pauses(log)[loading:]
            run_wrk(url, body, args.concurrency, 2, "/models/embed/predict")  # warm-up
            before = len(pauses(log))
            result = run_wrk(url, body, args.concurrency, args.seconds, "/models/embed/predict")
            during = pauses(log)[before:]
    req_s = result["requests"] / result["duration_us"] * 1e6
    print(f"minilm {'loaded at start' if args.at_start else 'loaded once ready'}"
          f"{f' ({args.base})' if args.base else ''}: {req_s:,.0f} req/s, p99 "
          f"{result['p99_us'] / 1000:.1f} ms; {len(during)} full collections in "
          f"{args.seconds:.0f} s")
    if in_load:
        print(f"  while it loaded: {len(in_load)} full collections, "
              + ", ".join(f"{ms:.1f}" for ms, _, _ in in_load) + " ms")
    for ms, collected, frozen in during:
        print(f"  {ms:8.2f} ms, {collected:,} collected, {frozen:,} objects frozen")
    if during:
        print(f"  median {statistics.median(ms for ms, _, _ in during):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
