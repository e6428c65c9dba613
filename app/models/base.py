"""The model-handler contract. Handlers never see the queue, futures or HTTP.

Thread contract:
- ``decode`` runs off the device threads (event loop or the decode pool) and may be called
  concurrently; it validates and pre-processes raw JSON instances. In the pool, a long one may
  ask ``decode_abandoned()`` between its parts and stop once its request is answered.
- ``load`` runs once on each device thread and returns that device's own replica (a callable).
- ``collate``, the replica and ``split`` run on the device thread that owns the replica.

Nothing here imports torch: front ends (app/frontend/) decode with handlers and never compute.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import pickle
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

log = logging.getLogger("batchserve.models")

# A batch or a model output: a tensor, or a tuple/list/dict of tensors.
Tensors = Any
Replica = Callable[[Tensors], Tensors]
T = TypeVar("T")
# Set, in a decode's own context, once its request no longer waits for it (``abandonable``).
_ABANDONED: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "decode_abandoned", default=None)


def decode_abandoned() -> bool:
    """Whether the request that a decode running in the decode pool works for has been answered
    without it (its deadline passed, or its client left). A decode that may take long (a large
    input) can ask between its parts and stop by raising: its outcome is dropped. Always False
    outside the pool (a decode on the event loop holds its request's answer back)."""
    abandoned = _ABANDONED.get()
    return abandoned is not None and abandoned.is_set()


def abandonable(fn: Callable[..., T], *args: Any) -> tuple[Callable[[], T], threading.Event]:
    """``fn(*args)`` as a call to run on another thread, in a copy of the caller's context (its
    log lines keep the request id), and the event that makes ``decode_abandoned()`` inside it
    say True once set."""
    abandoned = threading.Event()
    context = contextvars.copy_context()
    context.run(_ABANDONED.set, abandoned)
    return functools.partial(context.run, fn, *args), abandoned


class ModelHandler(ABC):
    """What the server needs to know about a model.

    ``name``: the model's name in URLs and metrics. ``input_schema``: JSON Schema of one instance.
    ``max_batch_size``: a limit the model itself imposes (None: the server's setting applies).
    ``heavy_decode``: run ``decode`` in the thread pool rather than on the event loop (unless
    ``decodes_inline`` says a request's instances are cheap).
    ``input_datatype``, ``input_shape`` and ``output_shape`` (per item, None: unknown) describe
    the model for the Open Inference Protocol's metadata. ``dense_width``: a length of flat
    numeric instances that ``decode`` also takes as float64 numpy rows; a /predict body whose
    instances are all such arrays is then parsed straight into one array (app/payload.py).
    None: ``decode`` sees JSON values only. ``measured_from_traffic``: where ``examples`` is
    empty, the server may time its replica on copies of the first request's items to learn
    what a batch costs (the replica must have no side effects; a plain ``nn.Module`` has none).
    ``stacks``: every decoded item is a float32 array of ``input_shape``, and ``collate`` also
    takes chunks, arrays of several such rows (app/pending.py): a request's items that arrive
    stacked (from a front end) may then be queued as one chunk. ``max_length``: for a model
    whose items have lengths (``length``), the most an item has (text: tokens after
    truncation); the longest batch CUDA graphs capture (app/text_graphs.py).
    """

    name: str = "model"
    input_schema: dict[str, Any] = {}
    max_batch_size: int | None = None
    heavy_decode: bool = False
    input_datatype: str = "FP32"
    input_shape: tuple[int, ...] | None = None
    output_shape: tuple[int, ...] | None = None
    dense_width: int | None = None
    measured_from_traffic: bool = False
    stacks: bool = False
    max_length: int | None = None

    def examples(self) -> list[Any]:
        """Raw instances (as a client would send them) to warm the model up with."""
        return []

    @abstractmethod
    def decode(self, instances: list[Any]) -> list[Any]:
        """Validate and pre-process raw instances; one decoded item each, same order.

        Raises app.errors.InvalidInput naming the first bad instance. Any thread. In the decode
        pool, one whose request has been answered meanwhile may stop (``decode_abandoned``).
        """

    def decodes_inline(self, instances: list[Any]) -> bool:
        """Whether ``decode(instances)`` runs on the event loop rather than in the decode pool
        (default: unless ``heavy_decode``). A decode that holds the GIL gains nothing from the
        pool but the hand-off, which costs the event loop about 40 us."""
        return not self.heavy_decode

    def length(self, item: Any) -> int | None:
        """How long a decoded item is, for a model whose batches are padded to their longest
        item (text: its tokens); None for items that are all alike (the default). A handler
        that gives lengths decodes each item to a 1-D array: the warm-up cuts and repeats one
        example's to time batches of other lengths (app/warmup.py)."""
        return None

    def key(self, item: Any) -> Hashable:
        """Items with different keys never share a model call (e.g. differently shaped arrays)."""
        return None

    def for_frontends(self) -> ModelHandler | None:
        """A copy of this handler for front ends to decode with, sent to them pickled: no
        weights, nothing of a device. None (the default): each front end builds its own from
        the model setting (``load_handler``), so building one must load no weights."""
        return None

    @abstractmethod
    def load(self, device: torch.device) -> Replica:
        """Build this device's replica: a callable from a batch on ``device`` to outputs."""

    @abstractmethod
    def collate(self, items: list[Any]) -> Tensors:
        """Stack decoded items (and chunks, where ``stacks``) into a host-side batch (tensors on
        the CPU)."""

    def split(self, outputs: Tensors, n: int) -> Sequence[Any]:
        """Cut host-side outputs into ``n`` per-item results (numpy arrays serialise fastest)."""
        from app.models.outputs import split_rows  # torch's side: device threads only

        return split_rows(outputs, n)


def sendable(handler: ModelHandler) -> bytes | None:
    """``handler.for_frontends()`` pickled, as front ends are sent it; None where it gives no
    copy or the copy does not pickle (each front end then builds its own from the model
    setting)."""
    twin = handler.for_frontends()
    if twin is None:
        return None
    try:
        return pickle.dumps(twin)
    except Exception as exc:  # noqa: BLE001 - whatever a handler's own attributes raise
        log.info("model %s: its handler cannot be sent to front ends (%s: %s); each builds "
                 "its own", handler.name, type(exc).__name__, str(exc))
        return None
