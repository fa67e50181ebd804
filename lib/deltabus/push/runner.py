"""Runs the push job's streaming query until it is stopped, idle, or out of time."""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..config import Settings
from ..errors import FailedPrecondition, InvalidArgument
from ..policy.idle_wake import WATCHED
from ..spark.source import message_stream, register
from ..storage import Engine
from . import checkpoint_damage
from .job import DeliveryJob, RunSummary
from .jwks_server import JwksServer
from .pool import pool_size

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery  # where it is defined; the package does not re-export it explicitly

log = logging.getLogger("deltabus.deliver")

PROGRESS_EVERY = 10.0

# On a stop, the pushes the workers hold get this long at most to finish and be merged (each
# also ends at its ack deadline, 10 s by default). It keeps a stop, with its final commit and
# Spark's own shutdown, inside the 30 s a scheduler such as Kubernetes waits before SIGKILL.
DRAIN_SECONDS = 20.0
# After the drain, how long the workers get to end before their Spark job is cancelled.
CLOSE_WAIT = 5.0


def _stop_between_batches(query: "StreamingQuery", wait: float = 5.0) -> None:
    """Stop when no trigger is running: interrupting one mid-flight upsets Spark's stream thread."""
    end = time.monotonic() + wait
    while time.monotonic() < end and query.isActive and query.status.get("isTriggerActive"):
        time.sleep(0.02)
    query.stop()


FS_CHECKPOINTS = "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def _cheap_local_checkpoints(spark: "SparkSession", checkpoint: str) -> None:
    """On a local disk, write the offset and commit logs through Hadoop's FileSystem API.

    Spark's default (FileContext) creates each log file with explicit permissions, and
    without Hadoop's native library that forks a ``chmod`` per file: jstack showed the
    stream thread in fork/exec, and an idle job cost 0.36 JVM cores at a 0.5 s trigger.
    Rename-based writes keep the logs atomic on a local disk; other stores keep Spark's default.
    """
    if "://" in checkpoint and not checkpoint.startswith("file:"):
        return
    spark.conf.set("spark.sql.streaming.checkpointFileManagerClass", FS_CHECKPOINTS)


# What a child's death by the group's signal looks like in the query's failure: Hadoop's Shell
# for a chmod the signal killed (seen: ``Shell$ExitCodeException exitCode=143``; 130 is
# SIGINT's, 137 SIGKILL's), the JVM failing to fork one (seen: ``Cannot run program "chmod":
# ... Failed to exec spawn helper``), or a Python worker interrupted by Ctrl-C.
FORK_FAILURES = re.compile(r"ExitCodeException\b.*\bexitCode=(130|137|143)\b|Cannot run program|spawn helper|KeyboardInterrupt")


def failed_while_stopping(stop_requested: bool, texts: Sequence[str]) -> str | None:
    """The one-line cause to log when the query failed, after a stop was asked for, because the
    stop's signal reached a child of the job (None: a failure to raise).

    A signal to the job's process group (Ctrl-C at a terminal, ``kill -TERM -<pgid>``) also
    reaches the children the JVM forks: without Hadoop's native library every checkpoint log
    file gets its permissions from a forked ``chmod``, and one killed mid-write failed the
    query (``ExitCodeException exitCode=143`` in HDFSMetadataLog.write; seen in the chaos
    test). The job was stopping anyway, and a failed query is a crash the next start recovers
    from (the checkpoint and the tables are written atomically), so it stops as asked, with
    a warning instead of a traceback. Any other failure is raised, stop or not. Python's
    signal handler runs while the driver waits in awaitTermination (PEP 475), so `stop` is
    set before the JVM reports the failure.

    `texts`: the failure and its causes, outermost first (`exception_chain`)."""
    if not stop_requested:
        return None
    for text in texts:
        for line in text.splitlines():
            if FORK_FAILURES.search(line):
                return line.strip()[:300]
    return None


def exception_chain(exc: BaseException, limit: int = 10) -> list[str]:
    """The texts of `exc` and of its causes, outermost first.

    PySpark 4.1 keeps a JVM exception's cause as another captured exception in ``_cause`` and
    has no public accessor for it; ``__cause__`` covers Python's own chaining."""
    texts: list[str] = []
    seen: set[int] = set()
    current: object = exc
    while isinstance(current, BaseException) and id(current) not in seen and len(texts) < limit:
        seen.add(id(current))
        try:
            texts.append(f"{type(current).__name__}: {current}")
        except Exception as unreadable:  # str() of a JVM error asks the JVM, which may be going away
            texts.append(f"{type(current).__name__}: (no text: {type(unreadable).__name__})")
        current = getattr(current, "_cause", None) or current.__cause__
    return texts


def _progress(query: "StreamingQuery") -> None:
    p = query.lastProgress
    if p:
        log.info(
            "spark progress: batch %s, %s input rows, %.1f rows/s, durations (ms) %s",
            p.get("batchId"), p.get("numInputRows"), p.get("processedRowsPerSecond") or 0.0,
            p.get("durationMs"),
        )


def run(
    spark: "SparkSession",
    settings: Settings,
    *,
    until_idle: bool = False,
    max_seconds: float | None = None,
    jwks_port: int | None = None,
    jwks_host: str = "127.0.0.1",
    stop: threading.Event | None = None,
    hurry: threading.Event | None = None,
    stop_reason: Callable[[], str] = lambda: "stop requested",
    drain_seconds: float = DRAIN_SECONDS,
    engine: Engine | None = None,
) -> RunSummary:
    """Run the push job until `stop` is set, it is idle (`until_idle`) or `max_seconds` passed.

    Stopping leases nothing more, waits for the pushes the workers hold (at most
    `drain_seconds`, and no longer than the last lease in flight ends; not at all once
    `hurry` is set), merges their outcomes and returns this run's summary.

    `engine`: the warehouse already opened by the caller (the quickstart shares one with its
    clients); it must be the engine `settings.engine` names ("auto" accepts either). Without
    it the job opens ``settings.warehouse`` on ``settings.engine``."""
    if engine is not None and settings.engine not in ("auto", engine.name):
        raise InvalidArgument("engine", f"settings say {settings.engine} but the engine passed is {engine.name}")
    # Refuse a master without room for the push workers before anything starts.
    pool_size(settings.delivery_partitions, spark.sparkContext.defaultParallelism)
    register(spark)
    job = DeliveryJob(spark, settings, until_idle=until_idle, engine=engine)
    server = None
    if jwks_port is not None:
        tokens = job.tokens()  # creates the signing key on first use
        server = JwksServer(lambda: tokens.jwks, settings.issuer, host=jwks_host, port=jwks_port).start()
        log.info("serving the push signing keys at %s", server.jwks_uri)
    _cheap_local_checkpoints(spark, job.checkpoint)

    def start_query() -> Any:  # a StreamingQuery (its stub types awaitTermination's timeout as int)
        job.expect_query()
        started_query = (
            message_stream(spark, job.engine.name, job.engine.table_uri("messages"), settings.trigger_interval,
                           idle_hint=job.idle_hint, watch={t: job.engine.table_uri(t) for t in WATCHED})
            .writeStream.queryName("deltabus-deliver")
            .foreachBatch(job.on_batch)
            .option("checkpointLocation", job.checkpoint)
            .trigger(processingTime=f"{settings.trigger_interval} seconds")
            .start()
        )
        job.bind_query(str(started_query.id))
        return started_query

    query = start_query()
    log.info("delivering from %s (checkpoint %s)", job.engine.warehouse, job.checkpoint)
    started = time.monotonic()
    last_progress = started
    set_aside_once = False
    try:
        while True:
            try:
                ended = query.awaitTermination(0.2)
            except Exception as exc:  # the query failed: a damaged checkpoint is set aside once (checkpoint_damage)
                stopping = stop is not None and stop.is_set()
                while_stopping = failed_while_stopping(stopping, exception_chain(exc) if stopping else [])
                if while_stopping is not None:
                    log.warning("the streaming query failed while stopping (%s); nothing is lost: the next start resumes "
                                "from the checkpoint", while_stopping)
                    job.summary.stopped_because = stop_reason()
                    break
                reason = checkpoint_damage.damage(str(exc), job.checkpoint)
                if reason is None or set_aside_once:
                    raise
                set_aside_once = True
                moved = checkpoint_damage.set_aside(job.checkpoint, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
                if moved is None:
                    raise FailedPrecondition(
                        f"the push job's streaming checkpoint {job.checkpoint} is damaged ({reason}); delete it and start "
                        "the job again: nothing is lost, fan-out follows each subscription's cursor"
                    ) from None
                log.warning("the streaming checkpoint %s is damaged (%s); moved it to %s and started a new one "
                            "(nothing is lost: fan-out follows each subscription's cursor)", job.checkpoint, reason, moved)
                query = start_query()
                continue
            if ended:
                job.summary.stopped_because = "the query ended"
                break
            now = time.monotonic()
            if stop is not None and stop.is_set():
                job.summary.stopped_because = stop_reason()
                break
            if until_idle and job.idle:
                job.summary.stopped_because = "nothing left to deliver or retry"
                break
            if max_seconds is not None and now - started >= max_seconds:
                job.summary.stopped_because = f"--max-seconds {max_seconds:g} reached"
                break
            if now - last_progress >= PROGRESS_EVERY:
                _progress(query)
                last_progress = now
    finally:
        job.stopping = True
        _stop_between_batches(query)
        try:
            job.drain(within=drain_seconds, hurry=hurry)
        finally:
            # The drain waited for the workers already; a hurried stop cancels them at once.
            # So does a drain that ran out of time: what is still out hangs past the bound, and
            # waiting CLOSE_WAIT more took a stop to 28 s here, at Kubernetes' 30 s grace.
            hurried = (hurry is not None and hurry.is_set()) or job.unsettled() > 0
            job.close(wait=0.0 if hurried else CLOSE_WAIT)
            if server is not None:
                server.stop()
    log.info(
        "stopped (%s) after %d batches: delivered %d acked %d nacked %d; at most %d message bytes held at once (cap %d)",
        job.summary.stopped_because, job.summary.batches, job.summary.delivered, job.summary.acked, job.summary.nacked,
        job.summary.peak_push_bytes, settings.max_queued_bytes,
    )
    return job.summary
