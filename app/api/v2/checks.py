"""The rules an Open Inference Protocol v2 request meets whichever its protocol (HTTP JSON and
binary: app/api/v2/codec.py; gRPC: app/grpc/tensors.py): its one input's name, shape and
datatype, the outputs it asks for, and no parameter of an extension this server does not serve.
Each mistake raises InvalidInput (or PayloadTooLarge) naming it, as Triton words it."""

from __future__ import annotations

import math
from typing import Any

from app.errors import InvalidInput, PayloadTooLarge
from app.models.signature import TensorSpec
from app.payload import MAX_INT64, json_text

# Parameters of protocol extensions this server does not serve (``GET /v2`` lists those it
# does): a tensor that names one would otherwise be read from the request, or answered in full,
# where its client expects its data elsewhere or a top-N list.
SHARED_MEMORY = "Triton's shared-memory extensions (system_shared_memory, cuda_shared_memory)"
UNSERVED = {"shared_memory_region": SHARED_MEMORY, "shared_memory_byte_size": SHARED_MEMORY,
            "shared_memory_offset": SHARED_MEMORY, "classification": "the classification extension"}


def check_input(name: Any, shape: Any, datatype: Any, max_rows: int, model: str,
                expected: TensorSpec) -> tuple[str, list[int], str]:
    """An input tensor's name, shape and datatype, checked against the model's one input (any
    protocol: ``shape`` is a list of the request's sizes)."""
    if not isinstance(name, str):
        raise InvalidInput("input needs a string 'name'")
    if name != expected.name:
        raise InvalidInput(
            f"unexpected inference input '{name}' for model '{model}'; it has '{expected.name}'"
        )
    if not isinstance(shape, list) or not shape:
        raise InvalidInput(f"input '{name}': 'shape' must be a non-empty list of sizes")
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d <= MAX_INT64:
            raise InvalidInput(f"input '{name}': 'shape' must be a non-empty list of sizes "
                               f"(whole numbers from 0 to 2^63 - 1); {json_text(d)} is not one")
    if datatype != expected.datatype:
        raise InvalidInput(
            f"inference input '{name}' data-type is '{datatype}', but model '{model}' expects "
            f"'{expected.datatype}'"
        )
    if shape[0] == 0:
        raise InvalidInput(f"input '{name}': the batch dimension is 0; send at least one row")
    # The row's shape before the row limit: a shape without its batch dimension ([512] for
    # rows of 512) reads as that many rows, and the mistake to name is the shape.
    _check_item_shape(name, shape, expected)
    if shape[0] > max_rows:
        raise PayloadTooLarge(f"{shape[0]} rows is more than the limit of {max_rows} per request")
    return name, shape, datatype


def _check_item_shape(name: str, shape: list[int], expected: TensorSpec) -> None:
    """A row's shape must be the model's (where it declares one); a text row is one string."""
    if expected.datatype == "BYTES":
        if math.prod(shape[1:]) != 1:
            raise InvalidInput(f"input '{name}': BYTES input must have one element per row")
        return
    want = expected.shape
    if want is None or len(want) == len(shape) - 1 and all(
        w in (-1, d) for w, d in zip(want, shape[1:], strict=True)
    ):
        return
    raise InvalidInput(
        f"unexpected shape for input '{name}': expected shape {_dims(want)}, "
        f"got {_dims(tuple(shape[1:]))} per row"
    )


def _dims(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def check_served(params: Any, tensor: str) -> None:
    """A tensor's parameters are a JSON object (or gRPC's map), as the request's must be, and
    name no extension this server does not serve (``UNSERVED``)."""
    if not (isinstance(params, dict) or hasattr(params, "keys")):
        raise InvalidInput(f"{tensor}: 'parameters' must be an object")
    for key in params:
        extension = UNSERVED.get(key)
        if extension is not None:
            raise InvalidInput(f"{tensor}: parameter '{key}' belongs to {extension}, which this "
                               "server does not serve (GET /v2 lists the extensions it does)")


def check_outputs(names: list[str], model: str, known: list[TensorSpec] | None) -> None:
    """Every output a request names is one the model has (where its outputs are known), once.
    Sets, not lists: a list's search for each name made 30,000 names cost 11 s."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidInput(f"output '{name}' is asked for twice")
        seen.add(name)
    if known is None:
        return
    known_names = {spec.name for spec in known}
    for name in names:
        if name not in known_names:  # named in the model's order
            raise InvalidInput(unknown_output(name, model, [spec.name for spec in known]))


def unknown_output(name: str, model: str, known: list[str]) -> str:
    return f"unexpected inference output '{name}' for model '{model}'; it has {sorted(known)}"
