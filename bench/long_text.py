"""What a long text costs minilm's decode: ``python -m bench.long_text``.

For each kind of text (words, CJK, punctuation, white space, one endless word) of up to 16 MB,
the handler's decode (which tokenizes a first part where that gives the same tokens, and
refuses text whose first MiB makes fewer than the 256 tokens the model reads) against
tokenizing the whole text, as the decode did before: the median of ``--rounds`` each, in one
run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from app.errors import InvalidInput
from app.models.minilm import MiniLMHandler

MB = 1 << 20


def texts(size: int) -> dict[str, str]:
    return {
        "words": ("word " * (size // 5 + 1))[:size],
        "CJK": ("中文的句子" * (size // 5 + 1))[:size],
        "punctuation": "." * size,
        "white space": " " * size,
        "one word": "a" * size,
    }


def median_s(call: Callable[[], Any], rounds: int) -> tuple[float, str]:
    times, outcome = [], ""
    for _ in range(rounds):
        started = time.perf_counter()
        try:
            outcome = f"{len(call())} ids"
        except InvalidInput:
            outcome = "refused"
        times.append(time.perf_counter() - started)
    return statistics.median(times), outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    handler = MiniLMHandler()
    whole = handler._tokenizer
    print(f"{'text':12} {'MB':>3} {'decode s':>9} {'whole s':>8} {'ratio':>7}  decode gives")
    for mb in args.mb:
        for kind, text in texts(mb * MB).items():
            ours, outcome = median_s(lambda t=text: handler.decode([t])[0], args.rounds)
            before, _ = median_s(lambda t=text: whole.encode(t).ids, args.rounds)
            print(f"{kind:12} {mb:>3} {ours:9.4f} {before:8.2f} {before / ours:7.0f}  {outcome}")


if __name__ == "__main__":
    main()
