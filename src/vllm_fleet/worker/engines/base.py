"""The interface between the gRPC service and an inference engine.

The service owns everything protocol-shaped (validation, coalescing, metrics, draining);
an engine only tokenizes, generates and reports its load. Two implementations:
`VllmEngine` (the real one, vLLM's AsyncLLM) and `MockEngine` (a named stand-in).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, TokenLogprob, WorkerInfo, WorkerLoad
from vllm_fleet.worker.validation import check_values


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


@dataclass(slots=True)
class EnginePrompt:
    """One input as the engine will run it: its prompt ids and the parameters `generate` takes.

    `params` is engine-shaped: vLLM's own SamplingParams (output kind DELTA) for the vLLM
    engine, our typed SamplingParams for the mock. Either has `max_tokens` and `min_tokens`,
    which prepare.py lowers by the tokens a resumed input already has.
    `openai_request` is vLLM's ChatCompletionRequest / CompletionRequest (after the parser's
    adjust_request) for an OpenAI request on the vLLM engine, else None; `echo_text` is the
    prompt text a completion with `echo` sends first.
    """

    prompt_token_ids: list[int]
    params: Any
    openai_request: Any = None
    echo_text: str | None = None


class Engine(abc.ABC):
    """One inference engine. All methods run on the worker's event loop."""

    name: str = "engine"
    # vLLM's tool/reasoning parser class for OpenAI chat requests (parsing.parser_class), set by
    # an engine that has one once started; RequestStream builds one parser per sample from it.
    parser_cls: type | None = None
    # The model's tokenizer as the parsers take it (vLLM's); None for an engine without one.
    tokenizer: Any = None

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

    @abc.abstractmethod
    async def tokenize(self, item: GenerateInput) -> list[int]:
        """Prompt token ids for one input (chat template applied for chat inputs).

        Raises InvalidRequestError for input the model cannot take (e.g. an unsupported role).
        """

    async def prepare(self, item: GenerateInput, request: GenerateRequest) -> EnginePrompt:
        """One input of `request` made ready for `generate`; raises InvalidRequestError for bad input.

        The default (the mock) tokenizes and keeps our typed SamplingParams; the vLLM engine
        gives the request vLLM's meaning (its own request models for OpenAI bodies). With no
        vLLM to check an OpenAI request's fields, the default checks their typed copies.
        """
        if request.openai is not None:
            check_values(request.params)
        return EnginePrompt(await self.tokenize(item), request.params)

    @abc.abstractmethod
    def decode(self, token_ids: list[int]) -> str:
        """Text of a token sequence (special tokens skipped, as in generated text)."""

    @abc.abstractmethod
    def generate(
        self, engine_request_id: str, prompt_token_ids: list[int], params: Any, *, priority: int = 0,
        adapter: Any = None,
    ) -> AsyncIterator[list[SampleDelta]]:
        """Stream deltas. `params` is what this engine's `prepare` made (EnginePrompt.params);
        `adapter` a HeldAdapter (adapters.py) to generate with, None for the base model.
        Cancelling the consumer must abort the request in the engine."""

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
