"""app/statistics.py: Triton's statistics of one model version, from what the metrics count."""

from __future__ import annotations

from app.statistics import Statistics


def test_requests_items_and_calls_are_counted_as_triton_names_them() -> None:
    stats = Statistics()
    stats.answered(200, 3, 0.006)
    stats.answered(503, 1, 0.0005)
    stats.answered(422, 1, 0.0001)
    stats.batch([0.001, 0.002, 0.003], [2, 1], [0.004, 0.001])
    view = stats.view("m", "2")
    figures = view["inference_stats"]
    assert (view["name"], view["version"]) == ("m", "2")
    assert figures["success"] == {"count": 3, "ns": 6_000_000}
    assert figures["fail"] == {"count": 2, "ns": 600_000}
    assert figures["queue"] == {"count": 3, "ns": 6_000_000}
    # each item with its call's time: 2 x 4 ms + 1 x 1 ms
    assert figures["compute_infer"] == {"count": 3, "ns": 9_000_000}
    assert figures["compute_input"] == figures["compute_output"] == {"count": 3, "ns": 0}
    assert figures["cache_hit"] == figures["cache_miss"] == {"count": 0, "ns": 0}
    assert (view["inference_count"], view["execution_count"]) == (3, 2)
    assert [(b["batch_size"], b["compute_infer"]) for b in view["batch_stats"]] == [
        (1, {"count": 1, "ns": 1_000_000}), (2, {"count": 1, "ns": 4_000_000})]
    assert view["last_inference"] > 0


def test_a_model_never_called_has_zeros_and_no_last_inference() -> None:
    view = Statistics().view("m", "1")
    assert view["last_inference"] == view["inference_count"] == view["execution_count"] == 0
    assert view["batch_stats"] == []
    assert all(d == {"count": 0, "ns": 0} for d in view["inference_stats"].values())
