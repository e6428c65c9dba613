"""``batchserve serve | worker | submit | check-model``: the command line."""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

from app.config import ENV_PREFIX, Settings
from app.errors import BatchServeError, ConfigError, first_line
from app.lifetime import ended, open_standard_streams
from app.sources import load_settings, unknown_variables
from app.values import without_password
from app.version import __version__


def _flag_type(annotation: Any) -> tuple[Any, list[str] | None]:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if annotation is bool:  # the setting parses true/false, yes/no, on/off, 1/0
        return str, None
    if typing.get_origin(annotation) is typing.Literal:
        return str, [str(a) for a in args]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        if any(typing.get_origin(a) is typing.Literal for a in args):
            return str, None  # a number or a word (frontends: 4 or auto): the setting parses it
        return _flag_type(args[0])
    return annotation, None


def add_setting_flags(parser: argparse.ArgumentParser, skip: frozenset[str] = frozenset()) -> None:
    """One flag per setting (``--max-batch-size``); unset flags do not override anything."""
    parser.add_argument("--config", metavar="FILE", help=f"TOML settings file ({ENV_PREFIX}CONFIG)")
    for name, field in Settings.model_fields.items():
        if name in skip:
            continue
        env = ENV_PREFIX + name.upper()
        flag = "--" + name.replace("_", "-")
        if typing.get_origin(field.annotation) is list:  # repeatable; env: a JSON list
            parser.add_argument(flag, dest=name, action="append", default=None,
                                help=f"{field.description} (env {env}, a JSON list)")
            continue
        kind, choices = _flag_type(field.annotation)
        parser.add_argument(
            flag,
            dest=name,
            type=kind,
            choices=choices,
            default=None,
            help=f"{field.description} (env {env}"
                 f"{_default_text(field.description, field.default)})",
        )


# Settings only one command reads: each command lists its own.
JOB_SETTINGS = frozenset({"redis_url", "job_stream", "job_group", "job_lease_s",
                          "job_max_deliveries", "result_ttl_s", "worker_metrics_port"})
HTTP_SETTINGS = frozenset({"frontends", "frontend_timeout_s", "read_timeout_s", "keep_alive_s",
                           "max_connections", "max_body_bytes", "max_receiving_bytes", "api_key",
                           "port", "grpc_port"})


def _default_text(description: str | None, default: Any) -> str:
    """``; default X`` in words, unless the description already says what the default is."""
    if description and re.search(r"\([^)]*default", description):  # "(default: ...)"
        return ""
    if default is None:
        return "; unset by default"
    if isinstance(default, bool):  # as the flag takes it
        return f"; default {str(default).lower()}"
    if isinstance(default, float):
        return f"; default {default:g}"
    return f"; default {default}"


def _settings(args: argparse.Namespace) -> Settings:
    """The settings: the command's flags over the environment and ``--config``."""
    # A setting the command does not list is None here: not given.
    overrides = {name: getattr(args, name, None) for name in Settings.model_fields}
    return load_settings(args.config, overrides)


def serve(args: argparse.Namespace) -> int:
    settings = _settings(args)  # a wrong setting is said before torch is imported (seconds)
    from app.server import serve as run_server

    return run_server(settings, args.fd)


def check_model(args: argparse.Namespace) -> int:
    """Load the model as the server would, run one batch of its examples, print what it is."""
    import asyncio

    # The model is the argument, or ``--model`` as ``serve`` takes it; not two different ones.
    if args.model is not None and args.model_flag not in (None, args.model):
        raise ConfigError(f"check-model got two models: {args.model!r} and --model "
                          f"{args.model_flag!r}; name one")
    name, args.model = args.model or args.model_flag, None
    settings = _settings(args)  # the model left out: is a repository named?
    repository = settings.model_repository is not None
    if name is None:
        raise ConfigError("check-model needs a model: batchserve check-model "
                          + ("NAME (a model of the repository)" if repository else "MODEL"))
    if repository:
        args.model_control_mode, args.load_model, args.default_model = "explicit", [name], name
    else:
        args.model = name
    settings = _settings(args)
    from app.check import check_model as check  # after the settings, as serve's server

    for line in asyncio.run(check(settings)):
        print(line)
    return 0


def _jobs_extra() -> None:
    """Job-queue mode needs the ``jobs`` extra; say so in one line if it is missing."""
    import importlib.util

    if importlib.util.find_spec("redis") is None:
        raise ConfigError("job-queue mode needs the jobs extra: pip install 'batchserve[jobs]'")


def worker(args: argparse.Namespace) -> int:
    _jobs_extra()
    import asyncio

    from app.jobs.runner import run_worker
    from app.logs import configure_logging

    settings = _settings(args)
    configure_logging(settings.log_level, settings.log_format)
    for warning in unknown_variables(os.environ):
        logging.getLogger("batchserve").warning("%s", warning)
    return asyncio.run(run_worker(settings))


def submit_jobs(args: argparse.Namespace) -> int:
    """Enqueue instances from a JSONL file (one instance per line) and print the results."""
    import json

    _jobs_extra()
    from redis.exceptions import RedisError
    from tqdm import tqdm

    from app.jobs.client import submit

    settings = load_settings(args.config, {"redis_url": args.redis_url,
                                           "job_stream": args.job_stream})
    instances = _read_jsonl(args.file)
    jobs = [instances[i:i + args.job_size] for i in range(0, len(instances), args.job_size)]
    try:
        with tqdm(total=len(jobs), unit="job", file=sys.stderr, disable=args.quiet) as bar:
            results = submit(settings.redis_url, jobs, settings.job_stream, args.timeout_s,
                             progress=bar.update)
    except TimeoutError as exc:  # before OSError, of which it is one
        print(f"batchserve submit: {exc} after {args.timeout_s:g} s (--timeout-s)",
              file=sys.stderr)
        return 1
    except (RedisError, OSError) as exc:
        print(f"batchserve submit: cannot use Redis at {without_password(settings.redis_url)}: "
              f"{first_line(exc)}", file=sys.stderr)
        return 1
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


def _read_jsonl(path: str) -> list[Any]:
    """One instance per non-blank line; ConfigError naming the file (and line) otherwise."""
    import json

    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    instances = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            instances.append(json.loads(line))
        except ValueError as exc:
            raise ConfigError(f"{path} line {number} is not JSON: {exc}") from None
    return instances


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="batchserve", description="An inference server for PyTorch models that batches "
        "requests dynamically: HTTP (/predict, the Open Inference Protocol) and gRPC.")
    parser.add_argument("--version", action="version", version=f"batchserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="run the server: HTTP, and gRPC on grpc_port")
    add_setting_flags(p_serve, skip=JOB_SETTINGS)
    p_serve.add_argument(
        "--fd", type=int, default=None,
        help="serve on an inherited, already bound socket (file descriptor) instead of "
             "host:port; several front ends each get a socket beside it if it was bound with "
             "SO_REUSEPORT, else share it (docs/frontends.md)",
    )
    p_serve.set_defaults(func=serve)
    p_worker = sub.add_parser(
        "worker", help="serve jobs from a Redis stream (job-queue mode) instead of HTTP"
    )
    add_setting_flags(p_worker, skip=HTTP_SETTINGS)
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
    p_check.add_argument("model", nargs="?",
                         help="builtin name, module:callable, or a .pt / .pt2 file; with "
                              "--model-repository, a model of the repository")
    p_check.add_argument("--model", dest="model_flag", metavar="MODEL",
                         help="the same, as a flag (as serve takes it)")
    add_setting_flags(p_check, skip=JOB_SETTINGS | HTTP_SETTINGS | {
        "model", "host", "model_control_mode", "load_model", "default_model",
        "device_timeout_s"})
    p_check.set_defaults(func=check_model)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    open_standard_streams()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except BatchServeError as exc:
        print(f"batchserve: {exc.message}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:  # Ctrl-C (check-model, submit): no traceback, a shell's code
        code = 128 + signal.SIGINT
    return ended(code)


if __name__ == "__main__":  # pragma: no cover
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
