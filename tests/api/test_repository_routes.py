"""Triton's repository extension over HTTP, as a client that reads the OpenAPI document sees it
(schemathesis ST101, ST104, ST109 against a single-model server in explicit mode)."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from tests.conftest import app_client, make_settings

pytestmark = pytest.mark.asyncio

EXPLICIT = {"model_control_mode": "explicit", "load_model": ["linear"]}


async def test_a_name_the_server_does_not_serve_is_a_400_naming_it() -> None:
    async with app_client(make_settings(**EXPLICIT)) as client:
        answer = await client.post("/v2/repository/models/0/load")
        index = (await client.post("/v2/repository/index")).json()
    assert answer.status_code == 400
    assert answer.json() == {
        "error": "failed to load '0': no such model; this server serves 'linear'"}
    assert [e["name"] for e in index] == ["linear"]


@pytest.mark.parametrize("action", ["load", "unload"])
async def test_load_and_unload_answer_as_documented(action: str) -> None:
    async with app_client(make_settings(**EXPLICIT)) as client:
        answer = await client.post(f"/v2/repository/models/linear/{action}")
        schema = (await client.get("/openapi.json")).json()
    documented = schema["paths"][f"/v2/repository/models/{{name}}/{action}"]["post"]["responses"]
    assert answer.status_code == 200 and answer.content == b""
    assert "content" not in documented["200"]  # no body, as in Triton
    assert "application/json" in documented["400"]["content"]


async def test_a_compressed_body_is_inflated_as_an_infer_requests_is() -> None:
    """A load's body sent with ``Content-Encoding: gzip`` is read inflated (it was parsed as it
    came: 'not valid JSON'); an encoding the server does not take is 415."""
    config = orjson.dumps({"max_batch_size": 0}).decode()
    body = orjson.dumps({"parameters": {"config": config}})
    async with app_client(make_settings(**EXPLICIT)) as client:
        zipped = await client.post("/v2/repository/models/linear/load", content=gzip.compress(
            body, mtime=0), headers={"Content-Encoding": "gzip"})
        other = await client.post("/v2/repository/models/linear/load", content=body,
                                  headers={"Content-Encoding": "br"})
    assert zipped.status_code == 400 and "max_batch_size" in zipped.json()["error"]
    assert other.status_code == 415 and "'br'" in other.json()["error"]


@pytest.mark.parametrize("name", ["x" * 5000, "a%00b", "%2E%2E", ".hidden"])
async def test_a_name_no_folder_can_have_is_a_400_not_a_500(name: str, tmp_path: Path) -> None:
    """A name past the file system's limit made the repository's folder lookup raise."""
    (tmp_path / "echo").mkdir()
    (tmp_path / "echo" / "config.toml").write_text('model = "tests.fakes:EchoHandler"\n')
    settings = make_settings(model_repository=str(tmp_path), model_control_mode="explicit")
    async with app_client(settings) as client:
        answer = await client.post(f"/v2/repository/models/{name}/load")
    assert answer.status_code == 400
    assert answer.json()["error"].endswith("no such model in the repository")


@pytest.mark.parametrize("path", ["/v2/repository/index", "/v2/repository/models/linear/load",
                                  "/v2/repository/models/linear/unload"])
async def test_a_body_past_max_body_bytes_is_413_declared_or_not(path: str) -> None:
    """These routes read their bodies within max_body_bytes too: the index, which needs no key,
    held any body whole before."""
    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: sent chunked
        for _ in range(3):
            yield b" " * 1000

    async with app_client(make_settings(**EXPLICIT, max_body_bytes=2048)) as client:
        declared = await client.post(path, content=b" " * 2049)
        chunked = await client.post(path, content=chunks())
        within = await client.post(path, content=b" " * 2048)
        schema = (await client.get("/openapi.json")).json()
    documented = schema["paths"][path.replace("linear", "{name}")]["post"]["responses"]
    assert {"413", "503"} <= set(documented)
    assert ("401" in documented) == path.endswith("load")  # index needs no key
    for answer in (declared, chunked):
        assert answer.status_code == 413
        assert answer.json() == {"error": "request body is larger than the limit of 2048 bytes"}
    assert within.status_code == 200


async def test_a_client_gone_mid_body_has_nothing_done_and_no_server_error() -> None:
    """A load whose client leaves before its body is whole loads nothing (it could be the
    config the client meant) and is no 500."""
    async with app_client(make_settings(**EXPLICIT)) as client:
        await client.post("/v2/repository/models/linear/unload")
        app = client.app  # type: ignore[attr-defined]
        messages = iter([{"type": "http.request", "body": b'{"param', "more_body": True},
                         {"type": "http.disconnect"}])
        sent: list[dict] = []

        async def receive() -> dict:
            return next(messages)

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v2/repository/models/linear/load",
                 "raw_path": b"/v2/repository/models/linear/load", "query_string": b"",
                 "headers": [(b"host", b"test")], "server": ("test", 80), "client": None}
        await app(scope, receive, send)
        index = (await client.post("/v2/repository/index")).json()
    assert sent[0]["status"] == 499
    assert [(e["name"], e["state"]) for e in index] == [("linear", "UNAVAILABLE")]


async def test_the_schema_describes_each_body_these_routes_read() -> None:
    """A client of the OpenAPI document (schemathesis sent no body, as none was described) sees
    what each takes: the index's ``ready``, load's ``config``, unload's ``unload_dependents``;
    a body made from the document is taken, a parameter it does not list is a 400."""
    async with app_client(make_settings(**EXPLICIT)) as client:
        schema = (await client.get("/openapi.json")).json()
        config = orjson.dumps({"max_wait_ms": 3}).decode()
        loaded = await client.post("/v2/repository/models/linear/load",
                                   json={"parameters": {"config": config}})
        wait = (await client.get("/v2/models/linear/config")).json()
        none = await client.post("/v2/repository/models/linear/load",
                                 json={"parameters": {"config": None}})
        unloaded = await client.post("/v2/repository/models/linear/unload",
                                     json={"parameters": {"unload_dependents": True}})
        other = await client.post("/v2/repository/models/linear/unload",
                                  json={"parameters": {"force": True}})
        index = await client.post("/v2/repository/index", json={"ready": True})
    bodies = {path: operation["post"]["requestBody"]["content"]["application/json"]["schema"]
              for path, operation in schema["paths"].items() if path.startswith("/v2/repository")}
    assert set(bodies["/v2/repository/index"]["properties"]) == {"ready"}
    for action, names in (("load", {"config"}), ("unload", {"unload_dependents"})):
        parameters = bodies[f"/v2/repository/models/{{name}}/{action}"]["properties"]
        assert set(parameters) == {"parameters"}
        assert set(parameters["parameters"]["properties"]) == names
        assert parameters["parameters"]["additionalProperties"] is False
    config_types = bodies["/v2/repository/models/{name}/load"]["properties"]["parameters"][
        "properties"]["config"]["anyOf"]
    assert {"type": "null"} in config_types and none.status_code == 200
    assert loaded.status_code == 200 and unloaded.status_code == 200
    assert wait["dynamic_batching"]["max_queue_delay_microseconds"] == 3000
    assert other.status_code == 400 and "force" in other.json()["error"]
    assert index.status_code == 200 and index.json() == []


@pytest.mark.parametrize(("action", "body", "named"), [
    ("unload", {"parameters": {"unload_dependents": {}}}, "'unload_dependents'"),
    ("unload", {"parameters": None}, "'parameters'"),
    ("load", {"parameters": []}, "'parameters'"),
])
async def test_a_body_the_schema_does_not_allow_is_a_400(action: str, body: dict,
                                                         named: str) -> None:
    """What the document's body does not allow is refused, not ignored (schemathesis ST201:
    an unload with ``unload_dependents: {}`` was answered 200)."""
    async with app_client(make_settings(**EXPLICIT)) as client:
        answer = await client.post(f"/v2/repository/models/linear/{action}", json=body)
        ready = await client.get("/v2/models/linear/ready")
    assert answer.status_code == 400 and named in answer.json()["error"]
    assert ready.status_code == 200  # nothing was unloaded
