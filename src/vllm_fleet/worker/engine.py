"""The interface between the gRPC service and an inference engine.

The service owns everything protocol-shaped (validation, coalescing, metrics, draining);
an engine only tokenizes, generates and reports its load. Two implementations:
`VllmEngine` (the real one, vLLM's AsyncLLM) and `MockEngine` (a named stand-in).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass

from vllm_fleet.protocol.types import GenerateInput, SamplingParams, TokenLogprob, WorkerInfo, WorkerLoad


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


class Engine(abc.ABC):
    """One inference engine. All methods run on the worker's event loop."""

    name: str = "engine"

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

    @abc.abstractmethod
    def decode(self, token_ids: list[int]) -> str:
        """Text of a token sequence (special tokens skipped, as in generated text)."""

    @abc.abstractmethod
    def generate(
        self, engine_request_id: str, prompt_token_ids: list[int], params: SamplingParams, *, priority: int = 0
    ) -> AsyncIterator[list[SampleDelta]]:
        """Stream deltas. Cancelling the consumer must abort the request in the engine."""

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
        from vllm_fleet.worker.mock_engine import MockEngine

        return MockEngine(config)
    from vllm_fleet.worker.vllm_engine import VllmEngine

    return VllmEngine(config)
