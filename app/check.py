"""``batchserve check-model``: load a model as the server would, run its examples, describe it."""

from __future__ import annotations

import json
import time

from app.config import Settings
from app.errors import ModelLoadError
from app.runtime import InferenceService, build_service
from app.scheduler.cost import CostModel


async def wait_loaded(service: InferenceService) -> None:
    """Until every device thread has loaded and warmed the model up; ModelLoadError if one
    could not."""
    while service.status == "loading":
        await service.changed()
    if service.load_failed:
        raise ModelLoadError(f"the model failed to load: {service.load_error}")


async def check_model(settings: Settings) -> list[str]:
    """Report lines: the model's schema, load time, one batch of its examples, its outputs."""
    service = build_service(settings)
    started = time.perf_counter()
    await service.start()
    try:
        await wait_loaded(service)
        model = service.repository.get()
        handler = model.handler
        lines = [
            f"model: {model.name} on {', '.join(str(d) for d in model.devices)}",
            f"input schema (one instance): {json.dumps(handler.input_schema)}",
        ]
        lines.append(f"load and warm-up: {(time.perf_counter() - started) * 1000:.0f} ms")
        examples = handler.examples()
        if not examples:
            lines.append("no examples declared: nothing run")
            return lines
        started = time.perf_counter()
        items = await model.decode(examples)
        await model.result(model.enqueue(items, time.monotonic() + settings.request_timeout_s))
        took_ms = (time.perf_counter() - started) * 1000
        lines.append(f"batch: {len(items)} items in {took_ms:.1f} ms")
        for spec in model.output_specs or []:
            lines.append(f"output {spec.name}: {spec.datatype} shape {list(spec.shape or [])}")
        for device, cost in model.costs.items():
            lines += cost_lines(device, cost, text=model.handler.length(items[0]) is not None)
        return lines
    finally:
        await service.stop()


def cost_lines(device: str, cost: CostModel, text: bool) -> list[str]:
    """The cost curve as the scheduler believes it (docs/scheduler.md): latency and throughput
    per batch, and the batch it would pick: the one with the most throughput (what a saturated
    queue gets), and the smallest that reaches 90 % of that (past it, waiting for more items
    buys little)."""
    unit = "tokens" if text else "items"
    curve = [(work, seconds) for work, seconds in cost.curve() if seconds > 0]
    if not curve:
        return [f"cost on {device}: not measured (no examples)"]
    lines = [f"cost on {device} ({'padded ' if text else ''}{unit} per batch, measured):",
             f"  {'batch':>8} {'latency ms':>11} {unit + '/s':>12}"]
    rates = [(work / seconds, work, seconds) for work, seconds in curve]
    for rate, work, seconds in rates:
        lines.append(f"  {work:>8g} {seconds * 1000:>11.2f} {rate:>12.0f}")
    best = max(rates)
    knee = next(r for r in rates if r[0] >= 0.9 * best[0])
    lines.append(f"  picks: under load, batches of {best[1]:g} {unit} ({best[0]:.0f} {unit}/s); "
                 f"the smallest batch within 90 % of that: {knee[1]:g} "
                 f"({knee[2] * 1000:.1f} ms)")
    return lines
