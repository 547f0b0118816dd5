"""The real engine: vLLM's AsyncLLM in this process, its EngineCore in a child process.

We use AsyncLLM directly (not vLLM's OpenAI server): it streams RequestOutput deltas whose
text is already whole UTF-8 characters (the detokenizer holds back partial ones), it aborts
a request when its consumer is cancelled, and it reports scheduler statistics to stat loggers,
from which `load()` is served without a round trip to the engine.

With prefix caching on (vLLM's default) and `kv_events` (ours, on by default), vLLM publishes its
KV-cache events to a reader in this process (vllm_kv_events.py) that feeds the worker's KvRelay.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from vllm_fleet.config import EngineConfig
from vllm_fleet.errors import ConfigError, InvalidRequestError, ModelError, WorkerUnavailableError
from vllm_fleet.models import resolve_model
from vllm_fleet.protocol.pooling import PoolRequest, PoolResult
from vllm_fleet.protocol.types import PromptLogprob, TokenLogprob, WorkerInfo, WorkerLoad
from vllm_fleet.worker.engines.dtype_choice import DtypeChoice, choose_dtype, read_cpu_flags
from vllm_fleet.worker.engines.base import Engine, RenderedPrompt, SampleDelta
from vllm_fleet.worker.engines.vllm_version import check_vllm_version
from vllm_fleet.worker.kv_relay import KvRelay
from vllm_fleet.worker.openai.errors import invalid_request, vllm_error_types
from vllm_fleet.worker.openai.introspect import VllmIntrospection
from vllm_fleet.worker.openai.render import VllmRenderer

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_CACHE_GB = 2
# The relay's mirror bound when vLLM does not say how many blocks it has (it always should).
FALLBACK_KV_BLOCKS = 1 << 18

_PASSTHROUGH = (
    "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
    "tensor_parallel_size", "enforce_eager", "block_size", "enable_prefix_caching", "load_format",
    "seed", "trust_remote_code", "tokenizer", "reasoning_parser",
)


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def engine_kwargs(config: EngineConfig, model_path: str, served_name: str) -> dict[str, Any]:
    """AsyncEngineArgs keyword arguments for a config: the named options plus --engine-arg k=v."""
    kwargs: dict[str, Any] = {"model": model_path, "served_model_name": [served_name]}
    for name in _PASSTHROUGH:
        value = getattr(config, name)
        if value is not None and not (name == "tensor_parallel_size" and value == 1):
            kwargs[name] = value
    for item in config.engine_arg:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--engine-arg {item!r} is not key=value")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        kwargs[key.strip().replace("-", "_")] = value
    # Priority scheduling by default: a router gives batch requests a higher (later) priority, so
    # under KV pressure vLLM preempts batch first (router/classes.py). Within one priority vLLM
    # still serves first come, first served. --engine-arg scheduling_policy=fcfs turns it off.
    kwargs.setdefault("scheduling_policy", "priority")
    if config.adapter_slots:  # LoRA costs memory and a slower step: on only when asked for
        kwargs.update(enable_lora=True, max_loras=config.adapter_slots, max_lora_rank=config.max_lora_rank)
    return kwargs


class _LoadRecorder:
    """A vLLM stat logger that keeps the latest scheduler numbers for `Load`."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage = 0.0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self._generated: deque[tuple[float, int]] = deque()

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            self.running = scheduler_stats.num_running_reqs
            self.waiting = scheduler_stats.num_waiting_reqs + getattr(scheduler_stats, "num_skipped_waiting_reqs", 0)
            self.kv_cache_usage = scheduler_stats.kv_cache_usage
            prefix = scheduler_stats.prefix_cache_stats
            if prefix is not None:
                self.prefix_queries += prefix.queries
                self.prefix_hits += prefix.hits
        if iteration_stats is not None and iteration_stats.num_generation_tokens:
            self._generated.append((time.monotonic(), iteration_stats.num_generation_tokens))

    def tokens_per_s(self, window_s: float = 5.0) -> float:
        cutoff = time.monotonic() - window_s
        while self._generated and self._generated[0][0] < cutoff:
            self._generated.popleft()
        return sum(n for _, n in self._generated) / window_s


def _stat_logger_factory(recorder: _LoadRecorder):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class FleetLoadLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            recorder.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return FleetLoadLogger


class VllmEngine(Engine):
    name = "vllm"

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._llm: Any = None
        self._tokenizer: Any = None
        self._recorder = _LoadRecorder()
        self._served_name = ""
        self._max_model_len = 0
        self._dtype_choice: DtypeChoice | None = None
        self._renderer: VllmRenderer | None = None
        self._introspection: VllmIntrospection | None = None
        self.enable_auto_tool_choice = config.enable_auto_tool_choice
        self.parser_cls: type | None = None
        self._kv_socket: Any = None   # our ZMQ SUB socket, until the reader thread takes it
        self._kv_reader: Any = None   # vllm_kv_events.KvEventReader
        self._pooling: Any = None     # worker/pooling.py's VllmPooling, for a pooling model

    async def start(self) -> None:
        # The engine core is a child process: it reads these when it starts.
        if self.config.kv_cache_space_gb is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(self.config.kv_cache_space_gb)
        elif "VLLM_CPU_KVCACHE_SPACE" not in os.environ and _on_cpu():
            # Unset, vLLM-cpu reserves 92% of the NUMA node's memory and refuses to start as
            # soon as anything else uses memory (or a second worker runs): default to a size
            # that always fits; --kv-cache-space-gb sets it.
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(DEFAULT_CPU_KV_CACHE_GB)
        if self.config.cpu_cores is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = self.config.cpu_cores
        import vllm

        check_vllm_version(vllm.__version__)   # before the engine's own imports can fail obscurely
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        if self.config.enable_auto_tool_choice and not self.config.tool_call_parser:
            raise ConfigError("--enable-auto-tool-choice requires --tool-call-parser")  # as vllm serve says
        resolved = resolve_model(self.config.model, self.config.served_model_name)
        self._served_name = resolved.served_name
        kwargs = engine_kwargs(self.config, resolved.path, resolved.served_name)
        on_cpu = _on_cpu()
        self._dtype_choice = choose_dtype(kwargs.get("dtype"), on_cpu=on_cpu,
                                          cpu_flags=read_cpu_flags() if on_cpu else ())
        kwargs["dtype"] = self._dtype_choice.dtype
        logger.info("weight dtype %s (%s)", self._dtype_choice.dtype, self._dtype_choice.reason)
        self._ask_for_kv_events(kwargs)
        logger.info("starting vLLM engine: %s", kwargs)
        try:
            args = AsyncEngineArgs(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"unknown vLLM engine argument: {exc}") from None
        try:
            self._llm = AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(self._recorder)])
        except Exception as exc:
            raise ModelError(f"vLLM could not load {resolved.path}: {exc}") from exc
        vllm_config = self._llm.vllm_config
        self._max_model_len = vllm_config.model_config.max_model_len
        model_config = vllm_config.model_config
        self.sampling_defaults = model_config.get_diff_sampling_param() or {}
        # As vLLM's serving classes compute it: a max_tokens the operator set for the model caps
        # every request.
        if model_config.generation_config not in ("auto", "vllm"):
            self.max_tokens_override = self.sampling_defaults.get("max_tokens")
        else:
            self.max_tokens_override = (getattr(model_config, "override_generation_config", None) or {}).get(
                "max_new_tokens")
        self.schedules_by_priority = vllm_config.scheduler_config.policy == "priority"
        try:
            self._tokenizer = self._llm.get_tokenizer()
        except Exception:  # token-id-only deployments (e.g. dummy weights with no tokenizer)
            self._tokenizer = None
        if self._tokenizer is not None and not model_config.skip_tokenizer_init:
            # --tokenizer, else the model (for the default: its converted HF folder, models.py)
            self.tokenizer_source = model_config.tokenizer
            self.tokenizer_revision = model_config.tokenizer_revision
        self.parser_cls = self._parser_class()
        self._renderer = VllmRenderer(self._llm, self._tokenizer)
        self._introspection = VllmIntrospection(
            self._llm, self._served_name, tool_call_parser=self.config.tool_call_parser,
            enable_auto_tool_choice=self.config.enable_auto_tool_choice, reasoning_parser=self.config.reasoning_parser)
        self._start_kv_relay()
        self.tasks = tuple(await self._llm.get_supported_tasks())
        if "generate" not in self.tasks:  # a pooling model (embedding, reranking, classifying)
            from vllm_fleet.worker.pooling import VllmPooling

            self._pooling = VllmPooling.build(self._llm, self._served_name, resolved.path, self.tasks)
            self.pooling_endpoints = tuple(self._pooling.endpoints)
            logger.info("pooling model: tasks %s, endpoints %s", ",".join(self.tasks), ",".join(self.pooling_endpoints))
        else:
            await self._warm_up()
        logger.info("vLLM engine ready: model=%s max_model_len=%d", self._served_name, self._max_model_len)

    def _ask_for_kv_events(self, kwargs: dict[str, Any]) -> None:
        """Have vLLM publish KV-cache events to a socket of ours (localhost only), unless events
        are off, prefix caching is off, or the operator configured vLLM's events (--engine-arg)."""
        if not self.config.kv_events or self.config.enable_prefix_caching is False:
            return
        if kwargs.get("kv_events_config") is not None:
            logger.info("kv_events_config given with --engine-arg: not relaying KV-cache events")
            return
        import zmq
        from vllm.config import KVEventsConfig

        from vllm_fleet.worker.engines.vllm_kv_events import open_subscriber

        self._kv_socket, endpoint = open_subscriber(zmq.Context.instance())
        kwargs["kv_events_config"] = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint)

    def _start_kv_relay(self) -> None:
        """The relay and its reader, once vLLM says its block size and count and that prefix
        caching is on (events queue in our socket meanwhile)."""
        if self._kv_socket is None:
            return
        socket, self._kv_socket = self._kv_socket, None
        cache = self._llm.vllm_config.cache_config
        if not cache.enable_prefix_caching:
            socket.close(linger=0)
            logger.info("prefix caching is off: no KV-cache events")
            return
        from vllm_fleet.worker.engines.vllm_kv_events import KvEventReader

        self.kv_relay = KvRelay(cache.block_size, cache.num_gpu_blocks or FALLBACK_KV_BLOCKS)
        self._kv_reader = KvEventReader(socket, asyncio.get_running_loop(), self.kv_relay.publish)
        self._kv_reader.start()
        logger.info("relaying KV-cache events: block size %d, %d blocks, epoch %s", cache.block_size,
                    self.kv_relay.max_blocks, self.kv_relay.epoch)

    async def _warm_up(self) -> None:
        """One token with logprobs before the worker says SERVING: vLLM-cpu 0.32 spends ~3-4.5 s
        on the first request that asks for logprobs (lazy setup), which would otherwise land on a
        user's TTFT, and which the engine stall watch could take for a hang."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = VllmSamplingParams(max_tokens=1, logprobs=1, output_kind=RequestOutputKind.FINAL_ONLY)
        started = time.monotonic()
        try:
            async for _ in self._llm.generate(TokensPrompt(prompt_token_ids=[1, 2, 3]), params, "vllm-fleet-warm-up"):
                pass
        except Exception:  # a model that refuses these ids still serves; the warm-up is only an optimisation
            logger.warning("warm-up request failed; the first request with logprobs may be slow", exc_info=True)
            return
        logger.info("warm-up (one token with logprobs) took %.1fs", time.monotonic() - started)

    def _parser_class(self) -> type | None:
        """vLLM's tool/reasoning parser for the configured names (parsing.py); None when neither is set."""
        if not (self.config.tool_call_parser or self.config.reasoning_parser):
            return None
        from vllm_fleet.worker.openai.parsing import parser_class

        return parser_class(self.config.tool_call_parser, self.config.reasoning_parser,
                            enable_auto_tool_choice=self.config.enable_auto_tool_choice, tokenizer=self._tokenizer)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def info(self) -> WorkerInfo:
        import vllm

        cfg = self._llm.vllm_config
        settings = {
            "dtype": str(cfg.model_config.dtype).removeprefix("torch."),
            "dtype_reason": self._dtype_choice.reason if self._dtype_choice else "",
            "max_num_seqs": str(cfg.scheduler_config.max_num_seqs),
            "scheduling_policy": str(cfg.scheduler_config.policy),
            "block_size": str(cfg.cache_config.block_size),
            "num_kv_blocks": str(cfg.cache_config.num_gpu_blocks or 0),
            "enable_prefix_caching": str(cfg.cache_config.enable_prefix_caching),
            "tensor_parallel_size": str(cfg.parallel_config.tensor_parallel_size),
            "model_path": str(cfg.model_config.model),
            "vocab_size": str(cfg.model_config.get_vocab_size()),
            "tool_call_parser": self.config.tool_call_parser or "",
            "enable_auto_tool_choice": str(self.config.enable_auto_tool_choice),
            "reasoning_parser": self.config.reasoning_parser or "",
        }
        return WorkerInfo(model=self._served_name, max_model_len=self._max_model_len, engine="vllm",
                          engine_version=vllm.__version__, settings=settings, kv_block_size=cfg.cache_config.block_size,
                          tasks=list(self.tasks), pooling_endpoints=list(self.pooling_endpoints))

    async def pool(self, request: PoolRequest) -> PoolResult:
        if self._pooling is None:
            return await super().pool(request)  # a generating model: refused, naming the model
        return await self._pooling.run(request)

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def vocab_size(self) -> int | None:
        return self._llm.vllm_config.model_config.get_vocab_size() if self._llm is not None else None

    async def render(self, request: Any) -> RenderedPrompt:
        """vLLM's own rendering of a request (openai/render.py)."""
        if self._renderer is None:
            raise WorkerUnavailableError("the engine is not started")
        return await self._renderer.render(request)

    async def introspect(self, endpoint: str, body: dict[str, Any]) -> Any:
        if self._introspection is None:
            raise WorkerUnavailableError("the engine is not started")
        return await self._introspection.answer(endpoint, body)

    def decode(self, token_ids: list[int]) -> str:
        if self._tokenizer is None:
            return ""
        return self._tokenizer.decode(token_ids, skip_special_tokens=True)

    async def generate(
        self, engine_request_id: str, prompt_token_ids: list[int], params: Any, *, priority: int = 0,
        adapter: Any = None, cache_salt: str | None = None,
    ) -> AsyncIterator[list[SampleDelta]]:
        """`params`: vLLM's SamplingParams with output kind DELTA, as `prepare` made them."""
        from vllm.inputs import TokensPrompt

        extra: dict[str, Any] = {"priority": priority} if self.schedules_by_priority else {}
        if adapter is not None:
            extra["lora_request"] = self._lora_request(adapter)
        prompt = TokensPrompt(prompt_token_ids=prompt_token_ids)
        if cache_salt is not None:
            prompt["cache_salt"] = cache_salt
        stream = self._llm.generate(prompt, params, engine_request_id, **extra)
        refused = vllm_error_types()
        try:
            async for output in stream:
                cached = output.num_cached_tokens or 0
                # vLLM sends the prompt's logprobs once, with the output that ends prefill.
                prompt_logprobs = (self._convert_prompt_logprobs(output.prompt_token_ids, output.prompt_logprobs)
                                   if output.prompt_logprobs else None)
                yield [
                    SampleDelta(
                        sample=completion.index,
                        text=completion.text,
                        token_ids=list(completion.token_ids),
                        finish_reason=completion.finish_reason,
                        stop_reason=None if completion.stop_reason is None else str(completion.stop_reason),
                        logprobs=self._convert_logprobs(completion) if params.logprobs is not None else None,
                        cached_tokens=cached,
                        prompt_logprobs=prompt_logprobs,
                    )
                    for completion in output.outputs
                ]
        except refused as exc:
            # vLLM checks some of a request only when it is added (e.g. a constraint's grammar);
            # its refusal names the field where vLLM knows it. A dead engine is not a refusal.
            if not self.healthy:
                raise
            raise invalid_request(exc) from None

    @staticmethod
    def _convert_logprobs(completion: Any) -> list[TokenLogprob] | None:
        if not completion.logprobs:
            return None
        result = []
        for token_id, candidates in zip(completion.token_ids, completion.logprobs):
            chosen = candidates.get(token_id)
            top = sorted(
                ((tid, lp.decoded_token or "", lp.logprob, lp.rank or 0) for tid, lp in candidates.items()),
                key=lambda t: t[3],
            )
            result.append(TokenLogprob(
                token_id=token_id,
                token=(chosen.decoded_token or "") if chosen else "",
                logprob=chosen.logprob if chosen else float("-inf"),
                top=[(tid, tok, lp) for tid, tok, lp, _ in top],
            ))
        return result

    def _convert_prompt_logprobs(self, prompt_ids: list[int], positions: Any) -> list[PromptLogprob]:
        """vLLM's prompt logprobs (one {token id: Logprob} per prompt token, None for the first), in
        vLLM's order. A token vLLM did not decode is decoded as vLLM's server does (`decode(id)`)."""
        result = []
        for token_id, position in zip(prompt_ids, positions):
            if position is None:
                result.append(PromptLogprob(token_id, self._decode_one(token_id), None))
                continue
            candidates = [(tid, lp.decoded_token if lp.decoded_token is not None else self._decode_one(tid),
                           lp.logprob, lp.rank or 0) for tid, lp in position.items()]
            chosen = next((c for c in candidates if c[0] == token_id), None)
            result.append(PromptLogprob(token_id, chosen[1] if chosen else self._decode_one(token_id),
                                        chosen[2] if chosen else float("-inf"), candidates))
        return result

    def _decode_one(self, token_id: int) -> str:
        return self._tokenizer.decode(token_id) if self._tokenizer is not None else ""

    def _lora_request(self, adapter: Any) -> Any:
        from vllm.lora.request import LoRARequest

        return LoRARequest(adapter.name, adapter.lora_id, adapter.path, base_model_name=self._served_name)

    async def add_adapter(self, adapter: Any) -> None:
        """Load the adapter's weights now (not at its first request), so a bad folder fails the load."""
        try:
            loaded = await self._llm.add_lora(self._lora_request(adapter))
        except (ValueError, TypeError, OSError, RuntimeError) as exc:
            if not self.healthy:
                raise
            raise InvalidRequestError(f"vLLM could not load the adapter at lora_path {adapter.path!r}: {exc}",
                                      param="lora_path") from None
        if not loaded:
            raise InvalidRequestError(f"vLLM refused the adapter at lora_path {adapter.path!r}", param="lora_path")

    async def remove_adapter(self, adapter: Any) -> None:
        await self._llm.remove_lora(adapter.lora_id)

    async def abort(self, engine_request_ids: list[str]) -> None:
        if self._llm is not None and engine_request_ids and not self._llm.errored:
            await self._llm.abort(engine_request_ids)

    def load(self) -> WorkerLoad:
        r = self._recorder
        hit_rate = r.prefix_hits / r.prefix_queries if r.prefix_queries else 0.0
        return WorkerLoad(running=r.running, waiting=r.waiting, kv_cache_usage=r.kv_cache_usage,
                          prefix_cache_hit_rate=hit_rate, output_tokens_per_s=r.tokens_per_s(),
                          prefix_cache_queries=r.prefix_queries, prefix_cache_hits=r.prefix_hits)

    @property
    def healthy(self) -> bool:
        return self._llm is not None and not self._llm.errored

    async def shutdown(self) -> None:
        if self.kv_relay is not None:
            self.kv_relay.close()
        if self._kv_reader is not None:
            await asyncio.to_thread(self._kv_reader.stop)
        elif self._kv_socket is not None:  # the engine never started
            self._kv_socket.close(linger=0)
            self._kv_socket = None
        if self._llm is not None:
            llm, self._llm = self._llm, None
            await asyncio.to_thread(llm.shutdown)
