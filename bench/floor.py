"""The HTTP floor: what uvicorn (httptools, uvloop) alone does on this machine.

A raw ASGI app that reads the body and returns a fixed answer, served by the same uvicorn as
batchserve, driven by the same wrk script and body as ``python -m bench --workload linear``.
No serving stack can beat this number, so it is the reference for the `linear` targets.

    python bench/floor.py
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.run import instance_for, run_wrk

ANSWER = b'{"predictions":[[0.1,0.2]]}'


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": ANSWER})


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    cmd = [sys.executable, "-m", "uvicorn", "bench.floor:app", "--port", str(port),
           "--log-level", "warning", "--no-access-log", "--loop", "uvloop", "--http", "httptools"]
    server = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parent.parent)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"instances": [instance_for("linear", 0)]}, f)
    url = f"http://127.0.0.1:{port}"
    try:
        time.sleep(3)
        run_wrk(url, f.name, 64, 2)  # warm up
        for concurrency in (1, 64):
            r = run_wrk(url, f.name, concurrency, 10)
            print(f"floor c={concurrency}: {r['requests'] / (r['duration_us'] / 1e6):.0f} req/s, "
                  f"p50 {r['p50_us'] / 1000:.2f} ms", flush=True)
    finally:
        server.terminate()
        server.wait(10)
        Path(f.name).unlink()


if __name__ == "__main__":
    main()
