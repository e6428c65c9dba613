"""JobWorker: jobs from a Redis stream through the same bounded queue and device threads.

A job's result goes to ``batchserve:result:<id>`` and is announced on ``batchserve:results``
(app/jobs/messages.py); only then is the entry acknowledged and deleted. A worker holds a lease on
each job it reads (the group's pending entry), renews it while working (app/jobs/leases.py), and
takes over the jobs of lost workers once their lease has run out (XAUTOCLAIM). Everything in
this module runs on the event loop of ``batchserve worker``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from app.config import Settings
from app.errors import ServeError, Unavailable, first_line
from app.jobs.leases import keep_leases
from app.jobs.messages import (
    RESULT_KEY,
    RESULTS_MAXLEN,
    RESULTS_STREAM,
    Job,
    dead_stream,
    error_result,
    parse_job,
)
from app.jobs.metrics import JobMetrics
from app.runtime import InferenceService

log = logging.getLogger("batchserve.jobs")

# A model's health or refusal that says the worker cannot take a job now (a full queue; no live
# device thread: one restarting, or stuck), not that the job is wrong: seconds to wait, ask again.
WAIT_S = {"busy": 0.005, "unhealthy": 0.1}
READ_BLOCK_MS = 500  # how long one read waits for new jobs; bounds the reaction to SIGTERM


class Released(Exception):
    """A job refused for want of a live device thread while the worker stops, or past the job's
    deadline: left unacknowledged, to be taken over after its lease, not failed."""


class JobWorker:
    """Reads, leases, runs and answers jobs. Event-loop thread only.

    Stages overlap: the reader keeps up to ``read_ahead`` jobs in hand, each job runs as its own
    task (decode -> shared queue -> device threads -> result write), so reading and writing of
    some jobs happen while others are on the device. Nothing more is read while ``read_ahead``
    jobs are held, which also bounds the items this worker puts in the queue.
    """

    def __init__(self, settings: Settings, service: InferenceService, client: aioredis.Redis,
                 metrics: JobMetrics, consumer: str) -> None:
        self.settings = settings
        self.service = service
        self.redis = client
        self.metrics = metrics
        self.consumer = consumer
        self.read_ahead = 2 * settings.max_batch_size * max(1, len(service.devices))
        self.held: dict[str, asyncio.Task[None]] = {}
        self._room = asyncio.Event()
        self._stop = asyncio.Event()  # set once stopping: ends the claim loop's rest at once
        self._stopping = False

    # ---- lifecycle -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve jobs until ``stop`` is set, then finish and acknowledge what is held."""
        await self.ensure_group()
        background = [
            asyncio.create_task(self._read_loop(), name="jobs-read"),
            asyncio.create_task(self._claim_loop(), name="jobs-claim"),
        ]
        renew = asyncio.create_task(
            keep_leases(self.redis, self.settings, self.consumer, self.held, self.metrics),
            name="jobs-renew")
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([stopped, *background], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            log.info("stopping: no more reads; finishing what is held")
        self._stopping = True
        self._room.set()
        self._stop.set()
        outcomes = await asyncio.gather(*background, return_exceptions=True)  # within a read
        log.info("stopping: finishing %d held jobs", len(self.held))
        while self.held:
            await asyncio.gather(*list(self.held.values()), return_exceptions=True)
        renew.cancel()
        stopped.cancel()
        await asyncio.gather(renew, stopped, return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            raise RuntimeError("a job loop failed (Redis unreachable?)") from failures[0]

    async def ensure_group(self) -> None:
        """The group starts at the stream's beginning, so jobs added before any worker count."""
        try:
            await self.redis.xgroup_create(
                self.settings.job_stream, self.settings.job_group, id="0", mkstream=True
            )
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    # ---- reading and taking over -----------------------------------------------------------------

    async def _wait_for_room(self) -> int:
        """Wait until this worker may take more jobs: fewer than ``read_ahead`` held, room in
        the device queue and a live device thread serving the model (``_blocked``)."""
        while not self._stopping:
            if len(self.held) >= self.read_ahead:
                self._room.clear()
                await self._room.wait()
            elif wait_s := _blocked(self.service):
                await asyncio.sleep(wait_s)
            else:
                break
        return self.read_ahead - len(self.held)

    async def _read_loop(self) -> None:
        s = self.settings
        while not self._stopping:
            free = await self._wait_for_room()
            if self._stopping:
                return
            reply: Any = await self.redis.xreadgroup(
                s.job_group, self.consumer, {s.job_stream: ">"}, count=free, block=READ_BLOCK_MS
            )
            for _stream, entries in reply or []:
                for entry, fields in entries:
                    self._start(entry.decode(), fields)

    async def _claim_loop(self) -> None:
        """Take over jobs whose holder has not renewed them within the lease."""
        s = self.settings
        lease_ms = int(s.job_lease_s * 1000)
        interval = max(0.1, s.job_lease_s / 4)
        cursor: bytes | str = "0-0"
        while not self._stopping:
            free = await self._wait_for_room()
            if self._stopping:
                return
            cursor, entries = (await self.redis.xautoclaim(
                s.job_stream, s.job_group, self.consumer, lease_ms, start_id=cursor, count=free
            ))[:2]
            for entry, fields in entries:
                if fields is not None:  # None: deleted while pending
                    await self._claimed(entry.decode(), fields)
            if cursor in (b"0-0", "0-0"):  # scanned the whole pending list: rest a while,
                with contextlib.suppress(TimeoutError):  # or less if the worker stops
                    await asyncio.wait_for(self._stop.wait(), interval)

    async def _claimed(self, entry: str, fields: dict[bytes, bytes]) -> None:
        s = self.settings
        pending = await self.redis.xpending_range(
            s.job_stream, s.job_group, min=entry, max=entry, count=1
        )
        deliveries = int(pending[0]["times_delivered"]) if pending else 1
        self.metrics.reclaimed.inc()
        log.warning("took over job entry %s (delivery %d)", entry, deliveries)
        if deliveries > s.job_max_deliveries:
            job = parse_job(entry, fields, s.max_instances)
            why = f"the job was delivered {deliveries - 1} times without being finished"
            result = None if job.id is None else error_result(job.id, "gave_up", why)
            await self._finish(job, result, dead=("max_deliveries", why))
            return
        self._start(entry, fields)

    def _start(self, entry: str, fields: dict[bytes, bytes]) -> None:
        if entry in self.held:
            return
        job = parse_job(entry, fields, self.settings.max_instances)
        task = asyncio.create_task(self._run_job(job), name=f"job-{entry}")
        self.held[entry] = task
        self.metrics.held.set(len(self.held))
        task.add_done_callback(lambda _t: self._release(entry))

    def _release(self, entry: str) -> None:
        self.held.pop(entry, None)
        self.metrics.held.set(len(self.held))
        self._room.set()

    # ---- one job ---------------------------------------------------------------------------------

    async def _run_job(self, job: Job) -> None:
        try:
            if job.id is None:
                assert job.error is not None  # parse_job says why an entry has no id
                await self._finish(job, None, dead=("no_id", job.error.message))
            elif job.error is not None:
                await self._finish(job, error_result(job.id, job.error.type, job.error.message))
            else:
                await self._finish(job, await self._infer(job))
        except asyncio.CancelledError:
            raise
        except Released as exc:
            log.warning("job entry %s left to another worker (%s)", job.entry, str(exc))
        # Not acknowledged: the job stays pending and is taken over after its lease. Redis
        # gone is one line a job (the worker then exits, saying so once); anything else is
        # a fault of ours, with its traceback.
        except (RedisError, OSError) as exc:
            log.error("job entry %s could not be finished (Redis: %s); it will be retried",
                      job.entry, first_line(exc))
        except Exception:
            log.exception("job entry %s could not be finished; it will be retried", job.entry)

    async def _infer(self, job: Job) -> dict[str, Any]:
        assert job.id is not None
        started = time.monotonic()
        deadline = started + self.settings.request_timeout_s
        tracing = self.service.tracing
        span = None if tracing is None else tracing.start("job", job.trace, started,
                                                          {"batchserve.job_id": job.id})
        status = 500
        try:
            model = self.service.repository.get()
            level = model.level_of(job.priority)
            items = await model.decode(job.instances or [], deadline)
            while True:
                try:
                    pending = model.enqueue(items, deadline, level, span)
                    break
                except Unavailable as exc:
                    late = time.monotonic() > deadline
                    if exc.type == "unhealthy" and (late or self._stopping):
                        raise Released(exc.message) from None
                    if exc.type not in WAIT_S or late:
                        raise
                    await asyncio.sleep(WAIT_S[exc.type])
            predictions = await model.result(pending)
            status = 200
        except ServeError as exc:
            status = exc.status
            return error_result(job.id, exc.type, exc.message)
        finally:
            if span is not None:
                assert tracing is not None
                tracing.end(span, status, time.monotonic())
        return {"id": job.id, "status": "ok", "predictions": predictions}

    async def _finish(
        self, job: Job, result: dict[str, Any] | None, dead: tuple[str, str] | None = None
    ) -> None:
        """Write the result, announce it, then acknowledge and delete the entry, atomically;
        with ``dead`` (a reason and what was wrong), a copy of the job on the dead-letter
        stream."""
        s = self.settings
        pipe = self.redis.pipeline(transaction=True)
        if result is not None:
            body = orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY)
            pipe.set(RESULT_KEY + result["id"], body, ex=s.result_ttl_s)
            pipe.xadd(RESULTS_STREAM, {"id": result["id"]}, maxlen=RESULTS_MAXLEN,
                      approximate=True)
        if dead is not None:
            pipe.xadd(dead_stream(s.job_stream),
                      {"job": job.raw, "reason": dead[0], "why": dead[1], "entry": job.entry})
        pipe.xack(s.job_stream, s.job_group, job.entry)
        pipe.xdel(s.job_stream, job.entry)
        await pipe.execute()
        if dead is not None:
            self.metrics.dead_lettered.labels(reason=dead[0]).inc()
            log.warning("job entry %s dead-lettered (%s): %s", job.entry, *dead)
        if result is not None and result["status"] == "ok":
            self.metrics.done.inc()
        elif result is not None:
            self.metrics.failed.labels(reason=result["error"]["type"]).inc()


def _blocked(service: InferenceService) -> float:
    """Seconds to wait before taking more jobs (0: none): while the default model's queue is
    full (HTTP traffic may fill it too; a job more urgent than its default level may still
    fit), or no live device thread serves it."""
    try:
        model = service.repository.get()
    except ServeError:
        return 0.0
    if model.stranded:
        return WAIT_S["unhealthy"]
    return WAIT_S["busy"] if model.queue.depth >= model.settings.queue_capacity else 0.0
