"""The executor side: one Router per Python worker process, and the mapInArrow function.

Spark calls `answer_partition` synchronously, in a Python worker process it reuses across
tasks (`spark.python.worker.reuse`, on by default). Channels cannot be pickled, so only the
plain config travels; here it is turned, once per process and config, into a Router that
lives on a dedicated event loop in a background thread. Later tasks in the same process find
it in `_routers` and reuse its channels. `atexit` closes them when the process exits normally
(PySpark's forking daemon ends its workers with os._exit, which skips atexit: then the OS
closes the sockets, and since no request is in flight between tasks the workers lose nothing).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pyarrow as pa
from prometheus_client import CollectorRegistry

from vllm_fleet.errors import NoWorkerError
from vllm_fleet.registry import open_registry
from vllm_fleet.router import Router
from vllm_fleet.router.pool.snapshot import DOWN
from vllm_fleet.spark.answerer import Answerer
from vllm_fleet.spark.config import SparkGenerateConfig
from vllm_fleet.spark.ledger import TaskLedger, index_for
from vllm_fleet.spark.output_schema import parse_output_schema
from vllm_fleet.spark.partition import PartitionRun
from vllm_fleet.spark.progress import ProgressReporter
from vllm_fleet.spark.rows import RowResult, result_arrays, result_names
from vllm_fleet.spark.sessions import answer_sessions, group_turns
from vllm_fleet.spark.typed_rows import typed_arrays

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Arrow batches answered concurrently: the next batch's rows start while the last ones finish.
PIPELINE_DEPTH = 2


class LoopThread:
    """An event loop running forever in a daemon thread; `run` blocks the caller on a coroutine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vllm-fleet-spark", daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return self.submit(coro).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


_lock = threading.Lock()
_loop: LoopThread | None = None
_routers: dict[str, Router] = {}


def process_loop() -> LoopThread:
    global _loop
    with _lock:
        if _loop is None:
            _loop = LoopThread()
            atexit.register(close_all)
        return _loop


def router_for(config: SparkGenerateConfig) -> Router:
    """This process's Router for `config`, created (and started) on first use."""
    loop = process_loop()
    key = config.key()
    with _lock:
        router = _routers.get(key)
        if router is None:
            router = _routers[key] = loop.run(_start_router(config))
        return router


async def _start_router(config: SparkGenerateConfig) -> Router:
    router = Router(open_registry(config.registry_spec), config.router_config(), metrics_registry=CollectorRegistry())
    await router.start()
    try:
        await router.wait_ready(config.connect_timeout_s)
    except NoWorkerError as exc:
        # The driver saw workers a moment ago; rows will retry and, failing that, carry the error.
        logger.warning("executor: %s; rows will wait for workers and may fail", exc)
    await _wait_until_every_worker_answered(router, timeout=min(10.0, config.connect_timeout_s))
    try:
        # cache_aware: a task's first rows would otherwise go out before this router has the
        # model's tokenizer and the workers' blocks, routed by load alone, and a short job can
        # end in that window. Loading the tokenizer in a fresh executor process imports
        # transformers (~6 s on a 2-core host; past 10 s under load, when a 10 s bound sent a
        # third of a test job's rows blind and they paid their documents a third time). Rows are
        # batch work: a bounded wait once per process costs nothing an online request would
        # feel, and online routers never wait for this.
        await router.wait_cache_ready(config.cache_ready_timeout_s)
    except NoWorkerError as exc:
        logger.warning("executor: %s; rows route by load until it is", exc)
    return router


async def _wait_until_every_worker_answered(router: Router, *, timeout: float) -> None:
    """Session affinity hashes over the workers that serve. `wait_ready` returns at the first
    one, and a router that routed then would place a session's first turn on a smaller ring
    than its later turns, so the session would change worker (and lose its prefix cache)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        pending = [w for w in router.snapshot().workers
                   if w.health == "UNKNOWN" or (w.health == "SERVING" and w.state == DOWN)]
        if not pending:
            return
        await asyncio.sleep(0.05)


def close_all() -> None:
    """Close every cached Router and stop the loop (atexit; tests)."""
    global _loop
    with _lock:
        loop, routers = _loop, list(_routers.values())
        _loop = None
        _routers.clear()
    if loop is None:
        return
    for router in routers:
        try:
            loop.run(router.close(), timeout=10)
        except Exception:  # at exit, a close that fails must not hide the others
            logger.exception("executor: closing a router failed")
    loop.stop()


def answer_partition(batches: Iterator[pa.RecordBatch], config: dict[str, Any]) -> Iterator[pa.RecordBatch]:
    """The mapInArrow function: every input row comes out once, with the result columns added."""
    settings = SparkGenerateConfig(**config)
    columns = ResultColumns(settings)
    router = router_for(settings)
    answerer = Answerer(router, settings)
    task_key = _task_key()
    ledger = TaskLedger(index_for(settings.ledger_path), _task_name()) if settings.ledger_path else None
    # The heartbeat reads the router's account of batch waiting for slack on the router's loop.
    progress = ProgressReporter(settings.progress_address, task_key, waiting=router.batch_wait_status)
    heartbeat = process_loop().submit(progress.heartbeat()) if settings.progress_address else None
    try:
        if settings.sessions:
            yield from _answer_sessions(batches, answerer, settings, columns, ledger, progress)
        else:
            yield from _answer_rows(batches, PartitionRun(answerer, settings, task_key, ledger, progress), settings,
                                    columns, ledger)
    finally:
        if heartbeat is not None:
            heartbeat.cancel()
        progress.close()
        if ledger is not None:
            ledger.close()
            logger.info("ledger %s: task %s: %d rows replayed from the ledger, %d generated", settings.ledger_path,
                        task_key, ledger.replayed, ledger.generated)


def _answer_rows(batches: Iterator[pa.RecordBatch], run: PartitionRun, settings: SparkGenerateConfig,
                 columns: ResultColumns, ledger: TaskLedger | None) -> Iterator[pa.RecordBatch]:
    loop = process_loop()
    pending: collections.deque[tuple[pa.RecordBatch, concurrent.futures.Future]] = collections.deque()
    try:
        for batch in batches:
            values = batch.column(settings.prompt_col or settings.messages_col).to_pylist()
            keys = batch.column(settings.id_col).to_pylist() if settings.id_col else None
            pending.append((batch, loop.submit(run.answer_rows(values, keys))))
            if len(pending) >= PIPELINE_DEPTH:
                yield _synced(columns.add(*_next(pending)), ledger)
        while pending:
            yield _synced(columns.add(*_next(pending)), ledger)
    finally:
        for _, future in pending:
            future.cancel()
        loop.run(run.close(), timeout=30)


def _synced(batch: pa.RecordBatch, ledger: TaskLedger | None) -> pa.RecordBatch:
    """The batch, once the ledger holds its answers on disk: the sink may commit it next."""
    if ledger is not None:
        ledger.sync()
    return batch


def _answer_sessions(batches: Iterator[pa.RecordBatch], answerer: Answerer, settings: SparkGenerateConfig,
                     columns: ResultColumns, ledger: TaskLedger | None,
                     progress: ProgressReporter) -> Iterator[pa.RecordBatch]:
    # A session may span Arrow batches, so the partition is read whole before its turns run.
    table = pa.Table.from_batches(list(batches))
    if table.num_rows == 0:
        return
    column = settings.prompt_col or settings.messages_col
    grouped, results = group_turns(table.column(settings.session_col).to_pylist(),
                                   table.column(settings.turn_col).to_pylist(), table.column(column).to_pylist())
    results.update(process_loop().run(answer_sessions(answerer, settings, grouped, ledger)))
    if ledger is not None:
        ledger.sync()
    ordered = [results.get(i) or RowResult.failed("internal error: no result") for i in range(table.num_rows)]
    for result in ordered:  # a partition's sessions end together: counted then
        progress.row_done(error=result.error is not None, tokens=result.completion_tokens or 0)
    for batch in table.combine_chunks().to_batches():
        yield columns.add(batch, ordered[:batch.num_rows])
        ordered = ordered[batch.num_rows:]


def _next(pending: collections.deque) -> tuple[pa.RecordBatch, list[RowResult]]:
    batch, future = pending.popleft()
    return batch, future.result()


class ResultColumns:
    """Builds the columns generate() adds to an Arrow batch: the result columns, then one per
    output_schema field (whose decoding may set a row's error, so it runs first)."""

    def __init__(self, settings: SparkGenerateConfig) -> None:
        self.output_col = settings.output_col
        self.struct = parse_output_schema(settings.output_schema) if settings.output_schema else None

    def add(self, batch: pa.RecordBatch, results: list[RowResult]) -> pa.RecordBatch:
        typed = typed_arrays(results, self.struct) if self.struct is not None else []
        names = [*batch.schema.names, *result_names(self.output_col), *(self.struct.names if self.struct else [])]
        return pa.RecordBatch.from_arrays([*batch.columns, *result_arrays(results), *typed], names=names)


def _task_name() -> str:
    """The ledger file's name for this task attempt: stage, partition, attempt."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return "local"
    return f"{context.stageId()}-{context.partitionId()}-{context.attemptNumber()}"


def _task_key() -> str:
    """Where this task's rows sit: stable when Spark retries the task, distinct across stages."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return "local"
    return f"{context.stageId()}:{context.partitionId()}"
