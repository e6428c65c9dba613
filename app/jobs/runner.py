"""``batchserve worker``: the process around a JobWorker (model, device threads, signals)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, start_http_server
from redis.exceptions import RedisError

from app.config import Settings
from app.errors import ConfigError, first_line, os_reason
from app.jobs.consumer import JobWorker
from app.jobs.metrics import JobMetrics
from app.process import fit_torch_threads, freeze_startup_objects, tune_for_serving
from app.runtime import InferenceService, build_service
from app.values import without_password

log = logging.getLogger("batchserve.jobs")


def consumer_name() -> str:
    """Unique per process: a restarted worker is a new consumer (the old one's jobs are taken
    over after their lease)."""
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"


def serve_metrics(host: str, port: int, registry: CollectorRegistry) -> None:
    """/metrics on ``host:port`` from a thread of its own; ConfigError if it cannot listen."""
    try:
        start_http_server(port, host, registry)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {os_reason(exc)}") from None


async def run_worker(settings: Settings) -> int:
    """Load the model, serve jobs until SIGTERM/SIGINT, finish what is held. Exit code."""
    tune_for_serving()
    fit_torch_threads()
    service = build_service(settings)
    metrics = service.metrics
    if settings.worker_metrics_port is not None:  # before the model loads: a port in use fails fast
        serve_metrics(settings.host, settings.worker_metrics_port, metrics.registry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await service.start()
    try:
        while service.status != "ready":
            if service.load_failed:
                log.critical("the model failed to load (%s); exiting", service.load_error)
                return 1
            if stop.is_set():
                return 0
            waits = [asyncio.ensure_future(service.changed()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()
        freeze_startup_objects()
        client = aioredis.Redis.from_url(settings.redis_url)
        worker = JobWorker(settings, service, client, JobMetrics.create(metrics.registry),
                           consumer_name())
        log.info("worker %s reading %s as group %s", worker.consumer, settings.job_stream,
                 settings.job_group)
        stuck = asyncio.create_task(_stop_when_not_live(service, stop))
        try:
            await worker.run(stop)
        except Exception as exc:  # noqa: BLE001 - Redis gone: one line; anything else: logged
            cause = exc.__cause__ if isinstance(exc, RuntimeError) and exc.__cause__ else exc
            if isinstance(cause, (RedisError, OSError)):
                log.critical("cannot use Redis at %s, exiting: %s",
                             without_password(settings.redis_url), first_line(cause))
            else:
                log.exception("the worker stopped on an error")
            return 1
        finally:
            stuck.cancel()
            await client.aclose()
        log.info("worker %s stopped", worker.consumer)
        return 1 if stuck.done() and not stuck.cancelled() else 0
    finally:
        # A stuck device thread will not stop: waiting for it would only delay the restart.
        await service.stop(timeout_s=1.0 if not service.live else None)


async def _stop_when_not_live(service: InferenceService, stop: asyncio.Event) -> None:
    """Stop the worker once the service is not live (a device thread stuck in a call, a
    device with a sticky error, or a model a restarted thread could not take back): the jobs
    held are finished (those a stuck call holds time out), the rest left to other workers, and
    the process exits 1 for its orchestrator to restart it."""
    while service.live:
        await service.changed()
    log.critical("a device or a model can no longer be used (a call stuck, a device broken, or "
                 "a model not taken back after a restart); stopping to be restarted")
    stop.set()

