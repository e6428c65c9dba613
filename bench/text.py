"""Length-aware batching for text (issue 12, section 5): ``python -m bench.text``.

Sentences are generated here (nothing is downloaded) with a realistic length mix: a median near
19 tokens and a tail to about 170. It measures, in one run:
- offline, the model alone: 320 sentences as batches of 32 in arrival order, and length-sorted;
- the server on ``minilm`` at concurrency 64, each request one sentence, with length-aware
  batching (the default look-ahead window) and in arrival order (``--length-window 1``),
  alternating short runs of the two servers so both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.run import answered_s, run_wrk, scrape, server_process

VOCABULARY = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her their one all we can has there been if more when "
    "will would who so no out up into do any your what has than them other time new some "
    "could these two may first then only its like over such our most well after very long see "
    "way people city water power system model server request batch device answer network "
    "language night morning market river music history science energy garden window country "
    "village station engineer teacher doctor student question problem reason result service "
    "machine computer quickly slowly carefully quietly together already almost always never "
    "often sometimes"
)
WORDS = VOCABULARY.split()


def sentences(n: int, seed: int = 0) -> list[str]:
    """``n`` sentences, word counts log-normal around 16 words (about 19 tokens with the
    tokenizer's markers), a few up to 160 words."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = min(160, max(3, round(rng.lognormvariate(2.75, 0.8))))
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        out.append(text[0].upper() + text[1:] + ".")
    return out


def offline(texts: list[str], batch: int) -> tuple[float, float]:
    """Items/s of the model alone on batches of ``batch``: in arrival order, and sorted."""
    from app.models.minilm import MiniLMHandler
    from app.transfer import DeviceExecutor

    torch.set_num_threads(1)
    handler = MiniLMHandler()
    device = torch.device("cpu")
    replica, executor = handler.load(device), DeviceExecutor(device)
    items = handler.decode(texts)

    def rate(order: list[Any]) -> float:
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            for i in range(0, len(order), batch):
                executor.launch(handler, replica, order[i:i + batch]).wait()
            runs.append(time.perf_counter() - t0)
        return len(order) / statistics.median(runs)

    rate(items[:batch])  # warm-up
    return rate(items), rate(sorted(items, key=len))


def drive(url: str, bodies: Path, concurrency: int, seconds: float) -> dict[str, Any]:
    return run_wrk(url, str(bodies), concurrency, seconds, many=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.text", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0, help="per measured run")
    parser.add_argument("--rounds", type=int, default=4, help="alternations of the two servers")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-batch-tokens", type=int, default=0, help="0: none")
    args = parser.parse_args(argv)

    from app.models.minilm import MiniLMHandler

    texts = sentences(2000)
    tokens = sorted(len(ids) for ids in MiniLMHandler().decode(texts))
    print(f"sentences: {len(texts)}, tokens median {statistics.median(tokens):.0f}, "
          f"p90 {tokens[int(0.9 * len(tokens))]}, max {tokens[-1]}", flush=True)
    arrival, by_length = offline(texts[:320], args.max_batch_size)
    print(f"offline, 320 sentences in batches of {args.max_batch_size}: arrival order "
          f"{arrival:.0f} items/s, length-sorted {by_length:.0f} items/s "
          f"({by_length / arrival:.2f} x)", flush=True)

    common = ["--model", "minilm", "--devices", "cpu", "--torch-threads", "1",
              "--max-batch-size", str(args.max_batch_size), "--queue-capacity", "4096"]
    if args.max_batch_tokens:
        common += ["--max-batch-tokens", str(args.max_batch_tokens)]
    rows: dict[str, list[dict[str, Any]]] = {"length-aware": [], "arrival order": []}
    waste: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        bodies = Path(tmp) / "bodies.jsonl"
        bodies.write_text("".join(json.dumps({"instances": [t]}) + "\n" for t in texts))
        with server_process(common) as (aware, _), \
                server_process([*common, "--length-window", "1"]) as (fifo, _):
            urls = {"length-aware": aware, "arrival order": fifo}
            for url in urls.values():
                drive(url, bodies, args.concurrency, 2.0)  # warm both up
            for _ in range(args.rounds):
                for name, url in urls.items():
                    rows[name].append(drive(url, bodies, args.concurrency, args.seconds))
            for name, url in urls.items():
                s, c = scrape(url, "batchserve_padding_waste_ratio_sum",
                              "batchserve_padding_waste_ratio_count")
                waste[name] = s / max(1.0, c)

    print(f"\nminilm, concurrency {args.concurrency}, {args.rounds} alternating runs of "
          f"{args.seconds:.0f}s")
    for name, runs in rows.items():
        print(f"  {name:<14} items/s {[round(answered_s(r)) for r in runs]}, p99 ms "
              f"{[round(r['p99_us'] / 1000) for r in runs]}, errors "
              f"{sum(r['http_errors'] + r['socket_errors'] for r in runs)}, mean padding waste "
              f"{waste[name]:.2f}")
    ratios = [answered_s(a) / answered_s(b)
              for a, b in zip(rows["length-aware"], rows["arrival order"], strict=True)]
    p99s = [a["p99_us"] / b["p99_us"]
            for a, b in zip(rows["length-aware"], rows["arrival order"], strict=True)]
    print(f"length-aware / arrival order: items/s {[round(r, 2) for r in ratios]} "
          f"(median {statistics.median(ratios):.2f}), p99 {[round(r, 2) for r in p99s]} "
          f"(median {statistics.median(p99s):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
