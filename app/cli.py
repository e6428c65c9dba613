"""``batchserve serve | worker | submit | check-model | bench``: the command line."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import time
import types
import typing
from collections.abc import Sequence
from typing import Any

from app.config import ENV_PREFIX, ConfigError, Settings, load_settings

log = logging.getLogger("batchserve")


def _flag_type(annotation: Any) -> tuple[Any, list[str] | None]:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return str, [str(a) for a in args]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return _flag_type(args[0])
    return annotation, None


def add_setting_flags(parser: argparse.ArgumentParser, skip: frozenset[str] = frozenset()) -> None:
    """One flag per setting (``--max-batch-size``); unset flags do not override anything."""
    parser.add_argument("--config", metavar="FILE", help=f"TOML settings file ({ENV_PREFIX}CONFIG)")
    for name, field in Settings.model_fields.items():
        if name in skip:
            continue
        kind, choices = _flag_type(field.annotation)
        env = ENV_PREFIX + name.upper()
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=kind,
            choices=choices,
            default=None,
            help=f"{field.description} (env {env}; default {field.default})",
        )


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {name: getattr(args, name, None) for name in Settings.model_fields}
    return load_settings(args.config, overrides)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.logs import configure_logging
    from app.main import create_app

    settings = _settings(args)
    configure_logging(settings.log_level, settings.log_format)
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        log_level=settings.log_level,
        lifespan="on",
        access_log=False,  # app.api.access logs each request, with its request id
        timeout_graceful_shutdown=int(settings.request_timeout_s) + 5,
    )
    server = _server_class()(config, app.state)
    server.drain_limit_s = settings.request_timeout_s + 5.0
    # An inherited socket is wrapped with its real family (uvicorn's own --fd assumes AF_UNIX,
    # which leaves TCP_NODELAY off and costs ~40 ms per small response to delayed ACKs).
    server.run(sockets=[socket.socket(fileno=args.fd)] if args.fd is not None else None)
    return 0 if server.started and not server.fatal else 1


def _server_class() -> type[Any]:
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn's Server with a drain phase for load balancers.

        On SIGTERM/SIGINT the service starts draining at once: health says ``draining`` (503)
        and new requests get 503, while the listener stays open and accepted requests are
        answered. When none is left in flight (or after ``drain_limit_s``), uvicorn's own
        shutdown runs, and the process exits 0 instead of re-raising the signal. A second
        signal skips the wait. A model that fails to load stops the server with exit code 1.
        """

        fatal = False
        drain_started: float | None = None
        drain_limit_s = 35.0

        def __init__(self, config: uvicorn.Config, app_state: Any) -> None:
            super().__init__(config)
            self.app_state = app_state

        def _service(self) -> Any:
            return getattr(self.app_state, "service", None)

        def handle_exit(self, sig: int, frame: types.FrameType | None) -> None:
            service = self._service()
            if self.drain_started is not None or service is None:
                if self.should_exit and sig == signal.SIGINT:
                    self.force_exit = True
                self.should_exit = True
                return
            service.begin_drain()
            self.drain_started = time.monotonic()

        async def on_tick(self, counter: int) -> bool:
            service = self._service()
            if service is not None and service.load_failed:
                log.critical("the model failed to load; exiting")
                self.fatal = True
                return True
            if self.drain_started is not None and service is not None:
                waited = time.monotonic() - self.drain_started
                if service.in_flight == 0 or waited > self.drain_limit_s:
                    return True
            should_exit: bool = await super().on_tick(counter)
            return should_exit

    return DrainingServer


def check_model(args: argparse.Namespace) -> int:
    """Load the model, warm it up, run one batch of its examples, print schema and timing."""
    import json

    import torch

    from app.models.base import map_tensors
    from app.models.registry import load_handler
    from app.service import resolve_devices

    settings = _settings(args)
    device = resolve_devices(settings.devices)[0]
    t0 = time.perf_counter()
    handler = load_handler(settings.model, settings.model_name)
    replica = handler.load(device)
    load_s = time.perf_counter() - t0
    examples = handler.examples()
    print(f"model: {handler.name} on {device}")
    print(f"input schema (one instance): {json.dumps(handler.input_schema)}")
    print(f"load: {load_s * 1000:.0f} ms")
    if not examples:
        print("no examples declared: nothing run")
        return 0
    with torch.inference_mode():
        items = handler.decode(examples)
        for label in ("warm-up", "batch"):
            t0 = time.perf_counter()
            batch = map_tensors(lambda t: t.to(device), handler.collate(items))
            outputs = map_tensors(lambda t: t.to("cpu"), replica(batch))
            results = handler.split(outputs, len(items))
            print(f"{label}: {len(items)} items in {(time.perf_counter() - t0) * 1000:.1f} ms")
    first = results[0]
    shape = getattr(first, "shape", None)
    described = f" shape {list(shape)}" if shape else ""
    print(f"output of one item: {type(first).__name__}{described}")
    return 0


def worker(args: argparse.Namespace) -> int:
    import asyncio

    from app.job_runner import run_worker
    from app.logs import configure_logging

    settings = _settings(args)
    configure_logging(settings.log_level, settings.log_format)
    return asyncio.run(run_worker(settings))


def submit_jobs(args: argparse.Namespace) -> int:
    """Enqueue instances from a JSONL file (one instance per line) and print the results."""
    import json

    from tqdm import tqdm

    from app.job_client import submit

    settings = load_settings(args.config, {"redis_url": args.redis_url,
                                           "job_stream": args.job_stream})
    with open(args.file, "rb") as f:
        instances = [json.loads(line) for line in f if line.strip()]
    jobs = [instances[i:i + args.job_size] for i in range(0, len(instances), args.job_size)]
    with tqdm(total=len(jobs), unit="job", file=sys.stderr, disable=args.quiet) as bar:
        results = submit(settings.redis_url, jobs, settings.job_stream, args.timeout_s,
                         progress=bar.update)
    out = open(args.out, "w") if args.out else sys.stdout  # noqa: SIM115
    try:
        for result in results:
            out.write(json.dumps(result) + "\n")
    finally:
        if args.out:
            out.close()
    failed = sum(r["status"] != "ok" for r in results)
    if failed:
        print(f"batchserve submit: {failed} of {len(results)} jobs failed", file=sys.stderr)
    return 1 if failed else 0


def _add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    try:
        from bench.run import add_arguments
    except ImportError:  # installed without the bench/ folder
        return
    add_arguments(parser)


def _bench(args: argparse.Namespace) -> int:
    try:
        from bench.run import run
    except ImportError:
        print("batchserve bench: run it from a source checkout (bench/ is not installed)",
              file=sys.stderr)
        return 2
    code: int = run(args)
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="batchserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="run the HTTP server")
    add_setting_flags(p_serve)
    p_serve.add_argument(
        "--fd", type=int, default=None,
        help="serve on an inherited, already bound socket (file descriptor) instead of host:port",
    )
    p_serve.set_defaults(func=serve)
    p_bench = sub.add_parser(
        "bench", help="benchmark the server against the model alone and unbatched (needs wrk)"
    )
    _add_bench_arguments(p_bench)
    p_bench.set_defaults(func=_bench)
    p_worker = sub.add_parser(
        "worker", help="serve jobs from a Redis stream (job-queue mode) instead of HTTP"
    )
    add_setting_flags(p_worker)
    p_worker.set_defaults(func=worker)
    p_submit = sub.add_parser(
        "submit", help="enqueue instances from a JSONL file as jobs and wait for the results"
    )
    p_submit.add_argument("file", help="JSONL: one instance per line")
    p_submit.add_argument("--config", metavar="FILE", help="TOML settings file")
    p_submit.add_argument("--redis-url", default=None, help="default: the redis_url setting")
    p_submit.add_argument("--job-stream", default=None, help="default: the job_stream setting")
    p_submit.add_argument("--job-size", type=int, default=1, help="instances per job (1)")
    p_submit.add_argument("--timeout-s", type=float, default=600.0, help="give up after (600)")
    p_submit.add_argument("--out", default=None, help="write result lines here (default stdout)")
    p_submit.add_argument("--quiet", action="store_true", help="no progress bar")
    p_submit.set_defaults(func=submit_jobs)
    p_check = sub.add_parser("check-model", help="load a model, run one batch, print its schema")
    p_check.add_argument("model", help="builtin name, module:callable, or a .pt / .pt2 file")
    add_setting_flags(p_check, skip=frozenset({"model"}))
    p_check.set_defaults(func=check_model)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except ConfigError as exc:
        print(f"batchserve: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":  # pragma: no cover
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
