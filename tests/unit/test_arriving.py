"""app/arriving.py: the room for request bodies still arriving, and its default."""

from __future__ import annotations

import pytest

from app import arriving
from app.arriving import MEMORY_SHARE, Arriving, receiving_bytes
from app.errors import Unavailable
from tests.conftest import make_settings

MIB = 2**20


def test_room_is_taken_and_given_back_and_none_past_the_most() -> None:
    room = Arriving(10)
    room.take(6)
    room.take(4)
    with pytest.raises(Unavailable) as refused:
        room.take(1)
    assert refused.value.type == "busy" and refused.value.status == 503
    assert refused.value.reason == "receiving"  # its metric's, apart from a full queue's
    assert "hold 10 of the 10 bytes" in refused.value.message
    room.give_back(6)
    room.take(5)
    assert room.held == 9


def test_the_default_shares_a_part_of_memory_among_the_processes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arriving, "memory_bytes", lambda: 8 * 1024 * MIB)
    default = make_settings(max_body_bytes=16 * MIB)
    assert receiving_bytes(default) == 8 * 1024 * MIB // MEMORY_SHARE
    assert receiving_bytes(default, 4) == 8 * 1024 * MIB // MEMORY_SHARE // 4
    # never less than one body of the largest size; what the user set, as set
    assert receiving_bytes(make_settings(max_body_bytes=1024 * MIB), 8) == 1024 * MIB
    assert receiving_bytes(make_settings(max_receiving_bytes=5 * MIB, max_body_bytes=MIB),
                           8) == 5 * MIB
