"""The headers an inference request may carry: read, and quoted when they are wrong."""

from __future__ import annotations

import pytest

from app.api.headers import priority_header, request_timeout_s
from app.errors import InvalidInput


def test_a_timeout_shortens_the_models_and_never_lengthens_it() -> None:
    assert request_timeout_s(None, 30.0) == 30.0
    assert request_timeout_s(b" 0.5 ", 30.0) == 0.5
    assert request_timeout_s(b"60", 30.0) == 30.0


def test_a_bad_header_is_quoted_as_its_client_wrote_it() -> None:
    """Quoted by ``app.errors.quoted`` (tests/unit/test_errors.py): UTF-8 as itself."""
    with pytest.raises(InvalidInput, match="positive number of seconds, got '５'$"):
        request_timeout_s("５".encode(), 30.0)
    with pytest.raises(InvalidInput, match="whole number >= 0, got '١'$"):
        priority_header("١".encode())
