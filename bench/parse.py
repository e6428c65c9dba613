"""/predict's two ways from a body to decoded rows, timed side by side in this process.

``general``: ``parse_json`` (orjson) and ``instances_of``, then the tensor handler's ``decode``
(one numpy conversion of the Python numbers). ``dense``: ``dense_instances`` (simdjson straight
into an array, float32 rows), then the same ``decode``, which takes them as they are. Bodies
hold flat instances of random numbers with four decimals, as ``python -m bench --workload mlp``
sends; calls alternate, and the medians are printed per shape, with each path's answer checked
against the other's.

    python -m bench.parse [--calls N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from app.models.tensor import TensorHandler
from app.payload import dense_instances, instances_of, parse_json

SHAPES = ((1, 512), (1, 4096), (16, 512), (16, 4096))  # (instances, numbers in each)
LIMIT = 64


def body_of(rows: int, width: int) -> bytes:
    rng = np.random.default_rng(0)
    instances = [[round(float(v), 4) for v in rng.standard_normal(width)] for _ in range(rows)]
    return orjson.dumps({"instances": instances})


def median_us(calls: int, paths: dict[str, Callable[[], Any]]) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(calls):
        for name, path in paths.items():
            start = time.perf_counter()
            path()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.parse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500, help="calls of each path per shape")
    args = parser.parse_args(argv)
    for rows, width in SHAPES:
        handler = TensorHandler("bench", lambda d: None, (width,))  # type: ignore[arg-type,return-value]
        body = body_of(rows, width)

        def general(body: bytes = body, handler: TensorHandler = handler) -> list[Any]:
            return handler.decode(instances_of(parse_json(body), LIMIT))

        def dense(body: bytes = body, handler: TensorHandler = handler,
                  width: int = width) -> list[Any]:
            instances = dense_instances(body, width, LIMIT)
            assert instances is not None, "the dense path refused a well-formed body"
            return handler.decode(instances)

        assert all(np.array_equal(a, b) for a, b in zip(general(), dense(), strict=True))
        us = median_us(args.calls, {"general": general, "dense": dense})
        print(f"{rows} x {width} numbers ({len(body)} B): general {us['general']:.1f} us, "
              f"dense {us['dense']:.1f} us ({us['general'] / us['dense']:.2f} x)", flush=True)


if __name__ == "__main__":
    main()
