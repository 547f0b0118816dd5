"""The gRPC service `vllm_fleet.v1.Worker` around one engine.

Generate: admit → validate → prepare each input (prepare.py) → one engine request per input
(id `<request_id>-<index>`), each pumped by its own task into one queue of typed events →
a RequestStream turns the events into chunks (request_stream.py). When the call ends early
(client gone, deadline, Abort), every engine request still running is aborted. GenerateMany
does the same for many requests over one call, batching their chunks (mux.py). Whatever a
request fails with becomes its gRPC status in one place (status.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from vllm_fleet import __version__
from vllm_fleet.config import EngineConfig, WorkerConfig
from vllm_fleet.errors import (
    ConfigError,
    DuplicateRequestError,
    FleetError,
    IntrospectUnsupportedError,
    InvalidRequestError,
    TokenizerFilesError,
    WorkerUnavailableError,
)
from vllm_fleet.logs import request_id_var
from vllm_fleet.protocol import PARAM_METADATA_KEY, worker_pb2 as pb, worker_pb2_grpc
from vllm_fleet.protocol.convert import adapters_to_pb, chunk_to_pb, info_to_pb, load_to_pb, request_from_pb
from vllm_fleet.protocol.kv_events import batch_to_pb
from vllm_fleet.protocol.pooling import PoolRequest
from vllm_fleet.protocol.types import Chunk, GenerateRequest, WorkerInfo, WorkerLoad
from vllm_fleet.worker.adapters import AdapterRegistry, HeldAdapter
from vllm_fleet.worker.engines.base import Engine, SampleDelta
from vllm_fleet.worker.watch.engine_watch import EngineWatch, StallBounds
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.latency_window import LatencyWindow
from vllm_fleet.worker.mux import MuxCall, MuxOutbox
from vllm_fleet.worker.prepare import PreparedInput, prepare_input
from vllm_fleet.worker.request_stream import Deltas, Ended, Failed, RequestStream, StreamEvent
from vllm_fleet.worker.status import RequestStatus, status_for
from vllm_fleet.worker.tokenizer_files import read_tokenizer_files
from vllm_fleet.worker.validation import Limits, validate_request

logger = logging.getLogger(__name__)


@dataclass
class _Active:
    tasks: list[asyncio.Task] = field(default_factory=list)
    engine_ids: list[str] = field(default_factory=list)
    aborted: bool = False
    events: asyncio.Queue[StreamEvent] | None = None  # where fail_all() delivers its error


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(self, engine: Engine, config: WorkerConfig, metrics: WorkerMetrics) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.limits = Limits(max_n=config.max_n, max_inputs=config.max_inputs, max_logprobs=config.max_logprobs)
        self.draining = False
        # The gRPC health status name, set by the server with its health servicer's: Load answers
        # carry it, so routers need no health check beside their Load polls.
        self.health = "NOT_SERVING"
        self.active: dict[str, _Active] = {}
        self.latency = LatencyWindow()  # interactive requests' recent TTFT and gaps, for the Load
        self.idle = asyncio.Event()
        self.idle.set()
        # Engine progress, noted by the pumps and judged by the server's monitor.
        self.watch = EngineWatch(StallBounds.of(config), enabled=config.engine_stall_check)
        engine_config = getattr(engine, "config", None)  # LoRA settings are engine settings
        self.adapters = AdapterRegistry(
            engine_config.adapter_slots if isinstance(engine_config, EngineConfig) else 0,
            engine_config.max_lora_rank if isinstance(engine_config, EngineConfig) else 0,
            base_model=lambda: self.engine.info().model)

    # ------------------------------------------------------------------------------- Generate

    async def Generate(self, request_pb: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateChunk]:
        request_id = request_pb.request_id or uuid.uuid4().hex
        token = request_id_var.set(request_id)
        try:
            # aclosing, here and in _run: a handler closed at its yield closes the generators
            # under it at once, so the engine request is aborted now, not at garbage collection.
            async with contextlib.aclosing(self._run(request_id, request_pb)) as chunks:
                async for chunk in chunks:
                    yield chunk_to_pb(chunk)
        except Exception as exc:
            status = self._status(exc)
            metadata = ((PARAM_METADATA_KEY, status.param),) if status.param else ()
            await context.abort(status.code, status.message, trailing_metadata=metadata)
        finally:
            request_id_var.reset(token)

    async def GenerateMany(self, requests: AsyncIterator[pb.MuxRequest],
                           context: grpc.aio.ServicerContext) -> AsyncIterator[pb.MuxResponse]:
        """Requests of one client over one call; every chunk that is ready goes in one message."""
        call = MuxCall(self.current_load)
        reader = asyncio.create_task(self._read_mux(requests, call))
        try:
            while (response := await call.next_response()) is not None:
                yield response
        finally:
            reader.cancel()
            await call.close()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read_mux(self, requests: AsyncIterator[pb.MuxRequest], call: MuxCall) -> None:
        """The call's incoming side, a task beside the writer: the client sends while it reads."""
        try:
            async for message in requests:
                self._handle_mux(message, call)
        finally:
            await call.requests_ended()

    def _handle_mux(self, message: pb.MuxRequest, call: MuxCall) -> None:
        if message.load_every_ms:  # the client asks for Loads while the call is idle too
            call.push_loads_every(message.load_every_ms / 1000)
        kind = message.WhichOneof("kind")
        if kind == "start" and call.is_open(message.stream):
            error = DuplicateRequestError(f"stream {message.stream} is already open on this call")
            _end_with(call.outbox, message.stream, self._status(error))
        elif kind == "start":
            call.start(message.stream, self._run_muxed(message.stream, message.start, call.outbox))
        elif kind == "cancel":
            call.cancel(message.stream)
        for more in message.batched:  # sent together by a busy client, in order
            self._handle_mux(more, call)

    async def _run_muxed(self, stream: int, request_pb: pb.GenerateRequest, outbox: MuxOutbox) -> None:
        request_id = request_pb.request_id or uuid.uuid4().hex
        request_id_var.set(request_id)  # this task's own context
        try:
            async for chunk in self._run(request_id, request_pb):
                outbox.add_chunk(stream, chunk)
            outbox.end(stream)
        except asyncio.CancelledError:
            return  # the client cancelled it (or the call ended): it no longer listens
        except Exception as exc:
            _end_with(outbox, stream, self._status(exc))

    def _status(self, exc: Exception) -> RequestStatus:
        """The status a failed request ends with, on either transport."""
        return status_for(exc, engine_healthy=self.engine.healthy)

    async def _run(self, request_id: str, request_pb: pb.GenerateRequest) -> AsyncIterator[Chunk]:
        """Read, admit, validate and stream one request; a refusal or failure raises a typed error
        (a request that cannot be read raises MalformedRequestError: INVALID_ARGUMENT)."""
        request = request_from_pb(request_pb)
        self._check_accepting(request_id)
        try:
            validate_request(request, self.limits, schedules_by_priority=self.engine.schedules_by_priority)
            prepared = [await prepare_input(self.engine, i, request, max_logprobs=self.limits.max_logprobs)
                        for i in range(len(request.inputs))]
        except InvalidRequestError as exc:
            self.metrics.requests.labels("invalid").inc()
            logger.info("rejected: %s", exc)
            raise
        held = self.adapters.acquire(request.adapter) if request.adapter else None
        try:
            async with contextlib.aclosing(self._stream(request_id, request, prepared, held)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            if held is not None:  # an unload waiting for this request may go on
                self.adapters.release(held)

    async def _stream(self, request_id: str, request: GenerateRequest, prepared: list[PreparedInput],
                      adapter: HeldAdapter | None = None) -> AsyncIterator[Chunk]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        interval_ms = request.stream_interval_ms or self.config.default_stream_interval_ms
        stream = RequestStream(prepared, request.n, interval_ms / 1000, self.metrics, started)
        events: asyncio.Queue[StreamEvent] = asyncio.Queue()
        active = self._open(request_id)
        active.events = events
        outcome = "error"
        # Interactive requests' token times feed the Load's latency report; batch stays out of it.
        batch = request.hints.service_class == "batch"
        last_tokens_at: dict[int, float] | None = None if batch else {}
        if batch:  # interactive samples taken meanwhile do not teach the baseline
            self.latency.batch_started()
        try:
            self._start_inputs(request_id, request, prepared, active, events, adapter)
            while stream.open_inputs:
                match await _next_event(events, stream.next_deadline(), loop):
                    case Deltas(index, deltas):
                        now = loop.time()
                        if last_tokens_at is not None:
                            self._note_latency(last_tokens_at, index, deltas, started, now)
                        chunks = stream.on_deltas(index, deltas, now)
                        if index in stream.cut_inputs:  # ended early at a stop string (stop_resume.py)
                            _cancel_pump(active, f"{request_id}-{index}")
                    case Ended(index, aborted):
                        chunks = stream.on_end(index, aborted)
                    case Failed(_, error):
                        raise error
                    case None:  # a coalesced chunk fell due
                        chunks = stream.on_deadline(loop.time())
                for chunk in chunks:
                    yield chunk
            outcome = "aborted" if active.aborted else "ok"
        except (asyncio.CancelledError, GeneratorExit):
            # A client that goes away closes this generator (GeneratorExit) or cancels the call.
            outcome = "cancelled"
            raise
        finally:
            if batch:
                self.latency.batch_ended()
            stream.close()
            self.metrics.requests.labels(outcome).inc()
            self.metrics.e2e.observe(loop.time() - started)
            await self._close(request_id, active, all_done=(outcome == "ok"))

    def _note_latency(self, last_tokens_at: dict[int, float], index: int, deltas: list, started: float,
                      now: float) -> None:
        count = max((len(d.token_ids) for d in deltas), default=0)  # samples of an input step together
        if not count:
            return
        previous = last_tokens_at.get(index)
        if previous is None:
            self.latency.first_token(now - started)
        else:
            self.latency.tokens(now - previous, count)
        last_tokens_at[index] = now
    def _check_accepting(self, request_id: str) -> None:
        """Refuse a new request while draining, with a dead or stalled engine, or a repeated id."""
        if self.draining:
            raise WorkerUnavailableError("worker is draining; send the request to another worker")
        if not self.engine.healthy:
            raise WorkerUnavailableError("the engine is not running; try another worker")
        if self.watch.stall is not None:
            raise WorkerUnavailableError("the engine stopped making progress; try another worker")
        if request_id in self.active:
            raise DuplicateRequestError(f"request {request_id} is already running on this worker")

    def _start_inputs(self, request_id: str, request: GenerateRequest, prepared: list[PreparedInput],
                      active: _Active, events: asyncio.Queue[StreamEvent], adapter: HeldAdapter | None) -> None:
        for index, item in enumerate(prepared):
            self.metrics.prompt_tokens.inc(item.prompt_len)
            if item.exhausted:  # a resume that used up max_tokens already: it ends at once
                events.put_nowait(Deltas(index, [SampleDelta(0, "", [], finish_reason="length")]))
                events.put_nowait(Ended(index, aborted=False))
                continue
            engine_id = f"{request_id}-{index}"
            active.engine_ids.append(engine_id)
            active.tasks.append(asyncio.create_task(self._pump(index, engine_id, item, request.priority, events,
                                                               adapter)))

    async def _pump(self, index: int, engine_id: str, item: PreparedInput, priority: int,
                    events: asyncio.Queue[StreamEvent], adapter: HeldAdapter | None = None) -> None:
        """Relay one engine request's output as events; cancelling the task aborts the request."""
        self.watch.submitted(engine_id, len(item.prompt_token_ids))
        try:
            # cache_salt only when the request has one: engines written before it need not take it
            salt = {"cache_salt": item.cache_salt} if item.cache_salt is not None else {}
            async for deltas in self.engine.generate(engine_id, item.prompt_token_ids, item.engine_params,
                                                     priority=priority, adapter=adapter, **salt):
                self.watch.produced(engine_id)
                events.put_nowait(Deltas(index, deltas))
            events.put_nowait(Ended(index, aborted=False))
        except asyncio.CancelledError:
            events.put_nowait(Ended(index, aborted=True))
            raise
        except Exception as exc:  # the stream raises it, and status.py maps it
            events.put_nowait(Failed(index, exc))
        finally:
            self.watch.finished(engine_id)

    def _open(self, request_id: str) -> _Active:
        active = self.active[request_id] = _Active()
        self.idle.clear()
        self.metrics.in_flight.inc()
        return active

    async def _close(self, request_id: str, active: _Active, *, all_done: bool) -> None:
        """Stop the pumps and, unless every input finished, abort what is left in the engine."""
        self.metrics.in_flight.dec()
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

    def fail_all(self, error: Exception) -> list[str]:
        """End every request this worker holds with `error` (its engine cannot finish them);
        the ids of those requests. Each stream raises it, so the client sees the error's
        status, never a clean end, and its router moves the stream to another worker."""
        failed = []
        for request_id, active in self.active.items():
            if active.events is not None:
                active.events.put_nowait(Failed(0, error))
                failed.append(request_id)
        return failed

    # ------------------------------------------------------------------------------- Pool

    async def Pool(self, request_pb: pb.PoolRequest, context: grpc.aio.ServicerContext) -> pb.PoolResponse:
        """One pooling request (embeddings, score, ...), answered whole by the engine's pooling
        code (worker/pooling.py). Concurrent calls run concurrently: the engine batches them.
        A caller that goes away cancels this handler, and vLLM aborts the engine requests."""
        request_id = request_pb.request_id or uuid.uuid4().hex
        token = request_id_var.set(request_id)
        try:
            return await self._pool(PoolRequest(request_id, request_pb.endpoint, request_pb.body_json,
                                                request_pb.priority))
        except Exception as exc:
            if isinstance(exc, InvalidRequestError):
                logger.info("rejected %s request: %s", request_pb.endpoint, exc)
            await self._abort_call(context, exc)
        finally:
            request_id_var.reset(token)

    async def _pool(self, request: PoolRequest) -> pb.PoolResponse:
        self._check_accepting(request.request_id)
        active = self._open(request.request_id)
        outcome = "error"
        try:
            result = await self.engine.pool(request)
            outcome = "ok"
        except InvalidRequestError:
            outcome = "invalid"
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self.metrics.requests.labels(outcome).inc()
            await self._close(request.request_id, active, all_done=True)
        self.metrics.prompt_tokens.inc(result.prompt_tokens)
        return pb.PoolResponse(body_json=result.body_json, prompt_tokens=result.prompt_tokens)

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
        info.pool = self.config.pool
        info.worker_id = self.config.worker_id or f"{self.config.host}:{self.config.port}"
        info.kv_events = self.engine.kv_relay is not None
        return info

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.WorkerInfo:
        return info_to_pb(self.worker_info())

    async def Load(self, request: pb.LoadRequest, context: grpc.aio.ServicerContext) -> pb.WorkerLoad:
        return load_to_pb(self.current_load())

    def current_load(self) -> WorkerLoad:
        load = self.engine.load()
        load.in_flight = len(self.active)
        load.draining = self.draining
        load.adapters = self.adapters.names()
        load.max_adapters = self.adapters.slots
        load.health = self.health
        (load.interactive_ttft_p90_ms, load.interactive_itl_p90_ms,
         load.interactive_ttft_p90_floor_ms, load.interactive_itl_p90_floor_ms) = self.latency.report()
        load.interactive_ttft_baseline_ms = self.latency.ttft_baseline_ms()
        load.interactive_itl_baseline_ms = self.latency.itl_baseline_ms()
        return load

    async def KvEvents(self, request: pb.KvEventsRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.KvEventBatch]:
        """The engine's KV-cache events (kv_relay.py): catch-up from `after_sequence` of `epoch`,
        or a snapshot, then live batches until the engine stops or the caller goes."""
        relay = self.engine.kv_relay
        if relay is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"the {self.engine.name} engine publishes no KV-cache events here: run the worker "
                                "with prefix caching on and without --no-kv-events (the mock engine needs "
                                "--mock-kv-blocks)")
        batches = relay.subscribe(request.after_sequence, request.epoch)
        try:
            async for batch in batches:
                yield batch_to_pb(batch)
        finally:
            await batches.aclose()

    async def TokenizerFiles(self, request: pb.TokenizerFilesRequest,
                             context: grpc.aio.ServicerContext) -> AsyncIterator[pb.FileChunk]:
        """The engine's tokenizer files, for routers (tokenizer_files.py); FAILED_PRECONDITION if none."""
        try:
            chunks = await asyncio.to_thread(read_tokenizer_files, self.engine)
        except TokenizerFilesError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        for name, data, last in chunks:
            yield pb.FileChunk(name=name, data=data, last=last)

    async def Introspect(self, request: pb.IntrospectRequest,
                         context: grpc.aio.ServicerContext) -> pb.IntrospectResponse:
        """vLLM's answer at one of its token/render endpoints (engine.introspect); FAILED_PRECONDITION
        where this engine cannot answer."""
        try:
            body = json.loads(request.body or b"{}")
            if not isinstance(body, dict):
                raise InvalidRequestError("the request body must be a JSON object")
            answer = await self.engine.introspect(request.endpoint, body)
        except IntrospectUnsupportedError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except json.JSONDecodeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request body is not JSON: {exc}")
        except Exception as exc:
            await self._abort_call(context, exc)
        return pb.IntrospectResponse(body=json.dumps(answer).encode())

    # ------------------------------------------------------------------------------- adapters

    async def LoadAdapter(self, request: pb.LoadAdapterRequest, context: grpc.aio.ServicerContext) -> pb.AdapterList:
        try:
            await self.adapters.load(request.name, request.path, self.engine.add_adapter, self.engine.remove_adapter)
        except Exception as exc:
            await self._abort_call(context, exc)
        return self._adapter_list()

    async def UnloadAdapter(self, request: pb.UnloadAdapterRequest,
                            context: grpc.aio.ServicerContext) -> pb.AdapterList:
        try:
            await self.adapters.unload(request.name, self.engine.remove_adapter)
        except Exception as exc:
            await self._abort_call(context, exc)
        return self._adapter_list()

    async def ListAdapters(self, request: pb.ListAdaptersRequest, context: grpc.aio.ServicerContext) -> pb.AdapterList:
        return self._adapter_list()

    def _adapter_list(self) -> pb.AdapterList:
        return adapters_to_pb(self.adapters.listing(), self.adapters.slots)

    async def _abort_call(self, context: grpc.aio.ServicerContext, exc: Exception) -> None:
        status = self._status(exc)
        metadata = ((PARAM_METADATA_KEY, status.param),) if status.param else ()
        await context.abort(status.code, status.message, trailing_metadata=metadata)

    async def load_static_adapters(self, specs: list[str]) -> None:
        """The --lora name=path adapters, before the worker turns SERVING; ConfigError if one cannot load."""
        for spec in specs:
            name, sep, path = spec.partition("=")
            if not sep or not name.strip() or not path.strip():
                raise ConfigError(f"--lora {spec!r} is not name=path")
            try:
                await self.adapters.load(name.strip(), path.strip(), self.engine.add_adapter,
                                         self.engine.remove_adapter)
            except FleetError as exc:
                raise ConfigError(f"--lora {spec!r}: {exc}") from None


async def _next_event(events: asyncio.Queue[StreamEvent], deadline: float | None,
                      loop: asyncio.AbstractEventLoop) -> StreamEvent | None:
    """The next event of a request's inputs, or None once the coalescing deadline has passed."""
    if deadline is None:
        return await events.get()
    # asyncio.timeout_at, not wait_for: on Python 3.11 wait_for drops a cancel that lands as the
    # event arrives, and the request then runs on for a client that has gone (the abort is lost).
    try:
        async with asyncio.timeout_at(deadline):
            return await events.get()
    except TimeoutError:
        return None


def _cancel_pump(active: _Active, engine_id: str) -> None:
    """Stop one input's pump, which aborts its engine request."""
    if engine_id in active.engine_ids:
        active.tasks[active.engine_ids.index(engine_id)].cancel()


def _end_with(outbox: MuxOutbox, stream: int, status: RequestStatus) -> None:
    outbox.end(stream, status.code_value, status.message, status.param or "")
