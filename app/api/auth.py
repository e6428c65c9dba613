"""The API key: with ``api_key`` set, inference and model control (load, unload) need
``Authorization: Bearer <key>``, over HTTP as a header and over gRPC as metadata; health,
metrics and metadata stay open for load balancers and Prometheus."""

from __future__ import annotations

import hmac

from app.errors import Unauthorized


def check_auth(header: bytes | str | None, api_key: str | None) -> None:
    """Constant-time check of an Authorization value (Unauthorized unless it is ``Bearer
    <api_key>``); a no-op without a key."""
    if api_key is None:
        return
    if isinstance(header, str):
        header = header.encode("latin-1", "replace")
    scheme, _, token = (header or b"").decode("latin-1").partition(" ")
    ok = hmac.compare_digest(token.strip().encode("latin-1"), api_key.encode())
    if scheme.lower() != "bearer" or not ok:
        raise Unauthorized("missing or invalid bearer token")
