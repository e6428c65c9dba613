"""``python -m bench.gil_share FILE...``: how a process's threads shared the GIL, from py-spy's
raw samples taken with ``--gil --threads`` (``bench.frontends --profile``, ``bench.device
--profile``).

Each sample is a stack whose first frame names its thread; with ``--gil`` py-spy records only
the thread that holds the GIL. Printed per file: each thread's share of the samples (the device
threads' stacks start in ``Thread._bootstrap``; the rest is the event loop's thread), and the
frames most often on each thread's stack, leaving out those on 80 % of them or more (the
thread's entry).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path


def shares(lines: list[str]) -> tuple[Counter[str], dict[str, Counter[str]]]:
    """Samples per thread kind, and per thread kind the samples each frame was on the stack."""
    per_thread: Counter[str] = Counter()
    frames: dict[str, Counter[str]] = {}
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        names = stack.split(";")
        thread = "device threads" if any("Thread._bootstrap" in f for f in names[:2]) \
            else "event loop"
        per_thread[thread] += int(count)
        seen = frames.setdefault(thread, Counter())
        for name in set(names):
            seen[name] += int(count)
    return per_thread, frames


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=12, help="frames shown a thread kind (12)")
    args = p.parse_args(argv)
    for path in args.files:
        per_thread, frames = shares(path.read_text().splitlines())
        total = sum(per_thread.values())
        print(f"== {path.name}: {total} samples holding the GIL")
        for thread, n in per_thread.most_common():
            print(f"  {thread}: {n / max(1, total):.0%}")
            telling = [(name, k) for name, k in frames[thread].most_common()
                       if k < 0.8 * n][:args.top]  # not the thread's entry, on every stack
            for name, k in telling:
                print(f"    {k / max(1, n):5.1%}  {name[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
