"""app/scheduler/lengths.py: which waiting items make a batch of similar lengths."""

from __future__ import annotations

from app.scheduler.lengths import similar


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
