"""Which waiting items form a batch of similar lengths, for a model that pads a batch to its
longest item (docs/scheduler.md, section 5). Pure: the queue hands in what waits."""

from __future__ import annotations

from typing import Any

Waiting = tuple[int, int, Any]  # (priority level, age within the level, item)


def similar(seen: list[Waiting], lengths: list[int], target: int, urgent: list[bool],
            limit: int, max_tokens: int | None, held: tuple[int, int] = (0, 0)
            ) -> list[Waiting]:
    """The items of ``seen`` (the oldest waiting, in queue order; their ``lengths``) to batch
    with an item of length ``target``: by level, the ``urgent`` ones (due soon) first, then the
    lengths closest to the target, then age, while the batch stays within ``limit`` items and
    ``max_tokens`` padded tokens (a lone item is taken whatever its length). ``held``: (items,
    longest) already in the batch this adds to. Returned in queue order."""
    count, longest = held
    n = count + len(seen)
    if seen and len(seen) <= limit and (
            max_tokens is None or n <= 1 or max(longest, *lengths) * n <= max_tokens):
        return list(seen)  # all of them fit: no order to choose by (the usual case)
    return _closest(seen, lengths, target, urgent, limit, max_tokens, held)


def _closest(seen: list[Waiting], lengths: list[int], target: int, urgent: list[bool],
             limit: int, max_tokens: int | None, held: tuple[int, int]) -> list[Waiting]:
    """``similar``'s choice, item by item in the order it prefers."""
    order = sorted(range(len(seen)), key=lambda i: (seen[i][0], not urgent[i],
                                                    abs(lengths[i] - target), seen[i][1]))
    chosen: list[int] = []
    count, longest = held
    for i in order:
        if len(chosen) == limit:
            break
        size = max(longest, lengths[i])
        n = count + len(chosen) + 1
        if n > 1 and max_tokens is not None and size * n > max_tokens:
            continue
        chosen.append(i)
        longest = size
    return [seen[i] for i in sorted(chosen, key=lambda i: (seen[i][0], seen[i][1]))]
