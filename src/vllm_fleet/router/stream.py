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
Concerns that act around an attempt (cache holds, the batch gate, adapter placement) are the
context's `hooks` (attempt_hooks.py): the loop calls them at each point and knows none by name.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from vllm_fleet.router.attempt_hooks import Attempt, AttemptHooks
from vllm_fleet.router.cache.match import CacheMatch
from vllm_fleet.router.quota.admission import Ticket
from vllm_fleet.router.classes.service_class import BATCH
from vllm_fleet.router.context import StreamContext
from vllm_fleet.router.delivered import Delivered
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.pick import pick_batch, pick_or_await_probe
from vllm_fleet.router.retry import attempt_id, check_retry, failure_verdict, stepped_aside
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
        # What the router's cache index answered for the prompt (cache/match.py): the cache hook's
        # `prepare` sets it; None (nothing known) under other policies
        self.cache: CacheMatch | None = None
        self.key = key
        self.deadline = deadline
        self.worker: str | None = None
        self.routed_at: float | None = None       # loop time of the first pick: routing's own time ends here
        self.attempts = 0
        self.migrations = 0
        self._context = context
        self._ticket: Ticket | None = None
        self._gen: AsyncIterator[Chunk] | None = None
        # What the caller has of each sample (delivered.py); a hook's `prepare` may ask it to keep
        # the answer's text (the cache hook, for the next turn's prompt).
        self.delivered = Delivered(request)
        self._hooks: list[tuple[AttemptHooks, object]] = []  # each hook with this request's handle
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
        await self._prepare()
        await self.admit()
        self.delivered.start()
        outcome = "error"
        ctx.budget.record_request()
        tried: set[str] = set()
        try:
            while True:
                for hook, handle in self._hooks:
                    await hook.picking(handle)
                attempt = await self._start_attempt(tried)
                verdict: bool | None = None
                error: BaseException | None = None
                try:
                    async with contextlib.aclosing(self._attempt(attempt)) as chunks:
                        async for chunk in chunks:
                            yield chunk
                    verdict = True
                    break
                except _Withdrawn as exc:
                    error = exc
                    self._withdrawn(attempt.address, tried)
                except InvalidRequestError as exc:
                    error, verdict = exc, True  # the worker did its job: it refused a bad request
                    raise
                except WorkerError as exc:
                    error, verdict = exc, failure_verdict(exc)
                    if self._answered_despite(attempt.address, exc):
                        break
                finally:
                    self._end_attempt(attempt, verdict, error)
            outcome = "ok"
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "cancelled"
            raise
        finally:
            for hook, handle in self._hooks:
                hook.ended(handle, outcome)
            used = self.delivered.used_tokens(self.features.prompt_tokens)
            if self._ticket is not None:
                self._ticket.finish(used)
            ctx.metrics.requests.labels(self.features.model or "", outcome).inc()

    async def _prepare(self) -> None:
        """Each hook's handle for this request (attempt_hooks.py); they may refine the features."""
        for hook in self._context.hooks:
            handle = await hook.prepare(self)
            if handle is not None:
                self._hooks.append((hook, handle))

    async def _start_attempt(self, tried: set[str]) -> Attempt:
        """Pick the next attempt's worker and tell the hooks where it goes (they may change the
        request it is sent)."""
        address, lease = await self._pick(tried)
        self.attempts += 1
        self.worker = address
        if self.routed_at is None:
            self.routed_at = asyncio.get_running_loop().time()
        tried.add(address)
        self._step_aside_requested = False
        request, mapping = self._attempt_request()
        attempt = Attempt(address, lease, request, mapping)
        for hook, handle in self._hooks:
            hook.routed(handle, attempt)
        return attempt

    def _withdrawn(self, address: str, tried: set[str]) -> None:
        """Interactive work needed the slot. Not a failure, not a retry: wait for slack again; the
        next attempt resumes after what the caller has (if anything)."""
        self.attempts -= 1
        self.withdrawals += 1
        tried.discard(address)
        if stepped_aside(self._context, address, self.delivered, self.request.request_id):
            self.pauses += 1

    def _answered_despite(self, address: str, exc: WorkerError) -> bool:
        """After a failed attempt: True if the answer is whole anyway; else raises if no retry
        follows (retry.py), and counts a migration if the next attempt is one."""
        if self.delivered.answered():
            # The stream broke after every sample's last chunk: the answer is whole. A retry
            # would resume nothing (a request with no inputs, refused as invalid).
            logger.info("worker %s failed after the last chunk: %s", address, exc,
                        extra={"request_id": self.request.request_id})
            return True
        check_retry(self._context, exc, address, attempts=self.attempts, delivered=self.delivered,
                    request=self.request)
        if self.delivered.any:  # the attempt that follows is a migration
            self.migrations += 1
        return False

    def _end_attempt(self, attempt: Attempt, verdict: bool | None, error: BaseException | None) -> None:
        attempt.lease.release()
        self._context.pool.report(attempt.address, verdict, credited=attempt.lease.credited)
        for hook, handle in self._hooks:
            hook.attempt_ended(handle, attempt, error)

    async def _pick(self, tried: set[str]) -> tuple[str, Lease]:
        """The worker for the next attempt and its lease (pick.py): batch waits for slack, and
        other work for a half-open breaker's probe rather than failing at once."""
        ctx = self._context
        if self._batch:
            return await pick_batch(ctx, self.request, self.features, tried, self._remaining_cost, self._waited,
                                    cache=self.cache)
        return await pick_or_await_probe(ctx, self.request, self.features, tried, self._remaining_cost,
                                         cache=self.cache)

    def _waited(self, seconds: float) -> None:
        """A batch request waited `seconds` for slack: the deadline bounds its work, not its queue."""
        if self.deadline is not None:
            self.deadline += seconds

    def step_aside(self) -> None:
        """Called by the batch gate (classes/batch_hook.py) for interactive work: end this batch attempt. A
        read in progress is cancelled (the cancellation lands in `_next_chunk`); otherwise the
        caller holds a chunk, and the next read ends the attempt without waiting."""
        if not self._step_aside_requested:
            self._step_aside_requested = True
            if self._reading_task is not None:
                self._reading_task.cancel()

    async def _attempt(self, attempt: Attempt) -> AsyncIterator[Chunk]:
        """Stream one attempt's chunks, mapped to the caller's (index, sample)."""
        ctx = self._context
        address = attempt.address
        timeout = self._remaining()
        if self._deadline_passed():
            raise DeadlineExceededError(f"request {self.request.request_id}: deadline passed", worker=address)
        client = ctx.connect(address)
        watchdog = StallWatchdog(lambda limit: ctx.pool.progressing(address, limit))
        first = True
        try:
            async with contextlib.aclosing(client.generate(attempt.request, timeout=timeout)) as chunks:
                iterator = chunks.__aiter__()
                while True:
                    limit = ctx.config.first_chunk_timeout_s if first else ctx.config.stall_timeout_s
                    chunk = await self._next_chunk(iterator, watchdog, limit, address, first)
                    if chunk is None:
                        break
                    chunk = self._accept(attempt, chunk, first)
                    first = False
                    yield chunk
        finally:
            watchdog.stop()
        unfinished = self.delivered.unfinished()
        if unfinished:
            raise WorkerError(f"worker {address} ended the stream with {unfinished} sample(s) unfinished",
                              worker=address)

    async def _next_chunk(self, iterator: AsyncIterator[Chunk], watchdog: StallWatchdog, limit: float,
                          address: str, first: bool) -> Chunk | None:
        if self._step_aside_requested and not self.delivered.answered():  # asked while the caller held a chunk
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
                if self.delivered.answered():  # every last chunk is delivered: nothing to resume
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
        return self.delivered.resume(attempt_id(self.request.request_id, self.attempts, self.withdrawals))

    def _accept(self, attempt: Attempt, chunk: Chunk, first: bool) -> Chunk:
        """`chunk` as the caller gets it (delivered.py), counted on the lease and shown to the hooks."""
        lease = attempt.lease
        if first:
            for hook, handle in self._hooks:
                hook.first_token(handle, attempt)
            lease.progress(max(0, self.features.prompt_tokens - self._cached(attempt.address)))
        lease.progress(len(chunk.token_ids))
        chunk = self.delivered.accept(chunk, attempt.mapping)
        for hook, handle in self._hooks:
            hook.chunk(handle, attempt, chunk, first)
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
        delivered = self.delivered.tokens()
        cached = 0 if delivered else self._cached(address)
        return max(0, self.features.cost_tokens - delivered - cached)

    def _cached(self, address: str) -> int:
        """Leading prompt tokens `address` holds in its KV cache, per the cache index (0: unknown)."""
        return 0 if self.cache is None else self.cache.held(address)
