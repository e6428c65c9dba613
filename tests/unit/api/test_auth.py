"""app/api/auth.py: the bearer check both protocols call."""

from __future__ import annotations

import pytest

from app.api.auth import check_auth
from app.errors import Unauthorized


@pytest.mark.parametrize("value", [b"Bearer k3y", "Bearer k3y", "bearer  k3y", b"BEARER k3y "])
def test_the_key_passes_as_a_header_or_metadata(value: bytes | str) -> None:
    check_auth(value, "k3y")


@pytest.mark.parametrize("value", [None, b"", "Bearer", "Bearer k3", "Basic k3y", "k3y",
                                   "Bearer k3yy", "Bearer ķ3y"])
def test_anything_else_is_401(value: bytes | str | None) -> None:
    with pytest.raises(Unauthorized, match="missing or invalid bearer token"):
        check_auth(value, "k3y")


def test_no_key_no_check() -> None:
    check_auth(None, None)
