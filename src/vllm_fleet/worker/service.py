"""The gRPC service `vllm_fleet.v1.Worker` around one engine.

Generate: validate → tokenize each input → one engine request per input (id
`<request_id>-<index>`) → merge their deltas through the coalescer → stream chunks. When the
call ends early (client gone, deadline, Abort), every engine request still running is aborted.
GenerateMany does the same for many requests over one call, batching their chunks (mux.py).
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
from vllm_fleet.protocol.types import Chunk, GenerateRequest, SamplingParams, Usage, WorkerInfo
from vllm_fleet.worker.coalescer import Coalescer
from vllm_fleet.worker.engine import Engine, SampleDelta
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.mux import MuxOutbox
from vllm_fleet.worker.resume import HeldTokens, held_tail_length
from vllm_fleet.worker.validation import Limits, check_prompt_fits, validate_request

logger = logging.getLogger(__name__)

_TOKEN_REPORT_S = 0.5  # how often a stream adds its streamed tokens to the output-token counter

_DONE = object()       # an input's engine stream ended
_ABORTED = object()    # an input's engine stream was aborted


class RequestFailed(Exception):
    """A request ends with this gRPC status: Generate aborts its call with it, GenerateMany
    reports it in the request's last event."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
        request = request_from_pb(request_pb)
        request_id = request.request_id or uuid.uuid4().hex
        token = request_id_var.set(request_id)
        try:
            async for chunk in self._run(request_id, request):
                yield chunk_to_pb(chunk)
        except RequestFailed as failed:
            await context.abort(failed.code, failed.message)
        finally:
            request_id_var.reset(token)

    async def GenerateMany(self, requests: AsyncIterator[pb.MuxRequest],
                           context: grpc.aio.ServicerContext) -> AsyncIterator[pb.MuxResponse]:
        """Requests of one client over one call; every chunk that is ready goes in one message."""
        outbox = MuxOutbox()
        running: dict[int, asyncio.Task] = {}

        async def read() -> None:
            try:
                async for message in requests:
                    kind = message.WhichOneof("kind")
                    if kind == "start":
                        if message.stream in running:
                            outbox.end(message.stream, grpc.StatusCode.ALREADY_EXISTS.value[0],
                                       f"stream {message.stream} is already open on this call")
                            continue
                        task = asyncio.create_task(self._run_muxed(message.stream, message.start, outbox))
                        running[message.stream] = task
                        task.add_done_callback(lambda _, stream=message.stream: running.pop(stream, None))
                    elif kind == "cancel":
                        task = running.get(message.stream)
                        if task is not None:
                            task.cancel()
            finally:
                # The client half-closed (or went away): the call ends once its requests have.
                if running:
                    await asyncio.gather(*running.values(), return_exceptions=True)
                outbox.close()

        reader = asyncio.create_task(read())
        try:
            while (events := await outbox.take()) is not None:
                yield pb.MuxResponse(events=events)
        finally:
            reader.cancel()
            for task in list(running.values()):
                task.cancel()
            await asyncio.gather(reader, *running.values(), return_exceptions=True)

    async def _run_muxed(self, stream: int, request_pb: pb.GenerateRequest, outbox: MuxOutbox) -> None:
        request = request_from_pb(request_pb)
        request_id = request.request_id or uuid.uuid4().hex
        request_id_var.set(request_id)  # this task's own context
        try:
            async for chunk in self._run(request_id, request):
                outbox.add_chunk(stream, chunk)
            outbox.end(stream)
        except RequestFailed as failed:
            outbox.end(stream, failed.code.value[0], failed.message)
        except asyncio.CancelledError:
            return  # the client cancelled it (or the call ended): it no longer listens
        except Exception as exc:
            logger.exception("request failed")
            outbox.end(stream, grpc.StatusCode.INTERNAL.value[0], f"the worker failed this request: {exc}")

    async def _run(self, request_id: str, request: GenerateRequest) -> AsyncIterator[Chunk]:
        """Admit, validate and stream one request; a refusal or failure raises RequestFailed."""
        if self.draining:
            raise RequestFailed(grpc.StatusCode.UNAVAILABLE, "worker is draining; send the request to another worker")
        if not self.engine.healthy:
            raise RequestFailed(grpc.StatusCode.UNAVAILABLE, "the engine is not running; try another worker")
        if request_id in self.active:
            raise RequestFailed(grpc.StatusCode.ALREADY_EXISTS, f"request {request_id} is already running on this worker")
        try:
            validate_request(request, self.limits)
            prepared = [await self._prepare(i, request) for i in range(len(request.inputs))]
        except InvalidRequestError as exc:
            self.metrics.requests.labels("invalid").inc()
            logger.info("rejected: %s", exc)
            raise RequestFailed(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        async for chunk in self._stream(request_id, request, prepared):
            yield chunk

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

    async def _stream(self, request_id: str, request: GenerateRequest,
                      prepared: list[_Prepared]) -> AsyncIterator[Chunk]:
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
                            yield chunk
                        continue
                if payload is _DONE:
                    open_inputs -= 1
                    continue
                if payload is _ABORTED:
                    open_inputs -= 1
                    for sample in range(n):
                        if (index, sample) not in finished:
                            finished.add((index, sample))
                            yield Chunk(index=index, sample=sample, text="", token_ids=[], finish_reason="abort")
                    continue
                if isinstance(payload, BaseException):
                    raise self._failure(payload)
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
                        yield chunk
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

    def _failure(self, exc: BaseException) -> RequestFailed:
        if not self.engine.healthy:
            logger.error("engine died during a request: %s", exc)
            return RequestFailed(grpc.StatusCode.UNAVAILABLE, f"the engine died: {exc}")
        if isinstance(exc, (ValueError, TypeError, InvalidRequestError)):
            return RequestFailed(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        logger.exception("engine failed a request", exc_info=exc)
        return RequestFailed(grpc.StatusCode.INTERNAL, f"the engine failed this request: {exc}")

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
