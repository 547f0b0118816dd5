"""Runs batches inside the gateway process, through the same Router and request handling as online traffic.

    BatchRunner(store, completions, config, metrics, admit=None)
        start()  a loop claims batches (store.claim: free or expired leases) and runs each in a task
        wake()   look for work now (a batch was created or cancelled here)
        stop()   cancel the jobs (lines in flight are aborted and stay pending), release the leases

One batch: validating (check every line; a malformed one gets its error line) → in_progress
(the pending lines, at most --batch-concurrency at once, each committed as it finishes) →
finalizing (output and error files from the committed rows) → completed; or cancelling →
cancelled, or expired past its window, each with the lines finished so far.

Each line runs as the *batch* service class (router/classes/service_class.py): only on workers with slack,
withdrawn before its first token when interactive work needs the slot, at a later vLLM priority
where workers schedule by priority; and it spends the key's own limits. `admit(batch_id)` is
awaited before each line starts (a hook for tests); by default it admits at once.

While lines wait for slack (the router's account: router/classes/batch_wait.py), the batch object says
so in `vllm_fleet_waiting`: {"lines": 3, "since": <epoch s>, "reason": "no worker of model 'm'
has batch slack: ..."}, null otherwise; and a log line says it when the wait starts. Why an
extra field on OpenAI's Batch object, which has none for this: the person waiting on a batch
polls the batch object and usually cannot read the gateway's log or /metrics (those are the
operator's: the router's log line and its `vllm_fleet_router_batch_waiting` gauge), and a batch
that stays in_progress with unchanged counts for an hour looks broken. OpenAI's clients keep or
ignore fields they do not know (the Python SDK keeps them in `batch.model_extra`; Node hands the
JSON through; Go and .NET skip them), and the prefix keeps it clear of any field OpenAI adds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable

from vllm_fleet.gateway.access_log import RequestRecord
from vllm_fleet.router.classes.service_class import BATCH
from vllm_fleet.gateway.api_error import bad_request, from_exception
from vllm_fleet.gateway.batch import lines as batch_lines
from vllm_fleet.gateway.batch.lines import ENDPOINTS, FileProblem
from vllm_fleet.gateway.batch.progress import BatchMetrics, Progress
from vllm_fleet.gateway.batch.store import FileRow, LineRow, Store
from vllm_fleet.gateway.completions import CompletionHandler
from vllm_fleet.gateway.config import GatewayConfig

logger = logging.getLogger(__name__)

Admit = Callable[[str], Awaitable[None]]
# The fleet's "not now" answers: a line is tried again (--batch-line-attempts) before it fails.
RETRYABLE = (429, 502, 503, 504)
# Lines that have waited this long for slack show on the batch object (a moment's wait for a
# freed slot is routine), looked at this often (each change is one small write to the store).
SHOW_WAIT_AFTER_S = 5.0
WAIT_WATCH_EVERY_S = 2.0


class LeaseLost(Exception):
    """Another runner holds the batch now (this one was too slow to renew). Recoverable: that runner continues."""


async def _admit_now(batch_id: str) -> None:
    return None


class BatchRunner:
    def __init__(self, store: Store, completions: CompletionHandler, config: GatewayConfig, metrics: BatchMetrics,
                 *, admit: Admit | None = None) -> None:
        self.store = store
        self.completions = completions
        self.config = config
        self.metrics = metrics
        self.admit = admit or _admit_now
        # Unique per runner, not per process: two gateways in one process (tests) are two runners.
        self.runner_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._jobs: dict[str, asyncio.Task] = {}
        self._stopping: dict[str, asyncio.Event] = {}  # set: the batch is cancelled, start no more lines
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None

    def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._claim_loop(), name="batch-runner")

    def wake(self, cancel: str | None = None) -> None:
        if cancel is not None and cancel in self._stopping:
            self._stopping[cancel].set()
        self._wake.set()

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self._jobs.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop_task = None

    async def _claim_loop(self) -> None:
        # Between wakes, look again at a third of the lease: that is how a batch whose runner died
        # (lease expired) is taken over, and how a cancel from another process is seen.
        period = self.config.batch_lease_s / 3
        while True:
            self._wake.clear()
            try:
                claimed = await asyncio.to_thread(self.store.claim, self.runner_id, self.config.batch_lease_s)
            except Exception:
                logger.exception("batch runner: cannot read the batch store; trying again")
                claimed = []
            for batch_id in claimed:
                if batch_id not in self._jobs:
                    self._jobs[batch_id] = asyncio.create_task(self._job(batch_id), name=f"batch-{batch_id}")
            try:
                async with asyncio.timeout(period):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _job(self, batch_id: str) -> None:
        self.metrics.running.inc()
        self._stopping[batch_id] = asyncio.Event()
        renewing = asyncio.create_task(self._renew(batch_id, asyncio.current_task()))
        try:
            await self._run(batch_id)
        except LeaseLost:
            logger.warning("batch %s: another runner holds it now; leaving it", batch_id)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("batch %s: runner failed; it stays active and is taken up again", batch_id)
        finally:
            renewing.cancel()
            self.metrics.running.dec()
            self._jobs.pop(batch_id, None)
            self._stopping.pop(batch_id, None)
            await asyncio.shield(asyncio.to_thread(self.store.release, batch_id, self.runner_id))

    async def _renew(self, batch_id: str, job: asyncio.Task) -> None:
        while True:
            await asyncio.sleep(self.config.batch_lease_s / 3)
            if not await asyncio.to_thread(self.store.renew, batch_id, self.runner_id, self.config.batch_lease_s):
                job.cancel()  # the lines of a lost batch are the new holder's
                return
            batch = await asyncio.to_thread(self.store.batch, batch_id)
            if batch is not None and batch["status"] == "cancelling":
                self._stopping[batch_id].set()  # cancelled through another process

    async def _run(self, batch_id: str) -> None:
        batch = await asyncio.to_thread(self.store.batch, batch_id)
        owner = await asyncio.to_thread(self.store.owner_of, batch_id)
        if batch is None or owner is None:
            return
        if batch["status"] == "validating" and not await self._validate(batch, owner):
            return
        if batch["status"] in ("validating", "in_progress"):
            await self._lines(batch, owner)
        batch = await asyncio.to_thread(self.store.batch, batch_id)
        await self._finalize(batch, owner)

    async def _validate(self, batch: dict, owner: str) -> bool:
        """The lines into the store and the batch in_progress; False when the file fails the batch."""
        batch_id = batch["id"]
        try:
            data = await asyncio.to_thread(self.store.path_of(batch["input_file_id"]).read_bytes)
            rows = await asyncio.to_thread(batch_lines.check_lines, data, batch["endpoint"], self.config.batch_max_lines)
        except (OSError, FileProblem) as exc:
            problem = exc if isinstance(exc, FileProblem) else FileProblem("file_unreadable", "the input file is gone")
            logger.warning("batch %s failed validation: %s", batch_id, problem.message, extra={"request_id": batch_id})
            await asyncio.to_thread(self.store.set_status, batch_id, "failed", errors=problem.errors())
            return False
        if not await asyncio.to_thread(self.store.add_lines, batch_id, self.runner_id, rows):
            raise LeaseLost(batch_id)
        logger.info("batch %s: %d lines (%d malformed), in progress", batch_id, len(rows),
                    sum(r.state == "failed" for r in rows), extra={"request_id": batch_id})
        return True

    async def _lines(self, batch: dict, owner: str) -> None:
        batch_id = batch["id"]
        data = await asyncio.to_thread(self.store.path_of(batch["input_file_id"]).read_bytes)
        pending = await asyncio.to_thread(self.store.pending, batch_id)
        counts = (await asyncio.to_thread(self.store.batch, batch_id))["request_counts"]
        progress = Progress(batch_id, counts["total"], counts["completed"] + counts["failed"])
        queue = iter(pending)
        kind = ENDPOINTS[batch["endpoint"]]
        stop = self._stopping[batch_id]

        running: set[str] = set()  # the router request ids of this batch's lines in flight

        async def lane() -> None:
            for line in queue:  # shared iterator: each line goes to one lane
                if stop.is_set() or time.time() > (batch["expires_at"] or float("inf")):
                    return
                if not await self._admitted(batch_id, stop, batch["expires_at"]):
                    return
                raw = data[line.start:line.start + line.length]
                await self._line(batch_id, owner, kind, line, raw, progress, running)

        watch = asyncio.create_task(self._watch_waiting(batch_id, running))
        try:
            await asyncio.gather(*(lane() for _ in range(self.config.batch_concurrency)))
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        await asyncio.to_thread(self.store.set_waiting, batch_id, self.runner_id, None)
        progress.log()

    async def _watch_waiting(self, batch_id: str, running: set[str]) -> None:
        """Keep the batch object's `vllm_fleet_waiting` in step with the router's account of this
        batch's lines waiting for slack (see the module doc)."""
        shown: tuple[int, str] | None = None
        while True:
            await asyncio.sleep(WAIT_WATCH_EVERY_S)
            status = self.completions.router.batch_wait_status(request_ids=running)
            now = (status.waiting, status.reason) if status.waiting and status.waited_s >= SHOW_WAIT_AFTER_S \
                else None
            if now == shown:
                continue
            if now is not None and shown is None:
                logger.info("batch %s: %d line(s) waiting for batch capacity for %.0f s: %s", batch_id,
                            status.waiting, status.waited_s, status.reason, extra={"request_id": batch_id})
            value = None if now is None else {"lines": status.waiting, "since": int(status.since or time.time()),
                                              "reason": status.reason}
            if not await asyncio.to_thread(self.store.set_waiting, batch_id, self.runner_id, value):
                return  # no longer in progress, or no longer this runner's
            shown = now

    async def _admitted(self, batch_id: str, stop: asyncio.Event, expires_at: float | None) -> bool:
        """Wait for `admit`; False when the batch is cancelled or its window ends first (a line
        waiting for slack must not hold a batch past its completion window: it expires then)."""
        admit = asyncio.ensure_future(self.admit(batch_id))
        stopped = asyncio.ensure_future(stop.wait())
        left = None if expires_at is None else max(0.0, expires_at - time.time())
        try:
            await asyncio.wait((admit, stopped), timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (admit, stopped):
                task.cancel()
        if stop.is_set() or not admit.done() or admit.cancelled():
            return False
        admit.result()  # a hook that failed fails the job (it is taken up again)
        return True

    async def _line(self, batch_id: str, owner: str, kind: str, line: LineRow, raw: bytes, progress: Progress,
                    running: set[str]) -> None:
        request_id = batch_lines.line_id()
        self.metrics.in_flight.inc()
        try:
            ok, result, tokens = await self._answer(owner, kind, raw, request_id, line.custom_id, running)
        finally:
            self.metrics.in_flight.dec()
        if not await asyncio.to_thread(self.store.finish_line, batch_id, self.runner_id, line.idx, ok, result):
            raise LeaseLost(batch_id)
        (self.metrics.done if ok else self.metrics.failed).inc()
        progress.add(tokens)

    async def _answer(self, owner: str, kind: str, raw: bytes, request_id: str, custom_id: str,
                      running: set[str]) -> tuple[bool, str, int]:
        """(ok, the output or error line, completion tokens): the endpoint's own handling, whole.
        `running` holds the router request id of the attempt in flight (and of its restart, which
        completions.py names `<id>-again`)."""
        body = _body(raw)
        attempts = self.config.batch_line_attempts
        for attempt in range(1, attempts + 1):
            record = RequestRecord(request_id, "POST", "batch", "batch", key_id=owner or None)
            try:
                if body.get("stream"):
                    raise bad_request("stream: batch lines are answered whole; drop stream", param="stream")
                plan = self.completions.plan(kind, _dump(body), record=record,
                                             worker_request_id=f"{request_id}-{attempt}")
                plan.request.hints.service_class = BATCH
                plan.request.stream_interval_ms = max(plan.request.stream_interval_ms,
                                                      self.config.batch_stream_interval_ms)
                ids = (plan.request.request_id, f"{plan.request.request_id}-again")
                running.update(ids)
                try:
                    answer = await self.completions.answer(plan, key=owner or None, record=record)
                finally:
                    running.difference_update(ids)
            except Exception as exc:
                error = from_exception(exc)
                if error.status in RETRYABLE and attempt < attempts:
                    # A pause the fleet asked for (Retry-After), else a growing one: not synchronisation.
                    await asyncio.sleep(error.retry_after or min(30.0, 2.0 ** attempt))
                    continue
                if error.status >= 500:
                    logger.warning("batch line %s failed: %s", custom_id, error.message, extra={"request_id": request_id})
                self._log(record, error.status, error.message)
                return False, batch_lines.output_line(custom_id, request_id, error.status, error.body()), 0
            self._log(record, 200)
            self.metrics.prompt.inc(record.prompt_tokens)
            self.metrics.completion.inc(record.completion_tokens)
            return True, batch_lines.output_line(custom_id, request_id, 200, answer), record.completion_tokens
        raise AssertionError("unreachable")

    def _log(self, record: RequestRecord, status: int, error: str | None = None) -> None:
        """The access-log line of one batch line, as an online request gets (path "batch")."""
        record.status = status
        record.error = error
        if self.config.access_log:
            record.emit()

    async def _finalize(self, batch: dict, owner: str) -> None:
        """Output and error files from the committed lines, then the batch's final status."""
        batch_id, status = batch["id"], batch["status"]
        if status not in ("in_progress", "finalizing", "cancelling"):
            return
        if status == "cancelling":
            final = "cancelled"
        elif time.time() > (batch["expires_at"] or float("inf")) and \
                batch["request_counts"]["completed"] + batch["request_counts"]["failed"] < batch["request_counts"]["total"]:
            final = "expired"
        else:
            final = "completed"
            await asyncio.to_thread(self.store.set_status, batch_id, "finalizing", only_from=("in_progress",))
        files = await asyncio.to_thread(self._write_results, batch_id, owner)
        if not await asyncio.to_thread(self.store.set_status, batch_id, final, **files):
            return
        counts = batch["request_counts"]
        logger.info("batch %s %s: %s", batch_id, final, counts, extra={"request_id": batch_id})

    def _write_results(self, batch_id: str, owner: str) -> dict:
        results = self.store.results(batch_id)
        done = [r for s, r in results if s == "done"]
        failed = [r for s, r in results if s == "failed"]
        return {"output_file_id": self._result_file(batch_id, owner, "output", done),
                "error_file_id": self._result_file(batch_id, owner, "error", failed)}

    def _result_file(self, batch_id: str, owner: str, which: str, rows: list[str]) -> str | None:
        if not rows:
            return None
        file_id = "file-" + secrets.token_hex(12)
        data = ("\n".join(rows) + "\n").encode()
        path = self.store.path_of(file_id)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        self.store.add_file(FileRow(file_id, owner, f"batch_{which}", f"{batch_id}_{which}.jsonl", len(data),
                                    int(time.time())))
        return file_id


def _body(raw: bytes) -> dict:
    return json.loads(raw)["body"]  # lines.check_lines made sure it is an object


def _dump(body: dict) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()


__all__ = ["Admit", "BatchRunner", "LeaseLost"]
