"""The gRPC service `vllm_fleet.v1.Worker` around one engine.

Generate, GenerateMany and Abort, with the table of requests in flight, are in
generate_rpcs.py. Here are the service's state (one object: the server reads its `draining`,
`active`, `idle` and `watch`) and the other RPCs: Pool (pooling models), Info, Load,
KvEvents, TokenizerFiles, Introspect and the adapter RPCs. Whatever a call fails with becomes
its gRPC status in one place (status.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator

import grpc

from vllm_fleet import __version__
from vllm_fleet.config import EngineConfig, WorkerConfig
from vllm_fleet.errors import (
    ConfigError,
    FleetError,
    IntrospectUnsupportedError,
    InvalidRequestError,
    TokenizerFilesError,
)
from vllm_fleet.logs import request_id_var
from vllm_fleet.protocol import PARAM_METADATA_KEY, worker_pb2 as pb, worker_pb2_grpc
from vllm_fleet.protocol.convert import adapters_to_pb, info_to_pb, load_to_pb
from vllm_fleet.protocol.kv_events import batch_to_pb
from vllm_fleet.protocol.pooling import PoolRequest
from vllm_fleet.protocol.types import WorkerInfo, WorkerLoad
from vllm_fleet.worker.adapters import AdapterRegistry
from vllm_fleet.worker.engines.base import Engine
from vllm_fleet.worker.generate_rpcs import GenerateRpcs
from vllm_fleet.worker.latency_window import LatencyWindow
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.router_ids import RouterIds
from vllm_fleet.worker.tokenizer_files import read_tokenizer_files
from vllm_fleet.worker.validation import Limits
from vllm_fleet.worker.watch.engine_watch import EngineWatch, StallBounds

logger = logging.getLogger(__name__)


# GenerateRpcs first: its methods must win over the generated base's UNIMPLEMENTED stubs.
class WorkerService(GenerateRpcs, worker_pb2_grpc.WorkerServicer):
    def __init__(self, engine: Engine, config: WorkerConfig, metrics: WorkerMetrics) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.limits = Limits(max_n=config.max_n, max_inputs=config.max_inputs, max_logprobs=config.max_logprobs)
        self.draining = False
        # The gRPC health status name, set by the server with its health servicer's: Load answers
        # carry it, so routers need no health check beside their Load polls.
        self.health = "NOT_SERVING"
        self.active = {}  # requests in flight by id (generate_rpcs.py)
        self.latency = LatencyWindow()  # interactive requests' recent TTFT and gaps, for the Load
        self.router_ids = RouterIds(config, metrics)  # routers' prompt ids: taken, verified (router_ids.py)
        self.idle = asyncio.Event()
        self.idle.set()
        # Engine progress, noted by the pumps and judged by the server's monitor.
        self.watch = EngineWatch(StallBounds.of(config), enabled=config.engine_stall_check)
        engine_config = getattr(engine, "config", None)  # LoRA settings are engine settings
        self.adapters = AdapterRegistry(
            engine_config.adapter_slots if isinstance(engine_config, EngineConfig) else 0,
            engine_config.max_lora_rank if isinstance(engine_config, EngineConfig) else 0,
            base_model=lambda: self.engine.info().model)

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

    def worker_info(self) -> WorkerInfo:
        info = self.engine.info()
        info.version = __version__
        info.device = self.config.device
        info.pool = self.config.pool
        info.worker_id = self.config.worker_id or f"{self.config.host}:{self.config.port}"
        info.kv_events = self.engine.kv_relay is not None
        info.tokenizer_digest = self.router_ids.digest
        info.takes_router_ids = self.router_ids.takes
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
        load.engine_silent_s = self.watch.silent_s()
        return load

    async def KvEvents(self, request: pb.KvEventsRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.KvEventBatch]:
        """The engine's KV-cache events (kv_relay.py): catch-up from `after_sequence` of `epoch`,
        or a snapshot, then live batches until the engine stops or the caller goes."""
        relay = self.engine.kv_relay
        if relay is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"the {self.engine.name} engine publishes no KV-cache events here: run the worker "
                                "with --kv-events and prefix caching on (the mock engine needs --mock-kv-blocks)")
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

