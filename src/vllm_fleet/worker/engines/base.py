"""The interface between the gRPC service and an inference engine.

The service owns everything protocol-shaped (validation, coalescing, metrics, draining), and
prepare.py gives every request vLLM's meaning the same way for every engine; an engine only
renders prompts, generates and reports its load. Two implementations:
`VllmEngine` (the real one, vLLM's AsyncLLM) and `MockEngine` (a named stand-in).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from vllm_fleet.errors import IntrospectUnsupportedError, InvalidRequestError
from vllm_fleet.protocol.pooling import PoolRequest, PoolResult
from vllm_fleet.protocol.types import PromptLogprob, TokenLogprob, WorkerInfo, WorkerLoad
from vllm_fleet.worker.kv_relay import KvRelay


@dataclass(slots=True)
class SampleDelta:
    """What one engine step produced for one sample of one input."""

    sample: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: str | None = None
    logprobs: list[TokenLogprob] | None = None
    cached_tokens: int = 0
    # The prompt's logprobs (vLLM's prompt_logprobs), on the step that ends prefill; None otherwise.
    prompt_logprobs: list[PromptLogprob] | None = None


@dataclass(slots=True)
class RenderedPrompt:
    """A request's prompt as the engine will run it: its token ids, and its text where the
    renderer has it (a completion's `echo` sends it; None: decode the ids)."""

    token_ids: list[int]
    text: str | None = None


class Engine(abc.ABC):
    """One inference engine. All methods run on the worker's event loop."""

    name: str = "engine"
    # vLLM's tool/reasoning parser class for OpenAI chat requests (parsing.parser_class), set by
    # an engine that has one once started; RequestStream builds one parser per sample from it.
    parser_cls: type | None = None
    # The model's tokenizer as the parsers take it (vLLM's); None for an engine without one.
    tokenizer: Any = None
    # Where that tokenizer was loaded from (a folder, a Hub id or a GGUF file) and its revision:
    # the files TokenizerFiles sends routers (worker/tokenizer_files.py). None: no tokenizer.
    tokenizer_source: str | None = None
    tokenizer_revision: str | None = None
    # --enable-auto-tool-choice: tool_choice "auto" is accepted without a tool parser (vLLM's flag).
    enable_auto_tool_choice: bool = False
    # The relay of the engine's KV-cache events (KvEvents RPC), set once started by an engine that
    # publishes them; None: KvEvents is refused.
    kv_relay: KvRelay | None = None

    async def introspect(self, endpoint: str, body: dict[str, Any]) -> Any:
        """vLLM's JSON answer to one of `vllm serve`'s token/render endpoints (openai/introspect.py)."""
        raise IntrospectUnsupportedError(f"the {self.name} engine has no vLLM tokenizer or renderer to answer "
                                         f"{endpoint}: run the worker with --engine vllm")

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model; return when the engine can generate."""

    @abc.abstractmethod
    def info(self) -> WorkerInfo:
        """Model name, context length, engine settings (worker-level fields are filled by the service)."""

    @property
    @abc.abstractmethod
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int | None:
        return None

    # What the engine adds to vLLM's meaning of a request (prepare.py): the model's generation
    # config as sampling defaults, and a max_tokens the operator set for every request.
    sampling_defaults: dict[str, Any] = {}
    max_tokens_override: int | None = None
    # Whether the engine schedules by priority: a request with a priority is refused otherwise,
    # as vLLM refuses it, rather than run in arrival order without saying so.
    schedules_by_priority: bool = False

    @abc.abstractmethod
    async def render(self, request: Any) -> RenderedPrompt:
        """The prompt of one vLLM request (a ChatCompletionRequest with its chat template, or a
        CompletionRequest's text or ids), rendered and tokenized as this engine's model does.

        Raises InvalidRequestError for input the model cannot take.
        """

    async def render_ids(self, request: Any, token_ids: list[int]) -> RenderedPrompt:
        """`request`'s prompt as the given ids (a router's rendering, worker/router_ids.py), with the
        checks `render` makes on a rendered prompt (context length, the answer's room), without
        rendering or tokenizing. Raises InvalidRequestError as `render` does."""
        raise NotImplementedError(f"the {self.name} engine cannot run given prompt ids")

    @abc.abstractmethod
    def decode(self, token_ids: list[int]) -> str:
        """Text of a token sequence (special tokens skipped, as in generated text)."""

    @abc.abstractmethod
    def generate(
        self, engine_request_id: str, prompt_token_ids: list[int], params: Any, *, priority: int = 0,
        adapter: Any = None, cache_salt: str | None = None,
    ) -> AsyncIterator[list[SampleDelta]]:
        """Stream deltas. `params` is vLLM's SamplingParams (output kind DELTA) as prepare.py made
        them (the mock also takes the documented subset of mock_subset.py where vLLM is missing);
        `adapter` a HeldAdapter (adapters.py) to generate with, None for the base model;
        `cache_salt` the request's (vLLM's meaning: its prefix-cache blocks are shared only with
        requests of the same salt).
        Cancelling the consumer must abort the request in the engine."""

    # What the served model does (vLLM's supported tasks), and the pooling endpoints it serves
    # (protocol/pooling.py), as WorkerInfo says them; set once started.
    tasks: tuple[str, ...] = ("generate",)
    pooling_endpoints: tuple[str, ...] = ()

    async def pool(self, request: PoolRequest) -> PoolResult:
        """vLLM's answer to a pooling request (worker/pooling.py). Cancelling the caller aborts
        its engine requests. Raises InvalidRequestError for input the model cannot take."""
        raise InvalidRequestError(f"this worker's model generates text; it serves no {request.endpoint!r} "
                                  f"endpoint (start a worker with a pooling model)", param="model")

    async def add_adapter(self, adapter: Any) -> None:
        """Load a LoRA adapter (a HeldAdapter, checked by the registry); the engine's errors propagate."""
        raise NotImplementedError(f"the {self.name} engine has no LoRA adapters")

    async def remove_adapter(self, adapter: Any) -> None:
        """Free an adapter's slot; no request runs on it any more."""
        raise NotImplementedError(f"the {self.name} engine has no LoRA adapters")

    @abc.abstractmethod
    async def abort(self, engine_request_ids: list[str]) -> None: ...

    @abc.abstractmethod
    def load(self) -> WorkerLoad:
        """Running/waiting/KV usage/prefix hit rate/tokens per second, as last observed."""

    @property
    @abc.abstractmethod
    def healthy(self) -> bool:
        """True while the engine can generate."""

    @abc.abstractmethod
    async def shutdown(self) -> None: ...


def build_engine(config) -> Engine:
    """The engine a config names. The vLLM import happens only when the vLLM engine is asked for."""
    if config.engine == "mock":
        from vllm_fleet.worker.engines.mock_engine import MockEngine

        return MockEngine(config)
    from vllm_fleet.worker.engines.vllm_engine import VllmEngine

    return VllmEngine(config)
