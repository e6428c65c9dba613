"""app/errors.py: the one-line forms of errors for logs and stderr."""

from __future__ import annotations

from app.errors import first_line


def test_first_line_is_the_messages_first_line_else_the_types_name() -> None:
    assert first_line(RuntimeError("CUDA error: an illegal memory access\nCompile with ...")) \
        == "CUDA error: an illegal memory access"
    assert first_line(ConnectionError("  \n")) == "ConnectionError"
    assert first_line(TimeoutError()) == "TimeoutError"
