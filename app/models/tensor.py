"""A bare ``nn.Module`` served as float32 tensors in, tensors out."""

from __future__ import annotations

import copy
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import numpy as np

from app.arrays import join_rows, stack_rows
from app.errors import InvalidInput
from app.models.base import ModelHandler, Replica, Tensors
from app.payload import F32_MAX, DenseRows

if TYPE_CHECKING:
    import torch

Shape = tuple[int, ...]
SMALL_REQUEST_VALUES = 64  # requests with at most this many numbers take the plain-Python check


def _number_array_schema(shape: Shape | None) -> dict[str, Any]:
    if shape is None:
        return {"description": "a number or a nested list of numbers (any shape)"}
    schema: dict[str, Any] = {"type": "number", "minimum": -F32_MAX, "maximum": F32_MAX}
    for dim in reversed(shape):
        schema = {"type": "array", "items": schema, "minItems": dim, "maxItems": dim}
    return schema


def _shape_text(shape: Shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


class TensorHandler(ModelHandler):
    """Wraps a module factory. ``input_shape`` is the per-item shape (no batch dimension).

    Without a declared shape any numeric array is accepted, and a batch only joins items of one
    shape. ``build(device)`` returns the replica module for one device. A module's forward has
    no side effects, so without examples its cost is measured from its first request.
    """

    measured_from_traffic = True

    def __init__(
        self,
        name: str,
        build: Callable[[torch.device], torch.nn.Module],
        input_shape: Shape | None,
        examples: list[Any] | None = None,
        max_batch_size: int | None = None,
        output_shape: Shape | None = None,
    ) -> None:
        self.name = name
        self._build = build
        self.input_shape = input_shape
        self._examples = examples
        self.max_batch_size = max_batch_size
        self.output_shape = output_shape
        self.stacks = input_shape is not None
        self.input_schema = _number_array_schema(input_shape)
        # Flat items too big for ``_decode_small`` come parsed into numpy rows; smaller ones
        # cost less as Python numbers checked in plain Python than with more numpy calls.
        if input_shape and len(input_shape) == 1 and input_shape[0] > SMALL_REQUEST_VALUES:
            self.dense_width = input_shape[0]

    @classmethod
    def from_module(cls, name: str, module: torch.nn.Module) -> TensorHandler:
        """Serve a module; its optional ``input_shape`` / ``example_inputs`` attributes are used."""
        shape = getattr(module, "input_shape", None)
        examples = getattr(module, "example_inputs", None)
        if shape is None and examples:
            shape = np.asarray(examples[0], dtype=np.float32).shape  # inferred from an example
        template = module.eval()

        def build(device: torch.device) -> torch.nn.Module:
            return copy.deepcopy(template).to(device).eval()

        return cls(name, build, tuple(int(d) for d in shape) if shape is not None else None,
                   list(examples) if examples else None)

    def examples(self) -> list[Any]:
        if self._examples:
            return list(self._examples)
        if self.input_shape is not None:
            return [np.zeros(self.input_shape, dtype=np.float32).tolist()]
        return []

    def decode(self, instances: list[Any]) -> list[Any]:
        if type(instances) is DenseRows and instances[0].shape == self.input_shape:
            return instances  # float32 rows, checked as they were parsed
        fast = self._decode_small(instances)
        if fast is None:
            fast = self._decode_all(instances)
        if fast is not None:
            return fast
        return [self._decode_one(i, x) for i, x in enumerate(instances)]

    def _decode_small(self, instances: list[Any]) -> list[Any] | None:
        """A request of a few flat rows, checked in plain Python with one numpy call per row:
        in the server each numpy call costs several microseconds (cold caches between
        requests), more than these checks. None means take the general path."""
        shape = self.input_shape
        if shape is None or len(shape) != 1 or len(instances) * shape[0] > SMALL_REQUEST_VALUES:
            return None
        width = shape[0]
        for row in instances:
            if type(row) is not list or len(row) != width:
                return None
            for v in row:  # bools are not numbers here; NaN fails the range check
                if (type(v) is not float and type(v) is not int) or not -F32_MAX <= v <= F32_MAX:
                    return None
        return [np.array(row, dtype=np.float32) for row in instances]

    def _decode_all(self, instances: list[Any]) -> list[Any] | None:
        """One numpy conversion for a well-formed request; None means look item by item."""
        if self.input_shape is None:
            return None
        try:
            arr = np.asarray(instances)
        except (ValueError, TypeError, OverflowError, RecursionError):
            return None
        kind = arr.dtype.kind
        if kind not in "iuf" or arr.shape[1:] != self.input_shape:
            return None
        # Integers always fit float32's range; floats must be finite and within it (NaN fails
        # the comparison). A bad value sends the request item by item, which names it.
        if kind == "f" and arr.size and not np.abs(arr).max() <= F32_MAX:
            return None
        return list(arr.astype(np.float32, copy=False))

    def _decode_one(self, index: int, instance: Any) -> np.ndarray:
        expected = (
            f"a nested list of numbers of shape {_shape_text(self.input_shape)}"
            if self.input_shape is not None else "a number or a nested list of numbers"
        )
        if isinstance(instance, (str, bytes, dict, bool)) or instance is None:
            kind = "a string" if isinstance(instance, (str, bytes)) else type(instance).__name__
            if instance is None:
                kind = "null"
            raise InvalidInput(f"instances[{index}]: expected {expected}, got {kind}")
        try:
            arr = np.asarray(instance)
        except (ValueError, TypeError, OverflowError, RecursionError):
            raise InvalidInput(
                f"instances[{index}]: expected {expected}; the nested lists are ragged or too deep"
            ) from None
        if arr.dtype.kind == "O":
            raise InvalidInput(
                f"instances[{index}]: expected {expected}; found ragged lists, nulls or numbers "
                "out of range"
            )
        if arr.dtype.kind not in "iuf":
            raise InvalidInput(f"instances[{index}]: expected {expected}; found non-numbers")
        if self.input_shape is not None and arr.shape != self.input_shape:
            raise InvalidInput(
                f"instances[{index}]: expected shape {_shape_text(self.input_shape)}, "
                f"got {_shape_text(arr.shape)}"
            )
        with np.errstate(over="ignore"):
            out = arr.astype(np.float32)
        if not np.isfinite(out).all():
            raise InvalidInput(
                f"instances[{index}]: numbers must be finite and within float32 range"
            )
        return out

    def key(self, item: Any) -> Hashable:
        return None if self.input_shape is not None else item.shape

    def for_frontends(self) -> TensorHandler:
        """This handler without its module or its examples (the warm-up's, which may be
        tensors): what front ends decode with."""
        twin = copy.copy(self)
        twin._build, twin._examples = _no_module, None
        return twin

    def load(self, device: torch.device) -> Replica:
        module = self._build(device)
        return module

    def collate(self, items: list[Any]) -> Tensors:
        import torch  # device threads only: front ends decode with this handler, without torch

        if self.stacks:  # chunks may be among the rows
            rank = len(self.input_shape or ())
            if any(item.ndim > rank for item in items):
                return torch.from_numpy(join_rows(items, rank))
        return torch.from_numpy(stack_rows(items))


def _no_module(device: torch.device) -> torch.nn.Module:
    raise RuntimeError("a front end's handler has no module: it decodes, the device computes")
