"""app/framing.py: a request body read from its framing, in any split of the bytes."""

from __future__ import annotations

import pytest

from app.framing import MAX_LINE, Body, FramingError, body_of, decimal, head_size, unknown_coding

CHUNKED = b"4\r\nWiki\r\n7;ext=1\r\npedia i\r\nB\r\nn \r\nchunks.\r\n0\r\nTrailer: x\r\n\r\n"


def read(body: Body, pieces: list[bytes]) -> tuple[bytes, bytes]:
    """(the body, the bytes after it) from ``pieces`` fed one after another."""
    got: list[bytes] = []
    for i, piece in enumerate(pieces):
        parts, rest = body.feed(piece)
        got += parts
        if body.done:
            return b"".join(got), rest + b"".join(pieces[i + 1:])
    raise AssertionError("the body is not complete")


@pytest.mark.parametrize("split", range(len(CHUNKED) + 1))
def test_a_chunked_body_in_two_pieces_anywhere(split: int) -> None:
    data = CHUNKED + b"GET / HTTP/1.1\r\n"
    assert read(Body(None), [data[:split], data[split:]]) == (
        b"Wikipedia in \r\nchunks.", b"GET / HTTP/1.1\r\n")


def test_a_chunked_body_a_byte_at_a_time() -> None:
    pieces = [CHUNKED[i:i + 1] for i in range(len(CHUNKED))]
    assert read(Body(None), pieces) == (b"Wikipedia in \r\nchunks.", b"")


def test_a_length_body_and_what_follows() -> None:
    assert read(Body(5), [b"ab", b"cdeGET"]) == (b"abcde", b"GET")


@pytest.mark.parametrize(("data", "why"), [
    (b"zz\r\n", "not hexadecimal"),
    (b"\r\n", "not hexadecimal"),
    (b"4\r\nWikiXX\r\n", "longer than its size"),
    (b"1" * (MAX_LINE + 1), "too long"),
])
def test_bad_chunks_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(FramingError, match=why):
        Body(None).feed(data)


def test_the_headers_say_which_body() -> None:
    chunked = body_of([(b"transfer-encoding", b"gzip, chunked"), (b"content-length", b"3")])
    assert chunked is not None and read(chunked, [b"0\r\n\r\n"]) == (b"", b"")
    length = body_of([(b"content-length", b"3")])
    assert length is not None and read(length, [b"abc"]) == (b"abc", b"")
    assert body_of([(b"content-length", b"0")]) is None and body_of([]) is None
    for bad in (b"-1", b"9" * 5000, b"\xd9\xa3"):
        with pytest.raises(FramingError, match="not a length"):
            body_of([(b"content-length", bad)])


@pytest.mark.parametrize(("text", "value"), [
    (b"0", 0), ("42", 42), (b"9" * 18, 10**18 - 1), (b"9" * 19, None), ("9" * 5000, None),
    ("²", None), ("٣", None), (b"", None), (b"-1", None), (b" 1", None), (b"1e3", None),
])
def test_a_stated_number_is_ascii_digits_int64_holds(text: bytes | str, value: int | None) -> None:
    assert decimal(text) == value


@pytest.mark.parametrize(("headers", "coding"), [
    ([(b"transfer-encoding", b"chunked")], None),
    ([(b"transfer-encoding", b" Chunked ")], None),
    ([(b"content-length", b"2")], None),
    ([(b"transfer-encoding", b"gzip, chunked")], b"gzip"),
    ([(b"transfer-encoding", b"chunked"), (b"transfer-encoding", b"X-Mine")], b"x-mine"),
])
def test_a_transfer_coding_other_than_chunked_is_named(
        headers: list[tuple[bytes, bytes]], coding: bytes | None) -> None:
    assert unknown_coding(headers) == coding


def test_a_heads_size_counts_its_target_and_each_header_with_separators() -> None:
    # "/p" (2) + "a: bc\r\n" (1 + 2 + 4) + "host: x\r\n" (4 + 1 + 4)
    assert head_size(b"/p", [(b"a", b"bc"), (b"host", b"x")]) == 18
    assert head_size(b"/", []) == 1
