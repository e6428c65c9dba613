"""app/errors.py: the one-line forms of errors for logs and stderr, and messages bounded for
clients."""

from __future__ import annotations

import pytest

from app.errors import MAX_MESSAGE_BYTES, bounded, first_line, quoted


def test_first_line_is_the_messages_first_line_else_the_types_name() -> None:
    assert first_line(RuntimeError("CUDA error: an illegal memory access\nCompile with ...")) \
        == "CUDA error: an illegal memory access"
    assert first_line(ConnectionError("  \n")) == "ConnectionError"
    assert first_line(TimeoutError()) == "TimeoutError"


def test_a_message_a_client_is_sent_is_cut_in_its_middle_at_a_kilobyte() -> None:
    """A message that quotes megabytes a client sent keeps its first and last bytes, at whole
    characters, and says how much was cut, in at most MAX_MESSAGE_BYTES of UTF-8 in all; a
    usual one is left as it is."""
    usual = "unexpected shape for input 'INPUT0': expected shape [4], got [3] per row"
    assert bounded(usual) == usual and bounded("é" * 512) == "é" * 512
    cut = bounded("unknown model '" + "m" * 100_000 + "': no such model")
    head, tail = cut.split(" ... (99040 characters cut) ... ")
    assert head.startswith("unknown model 'mmm") and tail.endswith("mmm': no such model")
    assert len(cut.encode()) == MAX_MESSAGE_BYTES - 1  # the note's room held one digit more
    emoji = bounded("🚀" * 1_000)  # four bytes each: the cuts fall between characters
    assert emoji == "🚀" * 184 + " ... (752 characters cut) ... " + "🚀" * 64
    assert len(emoji.encode()) <= MAX_MESSAGE_BYTES


@pytest.mark.parametrize(("value", "shown"), [
    ("５".encode(), "'５'"),  # UTF-8 as itself, not as the Latin-1 of its bytes
    (b"\xff5", "'\\xff5'"),  # a byte that is no UTF-8: escaped
    (b"x" * 100, "'" + "x" * 40 + "...'"),  # the first 40 bytes
    (b"gzip", "'gzip'"),
])
def test_a_header_value_is_quoted_readably_and_bounded(value: bytes, shown: str) -> None:
    assert quoted(value) == shown
