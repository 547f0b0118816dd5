"""Rows → answers through the routing core, with row-level retries that never raise.

The Router already fails over and migrates within one request (`RouterConfig.max_attempts`).
On top of that a row is sent again (`row_attempts`, with backoff) when the router gives up
for a reason whose type says a resend is safe (`FleetError.resend_safe`) — no worker right now, the retry budget ran out, a worker restarted —
so a short outage costs latency, not rows. Whatever still fails becomes the row's `error`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from vllm_fleet.errors import DuplicateRequestError, FleetError, InvalidRequestError
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol.types import GenerateInput
from vllm_fleet.router import RoutedStream, Router
from vllm_fleet.spark.config import SparkGenerateConfig
from vllm_fleet.spark.rows import RowResult

logger = logging.getLogger(__name__)

class Answerer:
    """Sends one row (or one micro-batch of rows) and turns the outcome into RowResults."""

    def __init__(self, router: Router, config: SparkGenerateConfig,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.router = router
        self.config = config
        self.params = config.sampling_params()
        self._sleep = sleep

    async def answer(self, item: GenerateInput, request_id: str, *, session_id: str = "") -> RowResult:
        """One row as its own request. Never raises for the row's own failures."""
        results = await self._send([item], request_id, session_id=session_id)
        return results[0]

    async def answer_batch(self, items: list[GenerateInput], request_id: str, row_ids: list[str]) -> list[RowResult]:
        """Several rows as one request. A bad row makes the worker refuse the whole request, so
        an invalid request is split into single rows: each bad row gets its own error."""
        results = await self._send(items, request_id, split_invalid=True)
        if results is not None:
            return results
        return list(await asyncio.gather(*(self.answer(i, r) for i, r in zip(items, row_ids))))

    async def _send(self, items: list[GenerateInput], request_id: str, *, session_id: str = "",
                    split_invalid: bool = False) -> list[RowResult] | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_s
        attempts, worker, backoff = 0, None, self.config.retry_backoff_s
        error: FleetError | None = None
        resends = 0  # a new id per resend, except after a duplicate: the copy must wait, not run
        for round_ in range(self.config.row_attempts):
            rid = request_id if resends == 0 else f"{request_id}-r{resends}"
            # The body the gateway would send for these parameters: the worker reads no other form.
            request = build_request(rid, items, self.params, session_id=session_id,
                                    service_class=self.config.service_class,
                                    stream_interval_ms=self.config.stream_interval_ms)
            stream: RoutedStream | None = None
            try:
                stream = self.router.stream(request, model=self.config.model, deadline=deadline)
                results = await _collect(stream, len(items))
                for result in results:
                    result.attempts, result.worker = attempts + stream.attempts, stream.worker
                return results
            except DuplicateRequestError as exc:
                # The worker still runs this id: a retried Spark task met its own first attempt.
                # Wait for that one to end, then send the same id again (rows.py derives ids).
                error = exc
            except InvalidRequestError as exc:
                if split_invalid and len(items) > 1:
                    return None
                return [RowResult.failed(f"invalid request: {exc}", attempts=attempts + _tries(stream),
                                         worker=stream.worker if stream else None)]
            except FleetError as exc:
                # Whether the whole request may be sent again is the error's type's (errors.py):
                # not after the caller's deadline passed; yes after a constrained answer lost its
                # worker midway (the row's text reached no one: a resend starts a fresh grammar).
                error = exc
                if not exc.resend_safe:
                    break
            if not isinstance(error, DuplicateRequestError):
                resends += 1
            attempts += _tries(stream)
            worker = (stream.worker if stream else None) or worker
            logger.warning("row request failed (%s); %d of %d", error, round_ + 1, self.config.row_attempts,
                           extra={"request_id": rid})
            if loop.time() + backoff >= deadline or round_ + 1 == self.config.row_attempts:
                break
            await self._sleep(backoff)
            backoff *= 2
        message = f"{type(error).__name__}: {error}"
        return [RowResult.failed(message, attempts=max(attempts, 1), worker=worker) for _ in items]


def _tries(stream: RoutedStream | None) -> int:
    return stream.attempts if stream is not None else 0


async def _collect(stream: RoutedStream, count: int) -> list[RowResult]:
    """Each input's text, finish reason and usage from the stream (sample 0: n is always 1)."""
    texts: list[list[str]] = [[] for _ in range(count)]
    results = [RowResult() for _ in range(count)]
    try:
        async for chunk in stream:
            texts[chunk.index].append(chunk.text)
            if chunk.finish_reason is not None:
                result = results[chunk.index]
                result.finish_reason = chunk.finish_reason
                if chunk.usage is not None:
                    result.prompt_tokens = chunk.usage.prompt_tokens
                    result.completion_tokens = chunk.usage.completion_tokens
    finally:
        await stream.aclose()
    for result, parts in zip(results, texts):
        result.output = "".join(parts)
    return results
