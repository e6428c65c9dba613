"""``python -m bench.device``: the device process alone, fed by a synthetic front end.

What limits ``--frontends N`` on a GPU box is the device process (docs/frontends.md): its one
event loop admits, enqueues and answers every request, and its device threads share that GIL.
This runs that process's own code (``build_service`` and ``Bridge``, as ``--frontends N`` does,
tuned as the server tunes it: app/process.py) with front ends that skip HTTP: ``--clients``
child processes that keep ``--concurrency`` requests of ``--instances`` items in flight between
them, each over a real link (``DeviceLink``, the front end's own code), and count each answer
as a front end does. More clients mean fewer requests a message. Printed: requests per second
the device process answered, and its CPU per request, the event loop's and the whole
process's (loop, device threads, decode pool).

    python -m bench.device --workload linear --concurrency 256 --seconds 5 --rounds 3

``--steps`` also prints where the event loop's CPU a message goes, step by step (reading,
admission, answering, sending; bench/steps.py): with ``--clients 32`` at c=256 each message
holds about 8 requests, as real front ends send under load. ``--opcodes`` prints the Python
bytecodes the event loop runs a message, by function, in the first round (bench/opcodes.py):
exact where its CPU moves with the box, at the message sizes the clients' shares give.

``--workload minilm`` serves ``minilm_stand_in``: MiniLM's handler (token ids of each length as
items, padded into a batch) with a forward that only averages the ids, so that on the CPU what
is measured is the device process, not the encoder.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import uvloop

from app.bridge import Bridge
from app.config import Settings
from app.errors import ServeError
from app.frontend.link import DeviceLink
from app.links import connect
from app.models.base import Replica
from app.models.builtin import mlp_module
from app.models.minilm import MiniLMHandler
from app.models.tensor import TensorHandler
from app.process import fit_torch_threads, freeze_startup_objects, tune_for_serving
from app.runtime import build_service
from app.state import ModelState
from bench.frontends import PROFILE_HZ, profiled, profiled_s
from bench.gil_share import shares
from bench.opcodes import Opcodes, report
from bench.run import cpu_seconds, instance_for
from bench.steps import Steps


class _StandIn(MiniLMHandler):
    """MiniLM's items, collate and output shape; a forward that costs next to nothing."""

    def load(self, device: torch.device) -> Replica:
        def replica(batch: dict[str, torch.Tensor]) -> torch.Tensor:
            ids = batch["input_ids"].to(device, dtype=torch.float32)
            return ids.mean(dim=1, keepdim=True).expand(-1, 384)

        return replica


def minilm_stand_in() -> MiniLMHandler:
    return _StandIn()


def mlp_stand_in() -> TensorHandler:
    """The mlp's inputs and outputs (512 floats in, 16 out) through one 512-16 layer: for
    ``bench.frontends --workload mlp --model bench.device:mlp_stand_in``, where on a CPU the mlp's
    compute would hide what the server costs a request."""
    return TensorHandler("mlp", lambda d: mlp_module((512, 16)).to(d).eval(), (512,),
                         output_shape=(16,))


def settings_for(args: argparse.Namespace) -> Settings:
    model = args.model or ("bench.device:minilm_stand_in" if args.workload == "minilm"
                           else args.workload)
    return Settings(model=model, model_name=args.workload, devices=args.devices,
                    max_batch_size=args.max_batch_size,
                    max_wait_ms=args.max_wait_ms, torch_threads=args.torch_threads,
                    queue_capacity=max(4096, args.concurrency * args.instances),
                    max_instances=max(256, args.instances), grpc_port=0,
                    cuda_graphs=args.cuda_graphs)


async def device(args: argparse.Namespace) -> list[tuple[float, float, float, float]]:
    """The device process: serve the children's links; per round (req/s, loop us, process us,
    mean batch). With ``--steps``, the event loop's CPU a message by step, printed at the end."""
    steps = Steps() if args.steps else None
    if steps is not None:
        steps.install()
    service = build_service(settings_for(args))
    await service.start()
    model = None
    while model is None or model.state is not ModelState.READY:
        await asyncio.sleep(0.1)
        model = next(iter(service.repository.served.get(args.workload, {}).values()), None)
    freeze_startup_objects()  # as the server does once ready (app/server.py)
    bridge = Bridge(service)
    children, serving = [], []
    for _ in range(args.clients):
        ours, theirs = socket.socketpair()
        children.append(subprocess.Popen(
            [sys.executable, "-m", "bench.device", "--client-fd", str(theirs.fileno()),
             "--workload", args.workload, "--instances", str(args.instances),
             "--concurrency", str(args.concurrency // args.clients)],
            pass_fds=(theirs.fileno(),), stdout=subprocess.PIPE))
        theirs.close()
        serving.append(asyncio.get_running_loop().create_task(
            bridge.serve(*await connect(ours))))
    answered, registry = service.metrics.requests, service.metrics.registry
    rounds = []
    try:
        for child in children:  # each says so once linked: imports take seconds on a small box
            assert child.stdout is not None
            await asyncio.to_thread(child.stdout.readline)
        await asyncio.sleep(args.warmup_s)
        for i in range(args.rounds):
            n0, t0, b0 = _count(answered), time.monotonic(), _batches(registry, args.workload)
            loop0, all0 = cpu_seconds(os.getpid(), os.getpid()), cpu_seconds(os.getpid())
            into = args.profile if i == 0 else None  # py-spy on this process, the first round
            counting = Opcodes() if args.opcodes and i == 0 else None  # the first round
            m0 = _messages(registry)
            with profiled(into, os.getpid(), args.seconds, profile_name(args)), \
                    counting or contextlib.nullcontext():
                await asyncio.sleep(args.seconds)
            if counting is not None:
                print(report(counting.rows(), max(1, int(_messages(registry) - m0)), "message",
                             40), flush=True)
            n1, t1, b1 = _count(answered), time.monotonic(), _batches(registry, args.workload)
            loop1, all1 = cpu_seconds(os.getpid(), os.getpid()), cpu_seconds(os.getpid())
            n = max(1.0, n1 - n0)
            rounds.append((n / (t1 - t0), (loop1 - loop0) / n * 1e6, (all1 - all0) / n * 1e6,
                           (b1[0] - b0[0]) / max(1.0, b1[1] - b0[1])))
        if steps is not None:
            print(steps.report(), flush=True)
    finally:
        for child in children:
            child.terminate()
            child.wait()
        for task in serving:
            task.cancel()
        bridge.close()
        await service.stop()
    return rounds


def _batches(registry: Any, model: str) -> tuple[float, float]:
    """(items, model calls) of ``model`` so far."""
    def value(part: str) -> float:
        found = registry.get_sample_value(f"batchserve_batch_size_{part}", {"model": model})
        return float(found or 0.0)

    return value("sum"), value("count")


def _messages(registry: Any) -> float:
    """Messages the device process has read from its clients."""
    return float(registry.get_sample_value("batchserve_frontend_messages_total") or 0.0)


def _count(counter: Any) -> float:
    """Requests answered 200, as the child counts them to the device process."""
    return sum(s.value for m in counter.collect() for s in m.samples
               if s.name.endswith("_total") and s.labels.get("status") == "200")


async def client(args: argparse.Namespace) -> None:
    """The synthetic front end: ``concurrency`` closed loops of one request each."""
    sock = socket.socket(fileno=args.client_fd)
    link = DeviceLink()
    await link.open(*await connect(sock))
    freeze_startup_objects()
    print("linked", flush=True)
    versions = link.snapshot.served[args.workload]
    version = next(iter(versions))

    tokenizer = MiniLMHandler() if args.workload == "minilm" else None

    def items(first: int) -> list[Any]:
        """A request's items, from instance ``first`` on (sentences differ in length)."""
        values = [instance_for(args.workload, first + i) for i in range(args.instances)]
        if tokenizer is not None:
            return tokenizer.decode(values)
        return list(np.asarray(values, dtype=np.float32))

    async def loop(items: list[Any]) -> None:
        while True:
            start = time.monotonic()
            request = link.submit((args.workload, version, 1), start + 30.0, None, items)
            try:
                await request.future
            except ServeError as exc:  # counted by its status; the loop goes on
                link.tally("answered", (args.workload, version, exc.status, "http"),
                           time.monotonic() - start)
                continue
            link.tally("answered", (args.workload, version, 200, "http"),
                       time.monotonic() - start)

    await asyncio.gather(*(loop(items(j)) for j in range(args.concurrency)))


def profile_name(args: argparse.Namespace) -> str:
    return (f"device-{args.workload}-x{args.instances}-k{args.clients}"
            f"{'-graphs' if args.cuda_graphs else ''}")


def gil_us(args: argparse.Namespace, rate: float) -> dict[str, float]:
    """Each thread kind's time holding the GIL a request in the profiled round, from py-spy's
    samples (``--profile``); empty where there are none."""
    path = args.profile / f"{profile_name(args)}.txt"
    if not path.exists():
        return {}
    per_thread, _ = shares(path.read_text().splitlines())
    requests = rate * profiled_s(args.seconds)
    return {thread: n / PROFILE_HZ / requests * 1e6 for thread, n in per_thread.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=["linear", "mlp", "minilm"], default="linear")
    p.add_argument("--concurrency", type=int, default=256, help="requests in flight (256)")
    p.add_argument("--clients", type=int, default=1,
                   help="synthetic front ends, the concurrency shared between them (1)")
    p.add_argument("--instances", type=int, default=1, help="items a request (1)")
    p.add_argument("--seconds", type=float, default=5.0, help="a round (5)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--devices", default="cpu")
    p.add_argument("--max-batch-size", type=int, default=256)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--model", default=None,
                   help="serve the workload's requests with this model (a module:callable, "
                        "bench.device:mlp_stand_in: the mlp's shapes through one layer)")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="serve with cuda_graphs (docs/cuda-graphs.md)")
    p.add_argument("--profile", type=Path, default=None,
                   help="py-spy's GIL samples of this process in the first round, into this "
                        "folder (python -m bench.gil_share reads them), and the time each "
                        "thread kind held the GIL a request")
    p.add_argument("--steps", action="store_true",
                   help="print the event loop's CPU a message by step (bench/steps.py)")
    p.add_argument("--opcodes", action="store_true",
                   help="print the event loop's Python bytecodes a message by function, in the "
                        "first round (bench/opcodes.py)")
    p.add_argument("--client-fd", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    tune_for_serving()  # as the device process and each front end do
    if args.client_fd is not None:
        uvloop.run(client(args))
        return 0
    fit_torch_threads()  # as the device process does
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"== device process alone: {args.workload}, {args.instances} item(s) a request, "
          f"c={args.concurrency} over {args.clients} client(s), max batch {args.max_batch_size}, "
          f"devices {args.devices}{', CUDA graphs' if args.cuda_graphs else ''}", flush=True)
    rounds = uvloop.run(device(args))
    print(f"{'round':>5}{'req/s':>10}{'loop us/req':>13}{'process us/req':>16}{'batch':>7}")
    for i, (rate, loop, whole, batch) in enumerate(rounds, 1):
        print(f"{i:>5}{rate:>10.0f}{loop:>13.1f}{whole:>16.1f}{batch:>7.1f}")
    # py-spy takes CPU beside what it records, and tracing slows the loop: the profiled or
    # traced first round is left out where others ran
    watched = args.profile is not None or args.opcodes
    plain = rounds[1:] if watched and len(rounds) > 1 else rounds
    print(f"median{' of the rounds after the first' if plain is not rounds else ''}: "
          f"{statistics.median(r[0] for r in plain):,.0f} req/s, loop "
          f"{statistics.median(r[1] for r in plain):.1f} us/req, process "
          f"{statistics.median(r[2] for r in plain):.1f} us/req")
    if args.profile is not None and rounds:
        held = gil_us(args, rounds[0][0])
        print("GIL held a request, round 1: " + (", ".join(
            f"{thread} {us:.2f} us" for thread, us in sorted(held.items())) or "no samples"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
