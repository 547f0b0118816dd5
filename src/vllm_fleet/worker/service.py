"""The gRPC service `vllm_fleet.v1.Worker` around one engine.

Generate: validate → tokenize each input → one engine request per input (id
`<request_id>-<index>`) → merge their deltas through the coalescer → stream chunks. When the
call ends early (client gone, deadline, Abort), every engine request still running is aborted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from vllm_fleet import __version__
from vllm_fleet.config import WorkerConfig
from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.logs import request_id_var
from vllm_fleet.protocol import worker_pb2 as pb, worker_pb2_grpc
from vllm_fleet.protocol.convert import chunk_to_pb, info_to_pb, load_to_pb, request_from_pb
from vllm_fleet.protocol.types import GenerateRequest, SamplingParams, Usage, WorkerInfo
from vllm_fleet.worker.coalescer import Coalescer
from vllm_fleet.worker.engine import Engine, SampleDelta
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.resume import HeldTokens, held_tail_length
from vllm_fleet.worker.validation import Limits, check_prompt_fits, validate_request

logger = logging.getLogger(__name__)

_TOKEN_REPORT_S = 0.5  # how often a stream adds its streamed tokens to the output-token counter

_DONE = object()       # an input's engine stream ended
_ABORTED = object()    # an input's engine stream was aborted


@dataclass
class _Prepared:
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt_len: int
    exhausted: bool = False  # resumed with no tokens left to generate
    held: HeldTokens | None = None  # resumed mid-character: tokens to regenerate silently


@dataclass
class _Active:
    tasks: list[asyncio.Task] = field(default_factory=list)
    engine_ids: list[str] = field(default_factory=list)
    aborted: bool = False


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(self, engine: Engine, config: WorkerConfig, metrics: WorkerMetrics) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.limits = Limits(max_n=config.max_n, max_inputs=config.max_inputs, max_logprobs=config.max_logprobs)
        self.draining = False
        self.active: dict[str, _Active] = {}
        self.idle = asyncio.Event()
        self.idle.set()

    # ------------------------------------------------------------------------------- Generate

    async def Generate(self, request_pb: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateChunk]:
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "worker is draining; send the request to another worker")
        if not self.engine.healthy:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the engine is not running; try another worker")
        request = request_from_pb(request_pb)
        request_id = request.request_id or uuid.uuid4().hex
        if request_id in self.active:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"request {request_id} is already running on this worker")
        token = request_id_var.set(request_id)
        try:
            try:
                validate_request(request, self.limits)
                prepared = [await self._prepare(i, request) for i in range(len(request.inputs))]
            except InvalidRequestError as exc:
                self.metrics.requests.labels("invalid").inc()
                logger.info("rejected: %s", exc)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            async for message in self._stream(request_id, request, prepared, context):
                yield message
        finally:
            request_id_var.reset(token)

    async def _prepare(self, index: int, request: GenerateRequest) -> _Prepared:
        item = request.inputs[index]
        prompt_ids = await self.engine.tokenize(item)
        if not prompt_ids:
            raise InvalidRequestError(f"input {index}: the prompt tokenizes to nothing", param="prompt")
        params = request.params
        resume = item.resume_token_ids
        check_prompt_fits(index, len(prompt_ids), len(resume), params.max_tokens, self.engine.max_model_len,
                          self.engine.vocab_size, prompt_ids + resume if item.token_ids is not None or resume else [])
        exhausted = False
        held = None
        if resume:
            held_count = held_tail_length(self.engine.decode, resume)
            if held_count:
                held = HeldTokens(resume[-held_count:])
                resume = resume[:-held_count]
            # The tokens already sent count against the budget; the rest is generated here.
            updates = {}
            if params.max_tokens is not None:
                updates["max_tokens"] = params.max_tokens - len(resume)
                exhausted = updates["max_tokens"] < 1
            if params.min_tokens:
                updates["min_tokens"] = max(0, params.min_tokens - len(resume))
            params = dataclasses.replace(params, **updates)
        return _Prepared(prompt_token_ids=prompt_ids + list(resume), params=params,
                         prompt_len=len(prompt_ids), exhausted=exhausted, held=held)

    async def _stream(self, request_id: str, request: GenerateRequest, prepared: list[_Prepared],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateChunk]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        interval_ms = request.stream_interval_ms or self.config.default_stream_interval_ms
        coalescer = Coalescer(interval_ms / 1000)
        queue: asyncio.Queue = asyncio.Queue()
        active = self.active[request_id] = _Active()
        self.idle.clear()
        self.metrics.in_flight.inc()
        n = request.params.n or 1
        generated: dict[tuple[int, int], int] = {}
        finished: set[tuple[int, int]] = set()
        first_token_at: float | None = None
        last_chunk_at = reported_at = started
        unreported_tokens = 0
        outcome = "error"
        try:
            open_inputs = 0
            for index, item in enumerate(prepared):
                self.metrics.prompt_tokens.inc(item.prompt_len)
                if item.exhausted:
                    queue.put_nowait((index, [SampleDelta(0, "", [], finish_reason="length")]))
                    queue.put_nowait((index, _DONE))
                else:
                    engine_id = f"{request_id}-{index}"
                    active.engine_ids.append(engine_id)
                    active.tasks.append(asyncio.create_task(self._pump(index, engine_id, item, request, queue)))
                open_inputs += 1
            while open_inputs:
                deadline = coalescer.next_deadline()
                if deadline is None:
                    index, payload = await queue.get()
                else:
                    try:
                        index, payload = await asyncio.wait_for(queue.get(), max(0.0, deadline - loop.time()))
                    except TimeoutError:
                        for chunk in coalescer.due(loop.time()):
                            yield chunk_to_pb(chunk)
                        continue
                if payload is _DONE:
                    open_inputs -= 1
                    continue
                if payload is _ABORTED:
                    open_inputs -= 1
                    for sample in range(n):
                        if (index, sample) not in finished:
                            finished.add((index, sample))
                            yield pb.GenerateChunk(index=index, sample=sample, finish_reason="abort")
                    continue
                if isinstance(payload, BaseException):
                    await self._abort_with(context, payload)
                now = loop.time()
                held = prepared[index].held
                for delta in payload:
                    if held is not None:
                        delta = held.strip(delta)
                    key = (index, delta.sample)
                    if delta.token_ids:
                        if first_token_at is None:
                            first_token_at = now
                            self.metrics.ttft.observe(now - started)
                        generated[key] = generated.get(key, 0) + len(delta.token_ids)
                        unreported_tokens += len(delta.token_ids)
                    usage = None
                    if delta.finish_reason is not None:
                        finished.add(key)
                        usage = Usage(prepared[index].prompt_len, generated.get(key, 0), delta.cached_tokens)
                    chunk = coalescer.add(index, delta, now, usage)
                    if chunk is not None:
                        if chunk.token_ids and first_token_at is not None and now > first_token_at:
                            self.metrics.itl.observe((now - last_chunk_at) / len(chunk.token_ids))
                        last_chunk_at = now
                        yield chunk_to_pb(chunk)
                if now - reported_at >= _TOKEN_REPORT_S:
                    # Prometheus counters take a lock per call: add the step's tokens at most
                    # this often per stream, not once per token.
                    self.metrics.output_tokens.inc(unreported_tokens)
                    unreported_tokens, reported_at = 0, now
            outcome = "aborted" if active.aborted else "ok"
        except (asyncio.CancelledError, GeneratorExit):
            # A client that goes away closes this generator (GeneratorExit) or cancels the call.
            outcome = "cancelled"
            raise
        finally:
            if unreported_tokens:
                self.metrics.output_tokens.inc(unreported_tokens)
            self.metrics.requests.labels(outcome).inc()
            self.metrics.e2e.observe(loop.time() - started)
            self.metrics.in_flight.dec()
            await self._finish(request_id, active, all_done=(outcome == "ok"))

    async def _pump(self, index: int, engine_id: str, item: _Prepared, request: GenerateRequest,
                    queue: asyncio.Queue) -> None:
        try:
            async for deltas in self.engine.generate(engine_id, item.prompt_token_ids, item.params,
                                                     priority=request.priority):
                queue.put_nowait((index, deltas))
            queue.put_nowait((index, _DONE))
        except asyncio.CancelledError:
            queue.put_nowait((index, _ABORTED))
            raise
        except Exception as exc:  # handed to the stream, which maps it to a status
            queue.put_nowait((index, exc))

    async def _abort_with(self, context: grpc.aio.ServicerContext, exc: BaseException) -> None:
        if not self.engine.healthy:
            logger.error("engine died during a request: %s", exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the engine died: {exc}")
        if isinstance(exc, (ValueError, TypeError, InvalidRequestError)):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        logger.exception("engine failed a request", exc_info=exc)
        await context.abort(grpc.StatusCode.INTERNAL, f"the engine failed this request: {exc}")

    async def _finish(self, request_id: str, active: _Active, *, all_done: bool) -> None:
        for task in active.tasks:
            task.cancel()
        if active.tasks:
            await asyncio.gather(*active.tasks, return_exceptions=True)
        if not all_done and active.engine_ids:
            try:
                await self.engine.abort(active.engine_ids)
            except Exception:
                logger.warning("abort of %s failed", active.engine_ids, exc_info=True)
        self.active.pop(request_id, None)
        if not self.active:
            self.idle.set()

    # ------------------------------------------------------------------------------- the rest

    async def Abort(self, request: pb.AbortRequest, context: grpc.aio.ServicerContext) -> pb.AbortResponse:
        active = self.active.get(request.request_id)
        if active is None:
            return pb.AbortResponse(found=False)
        active.aborted = True
        for task in active.tasks:
            task.cancel()
        return pb.AbortResponse(found=True)

    def worker_info(self) -> WorkerInfo:
        info = self.engine.info()
        info.version = __version__
        info.device = self.config.device
        info.worker_id = self.config.worker_id or f"{self.config.host}:{self.config.port}"
        return info

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.WorkerInfo:
        return info_to_pb(self.worker_info())

    async def Load(self, request: pb.LoadRequest, context: grpc.aio.ServicerContext) -> pb.WorkerLoad:
        load = self.engine.load()
        load.in_flight = len(self.active)
        load.draining = self.draining
        return load_to_pb(load)
