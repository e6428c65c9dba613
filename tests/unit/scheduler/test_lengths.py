"""app/scheduler/lengths.py: which waiting items make a batch of similar lengths."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduler.lengths import _closest, similar


def waiting(*lengths: int, level: int = 0) -> list[tuple[int, int, str]]:
    return [(level, age, f"item{age}") for age in range(len(lengths))]


def test_closest_lengths_join_the_oldest_and_come_back_in_queue_order() -> None:
    seen = waiting(20, 150, 22, 160, 19)
    chosen = similar(seen, [20, 150, 22, 160, 19], 20, [False] * 5, limit=3, max_tokens=None)
    assert [item for _, _, item in chosen] == ["item0", "item2", "item4"]


def test_the_token_budget_keeps_an_outlier_out_but_a_lone_item_goes() -> None:
    lengths = [20, 150, 22]
    chosen = similar(waiting(*lengths), lengths, 20, [False] * 3, limit=3, max_tokens=100)
    assert [item for _, _, item in chosen] == ["item0", "item2"]  # 3 x 150 > 100
    alone = similar(waiting(500), [500], 500, [False], limit=3, max_tokens=100)
    assert len(alone) == 1


def test_due_items_and_urgent_levels_come_before_closer_lengths() -> None:
    seen = [(0, 0, "old"), (1, 0, "near"), (1, 1, "far-but-due")]
    chosen = similar(seen, [20, 21, 90], 20, [False, False, True], limit=2, max_tokens=None)
    assert [item for _, _, item in chosen] == ["old", "far-but-due"]


def test_a_batch_being_filled_counts_what_it_holds() -> None:
    lengths = [30, 30]
    chosen = similar(waiting(*lengths), lengths, 30, [False] * 2, limit=4, max_tokens=100,
                     held=(2, 30))
    assert len(chosen) == 1  # 4 x 30 > 100: only a third fits beside the two held


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 300), st.booleans()), max_size=12),
       st.integers(0, 14), st.none() | st.integers(1, 2000), st.integers(0, 4),
       st.integers(0, 300), st.integers(1, 300))
def test_taking_all_at_once_is_what_the_item_by_item_choice_takes(
        entries: list[tuple[int, int, bool]], limit: int, max_tokens: int | None,
        held_items: int, held_longest: int, target: int) -> None:
    entries.sort(key=lambda e: e[0])  # queue order: by level, then age
    seen = [(level, age, f"item{age}") for age, (level, _, _) in enumerate(entries)]
    lengths = [length for _, length, _ in entries]
    urgent = [due for _, _, due in entries]
    held = (held_items, held_longest if held_items else 0)
    assert similar(seen, lengths, target, urgent, limit, max_tokens, held) == _closest(
        seen, lengths, target, urgent, limit, max_tokens, held)
