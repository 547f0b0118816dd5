"""Generate, GenerateMany and Abort: the worker's request handling, and its requests in flight.

Generate: admit → validate → prepare each input (prepare.py) → one engine request per input
(id `<request_id>-<index>`), each pumped by its own task into one queue of typed events →
a RequestStream turns the events into chunks (request_stream.py). A request of one input whose
tokens are not coalesced (the common case) has no pump: its own task reads the engine's stream,
one task hand-off a token fewer (issue #49: at ~20,000 tokens/s the worker's core is the limit;
in_flight.py holds a request's record and how its task waits). When the call ends early (client
gone, deadline, Abort), every engine request still running is aborted. GenerateMany does the same
for many requests over one call, batching their chunks (mux.py). Whatever a request fails with
becomes its gRPC status in one place (status.py).

`GenerateRpcs` is a part of `WorkerService` (service.py), not a servicer of its own: gRPC
serves one servicer class per service, so the Worker's RPCs are split by job over a mixin.
The state it reads is set by `WorkerService.__init__`, listed below; the table of requests in
flight (`active`, `idle`) is kept here and shared with Pool, Abort and Load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import grpc

from vllm_fleet.config import WorkerConfig
from vllm_fleet.errors import DuplicateRequestError, InvalidRequestError, WorkerUnavailableError
from vllm_fleet.logs import request_id_var
from vllm_fleet.protocol import PARAM_METADATA_KEY, worker_pb2 as pb
from vllm_fleet.protocol.convert import chunk_to_pb, request_from_pb
from vllm_fleet.protocol.types import Chunk, GenerateRequest, WorkerLoad
from vllm_fleet.worker.adapters import AdapterRegistry, HeldAdapter
from vllm_fleet.worker.engines.base import Engine, SampleDelta
from vllm_fleet.worker.in_flight import InFlight, cancel_pump, despite_cancellation, next_direct, next_event
from vllm_fleet.worker.latency_window import LatencyWindow
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.mux import MuxCall, MuxOutbox
from vllm_fleet.worker.prepare import PreparedInput, prepare_input
from vllm_fleet.worker.request_stream import Deltas, Ended, Failed, RequestStream, StreamEvent
from vllm_fleet.worker.router_ids import RouterIds
from vllm_fleet.worker.status import RequestStatus, status_for
from vllm_fleet.worker.validation import Limits, validate_request
from vllm_fleet.worker.watch.engine_watch import EngineWatch

logger = logging.getLogger(__name__)


class GenerateRpcs:
    """Generate, GenerateMany and Abort of `WorkerService`, with the requests in flight."""

    # Set by WorkerService.__init__ (service.py).
    engine: Engine
    config: WorkerConfig
    metrics: WorkerMetrics
    limits: Limits
    draining: bool
    active: dict[str, InFlight]
    latency: LatencyWindow
    idle: asyncio.Event
    watch: EngineWatch
    adapters: AdapterRegistry
    router_ids: RouterIds  # routers' prompt ids: taken where trusted, some verified (router_ids.py)
    current_load: Callable[[], WorkerLoad]  # the Load that GenerateMany's calls push

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
            prepared = [await prepare_input(self.engine, i, request, max_logprobs=self.limits.max_logprobs,
                                            router_ids=self.router_ids) for i in range(len(request.inputs))]
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
        active = self._open(request_id)
        # One input, no coalescing deadline to wait on beside the engine: read the engine directly.
        direct = len(prepared) == 1 and not prepared[0].exhausted and not interval_ms
        source = events = None
        if direct:
            active.direct = True
            active.engine_ids.append(f"{request_id}-0")
            source = self._engine_events(0, active.engine_ids[0], prepared[0], request.priority, adapter)
        else:
            events = active.events = asyncio.Queue()
        outcome = "error"
        # Interactive requests' token times feed the Load's latency report; batch stays out of it.
        batch = request.hints.service_class == "batch"
        last_tokens_at: dict[int, float] | None = None if batch else {}
        if batch:  # interactive samples taken meanwhile do not teach the baseline
            self.latency.batch_started()
        try:
            if not direct:
                self._start_inputs(request_id, request, prepared, active, events, adapter)
            while stream.open_inputs:
                match await (next_direct(source, active) if direct else
                             next_event(events, stream.next_deadline(), loop)):
                    case Deltas(index, deltas):
                        now = loop.time()
                        if last_tokens_at is not None:
                            self._note_latency(last_tokens_at, index, deltas, started, now)
                        chunks = stream.on_deltas(index, deltas, now)
                        if index in stream.cut_inputs and not direct:  # ended early at a stop string
                            cancel_pump(active, f"{request_id}-{index}")  # (resume/stops.py; direct: _close)
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
            # A direct request cut at a stop string left its engine request running: abort it.
            await self._close(request_id, active, all_done=(outcome == "ok" and not (direct and stream.cut_inputs)),
                              source=source)

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
                      active: InFlight, events: asyncio.Queue[StreamEvent], adapter: HeldAdapter | None) -> None:
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
        try:
            async with contextlib.aclosing(self._engine_events(index, engine_id, item, priority, adapter)) as source:
                async for event in source:
                    events.put_nowait(event)
        except asyncio.CancelledError:
            events.put_nowait(Ended(index, aborted=True))
            raise

    async def _engine_events(self, index: int, engine_id: str, item: PreparedInput, priority: int,
                             adapter: HeldAdapter | None) -> AsyncIterator[StreamEvent]:
        """One engine request's output as events, ending with Ended or Failed; closing the
        generator or cancelling its reader aborts the request."""
        self.watch.submitted(engine_id, len(item.prompt_token_ids))
        try:
            # cache_salt only when the request has one: engines written before it need not take it
            salt = {"cache_salt": item.cache_salt} if item.cache_salt is not None else {}
            async with contextlib.aclosing(self.engine.generate(engine_id, item.prompt_token_ids, item.engine_params,
                                                                priority=priority, adapter=adapter, **salt)) as outputs:
                async for deltas in outputs:
                    self.watch.produced(engine_id)
                    yield Deltas(index, deltas)
            yield Ended(index, aborted=False)
        except Exception as exc:  # the stream raises it, and status.py maps it
            yield Failed(index, exc)
        finally:
            self.watch.finished(engine_id)

    def _open(self, request_id: str) -> InFlight:
        active = self.active[request_id] = InFlight()
        self.idle.clear()
        self.metrics.in_flight.inc()
        return active

    async def _close(self, request_id: str, active: InFlight, *, all_done: bool,
                     source: AsyncGenerator[StreamEvent, None] | None = None) -> None:
        """Stop the pumps and, unless every input finished, abort what is left in the engine;
        then the request is no longer in flight.

        This runs in the `finally` of a request that was, most often, cancelled, and its task may
        be cancelled again while it waits here: a GenerateMany stream gets its client's cancel and,
        when the client closes its channel right after (a router that closes), the call's end
        (MuxCall.close) cancels the stream's task once more, often from the same read. That
        second cancellation used to cut the close short: the explicit engine abort was skipped
        and the request stayed in `active` for good (Load's in_flight stuck above 0, a drain
        waiting out its whole grace). The close now runs to its end, and a cancellation that
        arrived meanwhile is raised after it."""
        self.metrics.in_flight.dec()
        for task in active.tasks:
            task.cancel()
        await despite_cancellation(self._release(request_id, active, all_done=all_done, source=source))

    async def _release(self, request_id: str, active: InFlight, *, all_done: bool,
                       source: AsyncGenerator[StreamEvent, None] | None) -> None:
        if source is not None:
            await source.aclose()  # a direct request's engine stream, if the loop left it early
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
            elif active.direct:
                active.failure = error
                active.interrupt()
                failed.append(request_id)
        return failed

    async def Abort(self, request: pb.AbortRequest, context: grpc.aio.ServicerContext) -> pb.AbortResponse:
        active = self.active.get(request.request_id)
        if active is None:
            return pb.AbortResponse(found=False)
        active.aborted = True
        for task in active.tasks:
            task.cancel()
        active.interrupt()
        return pb.AbortResponse(found=True)


def _end_with(outbox: MuxOutbox, stream: int, status: RequestStatus) -> None:
    outbox.end(stream, status.code_value, status.message, status.param or "")
