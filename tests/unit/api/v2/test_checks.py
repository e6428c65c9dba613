"""The rules every v2 request meets, whichever protocol brought it."""

from __future__ import annotations

import re

import pytest

from app.api.v2.checks import check_input, check_outputs
from app.errors import InvalidInput, PayloadTooLarge
from app.models.signature import TensorSpec


class Name(str):
    """An output's name that counts the comparisons made with it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Name.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_many_outputs_cost_a_look_each_not_a_search_of_those_before() -> None:
    """30,000 names asked for took 11 s of the event loop, a list's search for each."""
    names = [Name(f"out{i}") for i in range(2000)]
    Name.compared = 0
    check_outputs(names, "m", [TensorSpec(name, "FP32", (1,)) for name in names])
    assert Name.compared <= 2 * len(names)  # a search of those before: 2 million


@pytest.mark.parametrize(("names", "message"), [
    (["a", "b", "a"], "output 'a' is asked for twice"),
    (["a", "c"], "unexpected inference output 'c' for model 'm'; it has ['a', 'b']"),
])
def test_an_output_twice_or_unknown_is_named(names: list[str], message: str) -> None:
    with pytest.raises(InvalidInput, match=re.escape(message)):
        check_outputs(names, "m", [TensorSpec("a", "FP32", (1,)), TensorSpec("b", "FP32", (1,))])


def test_a_shape_without_its_batch_dimension_is_named_before_the_row_limit() -> None:
    """[512] for one row of 512 reads as 512 rows of none: past the row limit, but the mistake
    to name is the shape, not the count (the client would send fewer rows, to no avail)."""
    spec = TensorSpec("INPUT0", "FP32", (512,))
    with pytest.raises(InvalidInput, match=re.escape("expected shape [512], got [] per row")):
        check_input("INPUT0", [512], "FP32", 256, "mlp", spec)
    with pytest.raises(PayloadTooLarge, match="300 rows is more than the limit of 256"):
        check_input("INPUT0", [300, 512], "FP32", 256, "mlp", spec)
    assert check_input("INPUT0", [256, 512], "FP32", 256, "mlp", spec)[1] == [256, 512]
