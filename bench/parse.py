"""/predict's and v2 infer's two ways from a JSON body to rows, timed side by side in this process.

/predict: ``general``: ``parse_json`` (orjson) and ``instances_of``, then the tensor handler's
``decode`` (one numpy conversion of the Python numbers). ``dense``: ``dense_instances``
(simdjson straight into an array, float32 rows), then the same ``decode``, which takes them as
they are. v2 (an FP32 input of the same rows, ``parse_request``): ``general``, orjson and
numpy's cast (the body given as a JSON header of its whole length, which the dense parse
leaves to them); ``dense``, app/api/v2/dense.py. Bodies hold flat instances of random numbers
with four decimals, as ``python -m bench --workload mlp`` sends; calls alternate, and the
medians are printed per shape, with each path's answer checked against the other's.

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

from app.api.v2.codec import parse_request
from app.models.signature import TensorSpec
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

        compare(f"/predict {rows} x {width} numbers ({len(body)} B)", args.calls, general, dense)
        spec = TensorSpec("INPUT0", "FP32", (width,))
        v2 = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [rows, width],
                                       "datatype": "FP32",
                                       "data": orjson.loads(body)["instances"]}]})

        def v2_general(v2: bytes = v2, spec: TensorSpec = spec) -> list[Any]:
            return parse_request(v2, str(len(v2)), LIMIT, "bench", spec).rows

        def v2_dense(v2: bytes = v2, spec: TensorSpec = spec) -> list[Any]:
            return parse_request(v2, None, LIMIT, "bench", spec).rows

        compare(f"v2 {rows} x {width} numbers ({len(v2)} B)", args.calls, v2_general, v2_dense)


def compare(label: str, calls: int, general: Callable[[], list[Any]],
            dense: Callable[[], list[Any]]) -> None:
    assert all(np.array_equal(a, b) for a, b in zip(general(), dense(), strict=True))
    us = median_us(calls, {"general": general, "dense": dense})
    print(f"{label}: general {us['general']:.1f} us, dense {us['dense']:.1f} us "
          f"({us['general'] / us['dense']:.2f} x)", flush=True)


if __name__ == "__main__":
    main()
