"""app/api/body.py: a request body as it was sent, before its Content-Encoding, read within
its limit and the room for bodies still arriving."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import pytest

from app.api.body import LIKELY_WHOLE, ClientGone, inflated, read_body
from app.arriving import Arriving
from app.errors import InvalidInput, PayloadTooLarge, Unavailable, UnsupportedEncoding

BODY = b'{"instances": [[1, 2, 3, 4]]}'
# mtime=0: the same bytes in every process, for pytest-xdist's workers collect the same tests.
GZIPPED = gzip.compress(BODY, mtime=0)


@pytest.mark.parametrize(("encoding", "sent"), [
    (None, BODY), (b"identity", BODY), (b"", BODY),
    (b"gzip", GZIPPED), (b"GZip ", GZIPPED),
    (b"x-gzip", GZIPPED), (b"deflate", zlib.compress(BODY)),
])
def test_a_body_comes_back_as_it_was_before_its_encoding(encoding: bytes | None,
                                                         sent: bytes) -> None:
    assert inflated(sent, encoding, len(BODY)) == BODY


def test_a_gzip_body_of_several_members_is_all_of_them() -> None:
    """RFC 1952: a gzip body is a series of members (``cat a.gz b.gz``); each is inflated, in
    order, within the limit counted over all of them."""
    halves = [gzip.compress(BODY[:10], mtime=0), gzip.compress(b"", mtime=0),
              gzip.compress(BODY[10:], mtime=0)]
    assert inflated(b"".join(halves), b"gzip", len(BODY)) == BODY
    with pytest.raises(PayloadTooLarge):
        inflated(b"".join(halves), b"gzip", len(BODY) - 1)


def test_a_body_may_not_inflate_past_the_limit() -> None:
    """A few hundred bytes that inflate to megabytes are refused at the limit, not inflated."""
    bomb = gzip.compress(b" " * 10**7)
    assert len(bomb) < 20_000
    with pytest.raises(PayloadTooLarge, match="inflates to more than the limit of 1000 bytes"):
        inflated(bomb, b"gzip", 1000)
    with pytest.raises(PayloadTooLarge):
        inflated(GZIPPED, b"gzip", len(BODY) - 1)


@pytest.mark.parametrize(("encoding", "sent", "error", "message"), [
    (b"br", BODY, UnsupportedEncoding, "Content-Encoding 'br' is not one this server takes"),
    (b"gzip", BODY, InvalidInput, "request body is not gzip data"),
    (b"deflate", GZIPPED, InvalidInput, "request body is not deflate data"),
    (b"gzip", GZIPPED[:-6], InvalidInput, "ends before its gzip data does"),
    (b"gzip", GZIPPED + b"junk", InvalidInput, "request body is not gzip data"),
    (b"gzip", GZIPPED + GZIPPED[:-6], InvalidInput, "ends before its gzip data does"),
    (b"deflate", zlib.compress(BODY) + b"junk", InvalidInput, "has 4 bytes after its deflate"),
])
def test_bytes_that_are_not_their_encoding_are_named(
    encoding: bytes, sent: bytes, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        inflated(sent, encoding, 1000)


def receiving(*messages: tuple[bytes, bool]) -> Any:
    """An ASGI ``receive`` that gives ``messages`` (body, more_body), then a disconnect."""
    queue = [{"type": "http.request", "body": body, "more_body": more} for body, more in messages]
    queue.append({"type": "http.disconnect"})

    async def receive() -> dict[str, Any]:
        return queue.pop(0)
    return receive


@pytest.mark.asyncio
async def test_a_body_in_pieces_holds_its_declared_length_till_it_is_whole() -> None:
    room = Arriving(100)
    seen = []

    async def watched() -> dict[str, Any]:
        message = await pieces()
        seen.append(room.held)
        return message
    pieces = receiving((b"a" * 10, True), (b"b" * 10, True), (b"c" * 10, False))
    assert await read_body(watched, 1000, b"30", room) == b"a" * 10 + b"b" * 10 + b"c" * 10
    assert seen == [0, 30, 30] and room.held == 0  # taken at the first piece, given back


@pytest.mark.asyncio
async def test_a_body_without_a_length_holds_each_piece_as_it_comes() -> None:
    room = Arriving(25)
    with pytest.raises(Unavailable, match="hold 20 of the 25 bytes"):
        await read_body(receiving((b"a" * 10, True), (b"b" * 10, True), (b"c" * 10, False)),
                        1000, None, room)
    assert room.held == 0


@pytest.mark.asyncio
async def test_no_room_is_a_503_before_the_body_is_read_and_a_whole_body_takes_none() -> None:
    room = Arriving(100)
    room.take(80)
    with pytest.raises(Unavailable) as refused:
        await read_body(receiving((b"a" * 10, True), (b"b" * 20, False)), 1000, b"30", room)
    assert refused.value.type == "busy" and room.held == 80
    assert await read_body(receiving((b"x" * 50, False)), 1000, b"50", room) == b"x" * 50
    assert room.held == 80


@pytest.mark.asyncio
async def test_room_is_given_back_when_the_client_leaves_or_the_body_is_too_large() -> None:
    room = Arriving(100)
    with pytest.raises(ClientGone):
        await read_body(receiving((b"a" * 10, True)), 1000, b"30", room)
    with pytest.raises(PayloadTooLarge):
        await read_body(receiving((b"a" * 40, True), (b"b" * 40, True)), 50, None, room)
    assert room.held == 0


@pytest.mark.asyncio
async def test_a_long_declared_body_is_refused_before_any_of_it_is_asked_for() -> None:
    """No receive, so uvicorn sends no 100 Continue: the client need not send the body."""
    room = Arriving(LIKELY_WHOLE * 2 + 1)
    room.take(LIKELY_WHOLE)

    async def never() -> dict[str, Any]:
        raise AssertionError("the body was asked for")
    with pytest.raises(Unavailable):
        await read_body(never, 10**9, str(LIKELY_WHOLE + 2).encode(), room)
    assert room.held == LIKELY_WHOLE
    whole = b"x" * (LIKELY_WHOLE + 1)  # one that came whole all the same gives its room back
    assert await read_body(receiving((whole, False)), 10**9, b"%d" % len(whole), room) == whole
    assert room.held == LIKELY_WHOLE


def test_a_gzip_body_of_many_members_is_refused_past_max_members() -> None:
    """16 MB of empty members (800,000 inflaters) would hold the event loop: past MAX_MEMBERS a
    body is refused, at once."""
    from app.api.body import MAX_MEMBERS

    empty = gzip.compress(b"", mtime=0)
    assert inflated(empty * (MAX_MEMBERS - 1) + GZIPPED, b"gzip", len(BODY)) == BODY
    with pytest.raises(InvalidInput, match=f"more than {MAX_MEMBERS} gzip members"):
        inflated(empty * (16_000_000 // len(empty)), b"gzip", 16 << 20)
