"""The headers an inference request may carry: read, and quoted when they are wrong."""

from __future__ import annotations

import pytest

from app.api.headers import priority_header, request_timeout_s
from app.errors import InvalidInput


def test_a_timeout_shortens_the_models_and_never_lengthens_it() -> None:
    assert request_timeout_s(None, 30.0) == 30.0
    assert request_timeout_s(b" 0.5 ", 30.0) == 0.5
    assert request_timeout_s(b"60", 30.0) == 30.0


@pytest.mark.parametrize(("header", "shown"), [
    ("５".encode(), "'５'"),  # UTF-8 as itself, not as the Latin-1 of its bytes
    (b"\xff5", "'\\xff5'"),  # a byte that is no UTF-8: escaped
    (b"x" * 100, "'" + "x" * 40 + "...'"),  # the first 40 bytes
])
def test_a_bad_header_is_quoted_readably_and_bounded(header: bytes, shown: str) -> None:
    with pytest.raises(InvalidInput) as timeout:
        request_timeout_s(header, 30.0)
    assert str(timeout.value).endswith(f"must be a positive number of seconds, got {shown}")
    with pytest.raises(InvalidInput) as priority:
        priority_header(header)
    assert str(priority.value).endswith(f"must be a whole number >= 0, got {shown}")
