"""The front end's proxy: what it asks the device process for (app/frontend/app.py)."""

from __future__ import annotations

import httpx

from app.frontend.app import proxied_target


def test_the_device_process_is_asked_for_the_path_the_client_sent() -> None:
    scope = {"path": "/v2/models/a/b", "raw_path": b"/v2/models/a%2Fb", "query_string": b""}
    assert proxied_target(scope) == "/v2/models/a%2Fb"  # one segment, as one process routes it
    scope = {"path": "/v2/models/\u00a8\x19/ready", "raw_path": b"/v2/models/%C2%A8%19/ready",
             "query_string": b"version=%F0%9F%87%BA&x=1"}
    assert proxied_target(scope) == "/v2/models/%C2%A8%19/ready?version=%F0%9F%87%BA&x=1"


def test_what_no_url_may_hold_is_escaped() -> None:
    raw = {"path": "/v2/models/a\nb", "raw_path": b"/v2/models/a\nb\xff", "query_string": b"q=\x01"}
    assert proxied_target(raw) == "/v2/models/a%0Ab%FF?q=%01"
    decoded_only = {"path": "/v2/models/a\nb%/ready", "query_string": b""}
    assert proxied_target(decoded_only) == "/v2/models/a%0Ab%25/ready"
    for scope in (raw, decoded_only):  # httpx takes it as it is
        url = httpx.URL("http://device" + proxied_target(scope))
        assert url.raw_path.startswith(b"/v2/models/a%0Ab")


def test_dot_segments_reach_the_device_process_unresolved() -> None:
    scope = {"path": "/v2/../metrics", "raw_path": b"/v2/../metrics", "query_string": b""}
    assert proxied_target(scope) == "/v2/%2E%2E/metrics"  # one process routes it as it is: 404
    assert httpx.URL("http://device" + proxied_target(scope)).raw_path == b"/v2/%2E%2E/metrics"
    scope = {"path": "/v2/./x.y/.z", "raw_path": b"/v2/./x.y/.z", "query_string": b""}
    assert proxied_target(scope) == "/v2/%2E/x.y/.z"
