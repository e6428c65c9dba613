"""What the v2 routes say about a model: its metadata, and Triton's model configuration.

Shapes in metadata carry the batch dimension (-1); ``dims`` in the configuration do not, as in
Triton, whose own tools (perf_analyzer, model_analyzer) read both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from app.config import BatchSettings
from app.models.signature import TensorSpec

PLATFORM = "pytorch_libtorch"
BACKEND = "pytorch"


@dataclass(frozen=True)
class ModelView:
    """Everything the descriptions need, read off a served model."""

    name: str
    version: str
    versions: list[str]
    input: TensorSpec
    outputs: list[TensorSpec] | None  # None: unknown until the model has run
    max_batch_size: int  # the batch limit in force (lowered after an out-of-memory error)
    devices: list[torch.device]
    settings: BatchSettings  # the model's own: batching, queue, priorities, timeout


def _dims(spec: TensorSpec) -> list[int]:
    return list(spec.shape) if spec.shape is not None else [-1]


def _config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype


def _outputs(view: ModelView) -> list[TensorSpec]:
    return view.outputs or [TensorSpec("OUTPUT0", "FP32", None)]


def metadata(view: ModelView) -> dict[str, Any]:
    """The protocol's model metadata."""
    return {
        "name": view.name,
        "versions": view.versions,
        "platform": PLATFORM,
        "inputs": [{"name": view.input.name, "datatype": view.input.datatype,
                    "shape": [-1, *_dims(view.input)]}],
        "outputs": [{"name": o.name, "datatype": o.datatype, "shape": [-1, *_dims(o)]}
                    for o in _outputs(view)],
    }


def config(view: ModelView) -> dict[str, Any]:
    """Triton's model configuration (``GET /v2/models/{name}/config``), as Triton writes it."""
    settings = view.settings
    return {
        "name": view.name,
        "platform": PLATFORM,
        "backend": BACKEND,
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": view.max_batch_size,
        "input": [{
            "name": view.input.name, "data_type": _config_type(view.input.datatype),
            "format": "FORMAT_NONE", "dims": _dims(view.input), "is_shape_tensor": False,
            "allow_ragged_batch": False, "optional": False,
        }],
        "output": [{
            "name": o.name, "data_type": _config_type(o.datatype), "dims": _dims(o),
            "label_filename": "", "is_shape_tensor": False,
        } for o in _outputs(view)],
        "batch_input": [],
        "batch_output": [],
        "dynamic_batching": {
            "preferred_batch_size": [],
            "max_queue_delay_microseconds": round(settings.max_wait_ms * 1000),
            "preserve_ordering": False,
            "priority_levels": settings.priority_levels,
            "default_priority_level": settings.default_level,
            # As Triton's queue policy reads: a request past its timeout is refused (503 at
            # arrival when predicted, else 504), and its own timeout may only shorten this one.
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": round(settings.request_timeout_s * 1e6),
                "allow_timeout_override": True,
                "max_queue_size": settings.queue_capacity,
            },
            "priority_queue_policy": {},
        },
        "instance_group": [_instance_group(view.name, i, d) for i, d in enumerate(view.devices)],
        "parameters": {},
    }


def _instance_group(name: str, index: int, device: torch.device) -> dict[str, Any]:
    gpu = device.type == "cuda"
    return {
        "name": f"{name}_{index}",
        "kind": "KIND_GPU" if gpu else "KIND_CPU",
        "count": 1,
        "gpus": [device.index or 0] if gpu else [],
    }
