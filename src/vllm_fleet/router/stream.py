"""RoutedStream: one request's chunks, surviving worker failures without losing or repeating a token.

The loop: admit → pick a worker (policy ranking, breaker; pick.py) → stream from it → on a
recoverable failure, pick another worker and carry on:

* Before anything reached the caller (failover), the same request is sent again.
* After (migration), each unfinished (input, sample) stream is re-sent as its own input with
  n=1 and `resume_token_ids` = the tokens the caller already has, and its chunks are mapped
  back to the original (index, sample). The worker continues after those tokens, counts them
  against max_tokens, and its text deltas start after them, so the caller sees one stream.
  `resume_delivered_chars` says how much of those tokens' text the caller has: with stop
  strings a worker holds back text that could begin one, and the next worker sends that text
  first, or matches a stop string that spans the switch (worker/resume/stops.py).
* A grammar-constrained request (`request.constrained`) cannot migrate: vLLM starts
  its grammar at the first generated token, so another worker could not keep the answer valid.
  It fails over before its first token as any other; after it, a worker failure ends the
  stream with MigrationUnsupportedError (fatal), never with an answer that breaks its grammar.

A stream stalls when no chunk arrives for `stall_timeout_s` (`first_chunk_timeout_s` before
the first one) and its worker shows no progress by its own account (not SERVING, or its engine
silent that long; see watchdog.py): that is a worker failure like any other. A stream queued on a
busy engine is never stalled, however long it waits. Invalid requests are never retried. Every extra attempt spends from the retry
budget; retry.py decides whether one follows. Closing the stream (aclose, or cancelling the task
iterating it) cancels the worker call, which aborts the engine request.

Usage on a final chunk is for the whole stream: prompt and cached tokens as the last worker
reports them (it counts the original prompt only), completion tokens = every token delivered.

A stream sees the router only through the StreamContext it is given (context.py): policy,
pool, budget, admission, metrics, config and `connect(address)`, the client of one attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator

from vllm_fleet.errors import (
    DeadlineExceededError,
    InvalidRequestError,
    RateLimitedError,
    WorkerError,
    WorkerOverloadedError,
    WorkerTimeoutError,
)
from vllm_fleet.protocol.types import Chunk, GenerateRequest
from vllm_fleet.router.quota.admission import Ticket
from vllm_fleet.router.classes.service_class import BATCH, batch_share
from vllm_fleet.router.context import StreamContext
from vllm_fleet.router.delivered import Delivered
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.pick import pick_batch, pick_or_await_probe
from vllm_fleet.router.retry import attempt_id, check_retry, failure_verdict, stepped_aside
from vllm_fleet.router.cache.routed_holds import RoutedHold
from vllm_fleet.router.watchdog import StallWatchdog
from vllm_fleet.router.pool.lease import Lease

logger = logging.getLogger(__name__)

DEADLINE_SLACK_S = 0.05


class _Withdrawn(Exception):
    """A batch attempt stepped aside for interactive work (router/classes/service_class.py): withdrawn before its
    first token, or paused after it (the next attempt resumes after the delivered tokens)."""


class RoutedStream:
    """Async iterator of Chunks for one request. See the module docstring for the guarantees.

    `worker`, `attempts` and `migrations` describe what happened so far; errors that stop the
    request before its first chunk (RateLimitedError, NoWorkerError, InvalidRequestError, or
    failover exhausted) are raised from the first `__anext__`, or earlier from `admit()`.
    Made by `Router.stream`, which hands it the router's StreamContext.
    """

    def __init__(self, context: StreamContext, request: GenerateRequest, features: RequestFeatures, *,
                 key: str | None, deadline: float | None) -> None:
        self.request = request
        self.features = features
        self.key = key
        self.deadline = deadline
        self.worker: str | None = None
        self.routed_at: float | None = None       # loop time of the first pick: routing's own time ends here
        self.attempts = 0
        self.migrations = 0
        self._context = context
        self._ticket: Ticket | None = None
        self._gen: AsyncIterator[Chunk] | None = None
        # What the caller has of each sample (delivered.py); with the answer's text where the
        # router tokenizes the next turn's prompt (CacheRouting.answered).
        self._delivered = Delivered(request, keep_text=context.cache is not None and context.cache.wants_answer(request))
        self._closed = False
        self.withdrawals = 0                      # batch attempts withdrawn or paused for interactive work
        self.pauses = 0                           # of those, the ones paused after tokens were delivered
        self._batch = features.service_class == BATCH
        self._reading_task: asyncio.Task | None = None  # the task in a batch attempt's read, while it waits
        self._step_aside_requested = False

    def __repr__(self) -> str:
        return (f"RoutedStream({self.request.request_id!r}, worker={self.worker!r}, attempts={self.attempts}, "
                f"migrations={self.migrations})")

    # --- public -------------------------------------------------------------------------

    async def admit(self) -> None:
        """Pass admission now (idempotent): raises RateLimitedError if the key or class is full.
        Call it before committing to a response (e.g. sending HTTP headers), or let the first
        `__anext__` do it."""
        if self._ticket is not None:
            return
        if self._closed:
            raise RuntimeError("stream is closed")
        try:
            self._ticket = await self._context.admission.admit(
                key=self.key, workload_class=self.features.workload_class,
                tokens=self.features.cost_tokens, timeout=self._remaining(),
            )
        except RateLimitedError as exc:
            self._context.metrics.rejections.labels(exc.reason).inc()
            self._context.metrics.requests.labels(self.features.model or "", "rejected").inc()
            raise

    def __aiter__(self) -> RoutedStream:
        return self

    async def __anext__(self) -> Chunk:
        if self._gen is None:
            if self._closed:
                raise StopAsyncIteration
            self._gen = self._run()
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        """Stop the stream: aborts the worker request and releases the admission slot."""
        self._closed = True
        if self._gen is not None:
            await self._gen.aclose()
        elif self._ticket is not None:
            self._ticket.finish(0)

    async def __aenter__(self) -> RoutedStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- the loop -----------------------------------------------------------------------

    async def _run(self) -> AsyncIterator[Chunk]:
        ctx = self._context
        if ctx.cache is not None:
            # Where the prompt's blocks are held: rendering and tokenizing a chat prompt takes
            # milliseconds, so it runs off the event loop; given token ids are read in place.
            if ctx.cache.needs_tokenizing(self.request):
                self.features = await asyncio.to_thread(ctx.cache.with_cache, self.request, self.features)
            else:
                self.features = ctx.cache.with_cache(self.request, self.features)
        await self.admit()
        self._delivered.start()
        outcome = "error"
        ctx.budget.record_request()
        tried: set[str] = set()
        try:
            while True:
                if self.request.adapter and ctx.adapters is not None:  # a LoRA request: some worker holds it
                    await ctx.adapters.place(self.request.adapter, self.features.model or "", self.features.pool)
                address, lease = await self._pick(tried)
                self.attempts += 1
                self.worker = address
                if self.routed_at is None:
                    self.routed_at = asyncio.get_running_loop().time()
                tried.add(address)
                # The prompt counts as cached there until the attempt's first token, then for the
                # event delay; an attempt that ends before it stored nothing (released below).
                hold = ctx.cache.routed(address, self.features) if ctx.cache is not None else None
                verdict: bool | None = None
                token = id(self)
                if self._batch:
                    self._step_aside_requested = False
                    ctx.batch.started(address, token, self._step_aside)
                try:
                    async with contextlib.aclosing(self._attempt(address, lease, hold)) as chunks:
                        async for chunk in chunks:
                            yield chunk
                    verdict = True
                    break
                except _Withdrawn:
                    # Interactive work needed the slot. Not a failure, not a retry: wait for slack
                    # again; the next attempt resumes after what the caller has (if anything).
                    self.attempts -= 1
                    self.withdrawals += 1
                    tried.discard(address)
                    if stepped_aside(ctx, address, self._delivered, self.request.request_id):
                        self.pauses += 1
                except InvalidRequestError:
                    verdict = True  # the worker did its job: it refused a bad request
                    raise
                except WorkerError as exc:
                    if isinstance(exc, WorkerOverloadedError) and self.request.adapter and ctx.adapters is not None:
                        ctx.adapters.forget(address, self.request.adapter)  # evicted or unloading there
                    verdict = failure_verdict(exc)
                    if self._delivered.answered():
                        # The stream broke after every sample's last chunk: the answer is whole. A
                        # retry would resume nothing (a request with no inputs, refused as invalid).
                        logger.info("worker %s failed after the last chunk: %s", address, exc,
                                    extra={"request_id": self.request.request_id})
                        break
                    check_retry(ctx, exc, address, attempts=self.attempts, delivered=self._delivered,
                                request=self.request)
                    if self._delivered.any:  # the attempt that follows is a migration
                        self.migrations += 1
                finally:
                    lease.release()
                    if hold is not None:
                        hold.release()
                    ctx.pool.report(address, verdict, credited=lease.credited)
                    if self._batch:
                        ctx.batch.ended(address, token)
            outcome = "ok"
            if self._delivered.keep_text and ctx.cache is not None:
                ctx.cache.answered(self.request, self.features, self._delivered.answer_text())
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        finally:
            if self.features.prompt_ids is not None:  # the ids are kept only while the request is in flight
                self.features = dataclasses.replace(self.features, prompt_ids=None)
            used = self._delivered.used_tokens(self.features.prompt_tokens)
            if self._ticket is not None:
                self._ticket.finish(used)
            ctx.metrics.requests.labels(self.features.model or "", outcome).inc()

    async def _pick(self, tried: set[str]) -> tuple[str, Lease]:
        """The worker for the next attempt and its lease (pick.py): batch waits for slack, and
        other work for a half-open breaker's probe rather than failing at once."""
        ctx = self._context
        if self._batch:
            return await pick_batch(ctx, self.request, self.features, tried, self._remaining_cost, self._waited)
        return await pick_or_await_probe(ctx, self.request, self.features, tried, self._remaining_cost)

    def _waited(self, seconds: float) -> None:
        """A batch request waited `seconds` for slack: the deadline bounds its work, not its queue."""
        if self.deadline is not None:
            self.deadline += seconds

    def _batch_share(self, address: str) -> int:
        view = self._context.pool.snapshot().get(address)
        return batch_share(view, self._context.config.classes) if view is not None else 0

    def _step_aside(self) -> None:
        """Called by the batch gate (classes/batch_gate.py) for interactive work: end this batch attempt. A
        read in progress is cancelled (the cancellation lands in `_next_chunk`); otherwise the
        caller holds a chunk, and the next read ends the attempt without waiting."""
        if not self._step_aside_requested:
            self._step_aside_requested = True
            if self._reading_task is not None:
                self._reading_task.cancel()

    async def _attempt(self, address: str, lease: Lease, hold: RoutedHold | None) -> AsyncIterator[Chunk]:
        """Stream one attempt's chunks, mapped to the caller's (index, sample). `hold`: the
        prompt's speculative cache entries on `address`, whose ttl starts at the first token."""
        ctx = self._context
        request, mapping = self._attempt_request()
        if mapping is None and ctx.cache is not None:  # the prompt's ids, where this worker takes them
            request = ctx.cache.attempt_request(address, request, self.features)
        if self._batch:
            view = ctx.pool.snapshot().get(address)
            if view is not None and view.schedules_by_priority:  # KV pressure preempts batch first
                request = dataclasses.replace(request, priority=request.priority + ctx.config.classes.batch_priority)
        timeout = self._remaining()
        if self._deadline_passed():
            raise DeadlineExceededError(f"request {self.request.request_id}: deadline passed", worker=address)
        client = ctx.connect(address)
        watchdog = StallWatchdog(lambda limit: ctx.pool.progressing(address, limit))
        first = True
        gate = ctx.batch
        steer = not self._batch and gate.listening  # interactive latency steers batch (classes/batch_gate.py)
        loop = asyncio.get_running_loop()
        last_at = loop.time()
        try:
            async with contextlib.aclosing(client.generate(request, timeout=timeout)) as chunks:
                iterator = chunks.__aiter__()
                while True:
                    limit = ctx.config.first_chunk_timeout_s if first else ctx.config.stall_timeout_s
                    chunk = await self._next_chunk(iterator, watchdog, limit, address, first)
                    if chunk is None:
                        break
                    if steer and chunk.token_ids:
                        now = loop.time()
                        gap = now - last_at
                        last_at = now
                        gate.observe(address, ttft_s=gap if first else None,
                                     itl_s=None if first else gap / len(chunk.token_ids),
                                     share=lambda: self._batch_share(address))
                    if first:
                        first = False
                        if hold is not None:
                            hold.first_token()
                        if self._batch:  # from here on it can only pause, and only if it can resume
                            ctx.batch.first_token(
                                address, id(self), pause=None if self.request.constrained else self._step_aside)
                        lease.progress(max(0, self.features.prompt_tokens - self.features.cached_tokens.get(address, 0)))
                    lease.progress(len(chunk.token_ids))
                    yield self._accept(chunk, mapping)
        finally:
            watchdog.stop()
        unfinished = self._delivered.unfinished()
        if unfinished:
            raise WorkerError(f"worker {address} ended the stream with {unfinished} sample(s) unfinished",
                              worker=address)

    async def _next_chunk(self, iterator: AsyncIterator[Chunk], watchdog: StallWatchdog, limit: float,
                          address: str, first: bool) -> Chunk | None:
        if self._step_aside_requested and not self._delivered.answered():  # asked while the caller held a chunk
            raise _Withdrawn()
        watchdog.reading(limit)
        if self._batch:
            self._reading_task = asyncio.current_task()
        try:
            return await iterator.__anext__()
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if watchdog.fired and task is not None and task.uncancel() == 0:
                what = "no first chunk" if first else "stream stalled: no chunk"
                raise WorkerTimeoutError(f"worker {address}: {what} for {watchdog.waited:.1f}s",
                                         worker=address) from None
            if self._step_aside_requested and task is not None and task.uncancel() == 0:
                if self._delivered.answered():  # every last chunk is delivered: nothing to resume
                    return None
                raise _Withdrawn() from None
            raise
        except WorkerTimeoutError as exc:  # the gRPC deadline (the caller's) or the worker's own
            if self._deadline_passed():
                raise DeadlineExceededError(str(exc), worker=address) from None
            raise
        finally:
            self._reading_task = None
            watchdog.done_reading()

    def _attempt_request(self) -> tuple[GenerateRequest, list[tuple[int, int]] | None]:
        """The request to send now, and how its (index) maps back to the caller's (index, sample)
        (None: unchanged). Nothing delivered yet → the original request as is."""
        return self._delivered.resume(attempt_id(self.request.request_id, self.attempts, self.withdrawals))

    def _accept(self, chunk: Chunk, mapping: list[tuple[int, int]] | None) -> Chunk:
        chunk = self._delivered.accept(chunk, mapping)
        if chunk.finish_reason is not None and chunk.usage is not None:
            expected = self.features.prompt_ids_len
            if expected and chunk.index == 0 and chunk.usage.prompt_tokens != expected:
                # The router's tokenization differs from what the engine ran: its cache
                # lookups for such prompts are off (docs: routing).
                self._context.metrics.prompt_ids_mismatches.inc()
                logger.info("router tokenized %d prompt tokens, the worker ran %d", expected,
                            chunk.usage.prompt_tokens, extra={"request_id": self.request.request_id})
        return chunk

    # --- helpers ------------------------------------------------------------------------

    def _remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return self.deadline - asyncio.get_running_loop().time()

    def _deadline_passed(self) -> bool:
        # gRPC may report the deadline a hair before the loop clock reaches it.
        remaining = self._remaining()
        return remaining is not None and remaining <= DEADLINE_SLACK_S

    def _remaining_cost(self, address: str) -> int:
        """Tokens this attempt will cost `address`: what is not delivered yet, less the prompt
        tokens its prefix cache holds (cache_aware knows them), which it will not prefill."""
        delivered = self._delivered.tokens()
        cached = 0 if delivered else self.features.cached_tokens.get(address, 0)
        return max(0, self.features.cost_tokens - delivered - cached)
