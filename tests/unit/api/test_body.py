"""app/api/body.py: a request body as it was sent, before its Content-Encoding."""

from __future__ import annotations

import gzip
import zlib

import pytest

from app.api.body import inflated
from app.errors import InvalidInput, PayloadTooLarge, UnsupportedEncoding

BODY = b'{"instances": [[1, 2, 3, 4]]}'


@pytest.mark.parametrize(("encoding", "sent"), [
    (None, BODY), (b"identity", BODY), (b"", BODY),
    (b"gzip", gzip.compress(BODY)), (b"GZip ", gzip.compress(BODY)),
    (b"x-gzip", gzip.compress(BODY)), (b"deflate", zlib.compress(BODY)),
])
def test_a_body_comes_back_as_it_was_before_its_encoding(encoding: bytes | None,
                                                         sent: bytes) -> None:
    assert inflated(sent, encoding, len(BODY)) == BODY


def test_a_body_may_not_inflate_past_the_limit() -> None:
    """A few hundred bytes that inflate to megabytes are refused at the limit, not inflated."""
    bomb = gzip.compress(b" " * 10**7)
    assert len(bomb) < 20_000
    with pytest.raises(PayloadTooLarge, match="inflates to more than the limit of 1000 bytes"):
        inflated(bomb, b"gzip", 1000)
    with pytest.raises(PayloadTooLarge):
        inflated(gzip.compress(BODY), b"gzip", len(BODY) - 1)


@pytest.mark.parametrize(("encoding", "sent", "error", "message"), [
    (b"br", BODY, UnsupportedEncoding, "Content-Encoding 'br' is not one this server takes"),
    (b"gzip", BODY, InvalidInput, "request body is not gzip data"),
    (b"deflate", gzip.compress(BODY), InvalidInput, "request body is not deflate data"),
    (b"gzip", gzip.compress(BODY)[:-6], InvalidInput, "ends before its gzip data does"),
])
def test_bytes_that_are_not_their_encoding_are_named(
    encoding: bytes, sent: bytes, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        inflated(sent, encoding, 1000)
