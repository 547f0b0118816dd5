"""Targets that speak the worker protocol: workers over gRPC directly, or the router in-process."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterable

from vllm_fleet.bench.config import BenchConfig
from vllm_fleet.bench.record import RequestRecord
from vllm_fleet.bench.targets.base import Clock, Target
from vllm_fleet.bench.workloads import BenchItem
from vllm_fleet.client import ClientOptions, WorkerClient
from vllm_fleet.errors import ConfigError
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import Chunk, GenerateInput, GenerateRequest


def use_token_ids(config: BenchConfig, vocab_size: int | None) -> bool:
    """Token-id prompts need ids the model knows: with 'auto', only when the worker reports its
    vocabulary size (Info setting 'vocab_size'); '--prompt-format tokens' forces them."""
    if config.prompt_format == "tokens":
        return True
    return config.prompt_format == "auto" and vocab_size is not None


def fit_token_ids(token_ids: list[int], vocab_size: int | None) -> list[int]:
    """Fold ids into the vocabulary, keeping clear of the low ids where specials (EOS, ...) live."""
    if vocab_size is None or max(token_ids, default=0) < vocab_size:
        return list(token_ids)
    low = min(1000, vocab_size // 4)
    return [low + t % (vocab_size - low) for t in token_ids]


def generate_request(item: BenchItem, config: BenchConfig, request_id: str,
                     vocab_size: int | None = None) -> GenerateRequest:
    """The worker-protocol request for `item`: token ids when the workload has them and the
    worker's vocabulary is known (or forced), else the text or chat messages."""
    if item.messages is not None:
        inputs = GenerateInput(messages=[{"role": m["role"], "content": m["content"]} for m in item.messages])
    elif item.token_ids is not None and use_token_ids(config, vocab_size):
        inputs = GenerateInput(token_ids=fit_token_ids(item.token_ids, vocab_size))
    else:
        inputs = GenerateInput(text=item.prompt)
    params = SamplingParams(max_tokens=item.max_tokens, temperature=config.temperature, ignore_eos=config.ignore_eos)
    return build_request(request_id, [inputs], params, session_id=item.session_id,
                         stream_interval_ms=config.stream_interval_ms)


async def record_stream(chunks: AsyncIterable[Chunk], record: RequestRecord, clock: Clock) -> None:
    """Time every chunk that carries output; take token counts from the final usage."""
    streamed = 0
    async for chunk in chunks:
        now = clock()
        tokens = len(chunk.token_ids)
        if tokens or chunk.text:
            record.chunk_times.append(now)
            record.chunk_tokens.append(max(tokens, 1))
            streamed += max(tokens, 1)
        if chunk.usage is not None:
            record.prompt_tokens = chunk.usage.prompt_tokens
            record.output_tokens = chunk.usage.completion_tokens
    if not record.output_tokens:
        record.output_tokens = streamed


async def vocab_size_of(client: WorkerClient) -> int | None:
    return _vocab_size((await client.info()).settings)


def _vocab_size(settings: dict[str, str]) -> int | None:
    try:
        return int(settings.get("vocab_size", "")) or None
    except ValueError:
        return None


class GrpcTarget(Target):
    """Workers over gRPC; several addresses are used in turn (client-side round robin)."""

    name = "grpc"

    def __init__(self, addresses: list[str], config: BenchConfig) -> None:
        if not addresses:
            raise ConfigError("--target grpc:// names no worker: write grpc://host:port[,host:port], e.g. grpc://127.0.0.1:50051")
        self.addresses = addresses
        self.config = config
        self._clients: list[WorkerClient] = []
        self._next = itertools.count()
        self.vocab_size: int | None = None

    async def start(self) -> None:
        options = ClientOptions(multiplex=self.config.multiplex)
        self._clients = [WorkerClient(address, options) for address in self.addresses]
        for client in self._clients:
            await client.wait_serving(timeout=30.0)
        self.vocab_size = await vocab_size_of(self._clients[0])

    async def send(self, item: BenchItem, record: RequestRecord, clock: Clock) -> None:
        client = self._clients[next(self._next) % len(self._clients)]
        request = generate_request(item, self.config, record.request_id, self.vocab_size)
        await record_stream(client.generate(request, timeout=self.config.request_timeout), record, clock)

    async def close(self) -> None:
        for client in self._clients:
            await client.close()

    def describe(self) -> str:
        return "workers over gRPC: " + ",".join(self.addresses)


class FleetTarget(Target):
    """The routing core in-process over a static list of workers, without the gateway."""

    name = "fleet"

    def __init__(self, workers: str | None, config: BenchConfig) -> None:
        if not workers:
            raise ConfigError("--target fleet needs --workers host:port,host:port")
        self.workers = workers
        self.config = config
        self._router = None
        self.vocab_size: int | None = None

    async def start(self) -> None:
        try:
            from vllm_fleet.router import Router, RouterConfig
        except ImportError as exc:
            raise ConfigError(f"--target fleet needs the router (vllm_fleet.router), which is not available: {exc}") from None
        from prometheus_client import CollectorRegistry

        from vllm_fleet.registry import StaticRegistry

        router_config = RouterConfig(policy=self.config.policy) if self.config.policy else RouterConfig()
        # A private metrics registry: the bench reports its own figures, and may build several routers.
        self._router = Router(StaticRegistry.from_spec(self.workers), router_config, metrics_registry=CollectorRegistry())
        await self._router.start()
        await self._router.wait_ready(timeout=30.0)
        info = self._router.model_info(self.config.model) if self.config.model else None
        if info is None and self._router.models():
            info = self._router.model_info(self._router.models()[0])
        self.vocab_size = _vocab_size(info.settings) if info is not None else None

    async def send(self, item: BenchItem, record: RequestRecord, clock: Clock) -> None:
        request = generate_request(item, self.config, record.request_id, self.vocab_size)
        await record_stream(self._router.stream(request, model=self.config.model), record, clock)

    async def close(self) -> None:
        if self._router is not None:
            await self._router.close()

    def describe(self) -> str:
        policy = self.config.policy or "default policy"
        return f"router in-process ({policy}) over {self.workers}"
