"""The mock engine: a named stand-in for control-plane tests and benchmarks. Never a default.

Speaks the same protocol as the real engine, with deterministic output: each token depends
only on the two before it (`mock_next_token`, mock_tokens.py), so a migrated stream can be
checked against an uninterrupted one. It paces itself like an engine: a first-token delay
(fixed + per prompt token), then `tokens_per_s` per sequence, emitted in steps of ~10 ms.
Optionally `max_num_seqs` bounds concurrent sequences (the rest wait, as in a real scheduler).

It reads the same request body as the real engine, through the same preparation (prepare.py):
vLLM's request model and SamplingParams, so it checks and samples with vLLM's meaning. Of that
meaning it acts on n, max_tokens, min_tokens, stop strings (as vLLM streams them), logprobs,
skip_special_tokens, and steers its hashed tokens by `logit_bias` (a bias of +100 or more
forces a token, -100 or less bans it), `allowed_token_ids` (only those) and `seed` (a different,
repeatable answer per seed); see `MockSampling` (mock_tokens.py).

With `mock_tokenizer` (a real tokenizer folder) it renders prompts with that tokenizer (chat
template included), runs the configured tool/reasoning parsers, and with `mock_script` answers
every prompt with the script's tokens (mock_script.py), so parser behaviour can be tested,
migration included, without a model.

With `mock_kv_blocks` it keeps a simulated prefix cache (mock_prefix_cache.py): cached prompt
tokens are reported in usage and skip the per-token prefill delay, and the cache's changes are
published as KV-cache events (KvEvents), so routing by cache contents can be tested without vLLM.
With `mock_prefill_serial` prompts prefill one at a time, as one engine's prefills share its
compute, so a long prefill delays the first token of the prompts behind it.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

from vllm_fleet import __version__
from vllm_fleet.config import EngineConfig
from vllm_fleet.errors import ConfigError, InvalidRequestError
from vllm_fleet.protocol.pooling import EMBEDDINGS, PoolRequest, PoolResult
from vllm_fleet.protocol.types import PromptLogprob, TokenLogprob, WorkerInfo, WorkerLoad, content_text
from vllm_fleet.worker.adapters import HeldAdapter
from vllm_fleet.worker.engines.base import Engine, RenderedPrompt, SampleDelta
from vllm_fleet.worker.kv_relay import KvRelay
from vllm_fleet.worker.engines.mock_prefix_cache import MockPrefixCache
from vllm_fleet.worker.engines.mock_stops import apply_stop_strings
from vllm_fleet.worker.engines.mock_script import MockScript, load_tokenizer
from vllm_fleet.worker.engines.mock_pooling import mock_embeddings
from vllm_fleet.worker.engines.mock_tokens import GREEDY, SPECIALS, VOCAB, MockSampling, mock_next_token, word_tokens

_STEP_S = 0.01


class _StepClock:
    """One 10 ms step shared by every running sequence (--mock-batched-steps): they all wake in the
    same loop iteration, as a GPU engine hands one step's outputs to all its requests at once."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future] = []

    async def next_step(self) -> None:
        loop = asyncio.get_running_loop()
        if not self._waiters:
            loop.call_at((int(loop.time() / _STEP_S) + 1) * _STEP_S, self._step)
        waiter = loop.create_future()  # one per sequence: cancelling one never cancels the others
        self._waiters.append(waiter)
        await waiter

    def _step(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
DEFAULT_BLOCK_SIZE = 16  # the mock prefix cache's block size without --block-size (vLLM's GPU default)
RATE_WINDOW_S = 5  # Load's output tokens/s covers this many seconds


class MockEngine(Engine):
    name = "mock"

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._active = 0
        self._slots = asyncio.Semaphore(config.max_num_seqs) if config.max_num_seqs else None
        self._prefill_lane = asyncio.Lock() if config.mock_prefill_serial else None
        self._waiting = 0
        self._tasks: dict[str, asyncio.Event] = {}
        # [second, tokens] of the last seconds: Load's rate is over RATE_WINDOW_S, as the real
        # engine's is, so a stalled mock reports 0 tokens/s rather than a lifetime average.
        self._recent: collections.deque[list[int]] = collections.deque()
        self._alive = False
        self.tokenizer = None        # a real tokenizer, with mock_tokenizer
        self.enable_auto_tool_choice = config.enable_auto_tool_choice
        self._script: MockScript | None = None
        self._adapter_ids: set[int] = set()  # loaded adapters: a request on a removed one fails, as in vLLM
        self._prefix_cache: MockPrefixCache | None = None
        self._step_clock = _StepClock() if config.mock_batched_steps else None

    async def start(self) -> None:
        from vllm_fleet.worker.prepare import import_vllm_meaning

        await asyncio.to_thread(import_vllm_meaning)  # the mock prepares requests with vLLM's meaning too
        if self.config.mock_script and not self.config.mock_tokenizer:
            raise ConfigError("--mock-script needs --mock-tokenizer (the script is tokenized with it)")
        if self.config.mock_tokenizer:
            from vllm_fleet.worker.openai.parsing import parser_class

            self.tokenizer = load_tokenizer(self.config.mock_tokenizer)
            self.tokenizer_source = self.config.mock_tokenizer
            self.parser_cls = parser_class(self.config.tool_call_parser, self.config.reasoning_parser,
                                           enable_auto_tool_choice=self.config.enable_auto_tool_choice,
                                           tokenizer=self.tokenizer)
            if self.config.mock_script:
                self._script = MockScript.from_file(self.tokenizer, self.config.mock_script)
        if self.config.mock_kv_blocks:
            block_size = self.config.block_size or DEFAULT_BLOCK_SIZE
            self.kv_relay = KvRelay(block_size, self.config.mock_kv_blocks) if self.config.kv_events is not False else None
            self._prefix_cache = MockPrefixCache(self.config.mock_kv_blocks, block_size, self.kv_relay)
        if self.config.mock_pooling:  # an embedding model's stand-in (mock_pooling.py)
            self.tasks, self.pooling_endpoints = ("embed",), (EMBEDDINGS,)
        self._alive = True

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            model=self.config.served_model_name or self.config.model or "mock-model",
            max_model_len=self.max_model_len,
            engine="mock",
            engine_version=__version__,
            settings={
                "tokens_per_s": str(self.config.mock_tokens_per_s),
                "ttft_ms": str(self.config.mock_ttft_ms),
                "max_num_seqs": str(self.config.max_num_seqs or 0),
                "vocab_size": str(len(VOCAB)),
                "mock_kv_blocks": str(self.config.mock_kv_blocks),
                "num_kv_blocks": str(self.config.mock_kv_blocks),  # as vLLM's worker says its cache's size
                "scheduling_policy": "priority" if self.schedules_by_priority else "fcfs",
            },
            kv_block_size=self._prefix_cache.block_size if self._prefix_cache is not None else 0,
            tasks=list(self.tasks) if self.config.mock_pooling else [],
            pooling_endpoints=list(self.pooling_endpoints),
        )

    async def pool(self, request: PoolRequest) -> PoolResult:
        if not self.config.mock_pooling:
            return await super().pool(request)
        return await mock_embeddings(request, self.info().model, self.config.mock_ttft_ms / 1000)

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len or self.config.mock_max_model_len

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer) if self.tokenizer is not None else len(VOCAB)

    async def render(self, request: Any) -> RenderedPrompt:
        """A vLLM request's prompt: the real tokenizer's (chat template included) with
        mock_tokenizer, else one mock token per whitespace-separated word. Like vLLM's renderer
        (0.32's TokenizeParams), it refuses an answer length beyond the whole context; one that only
        overflows with the prompt is lowered to fit, by get_max_tokens, as vLLM does."""
        self._check_answer_length(request)
        return self._render(request)

    async def render_ids(self, request: Any, token_ids: list[int]) -> RenderedPrompt:
        """The given ids, after `render`'s check of the answer length (prepare.py checks the rest)."""
        self._check_answer_length(request)
        return RenderedPrompt(list(token_ids))

    def _check_answer_length(self, request: Any) -> None:
        for name in ("max_completion_tokens", "max_tokens"):
            requested = getattr(request, name, None)
            if requested is not None:
                if requested > self.max_model_len:
                    raise InvalidRequestError(
                        f"{name}={requested} cannot be greater than max_model_len={self.max_model_len}. "
                        "Please request fewer output tokens.", param=name)
                return

    def _render(self, request: Any) -> RenderedPrompt:
        messages = getattr(request, "messages", None)
        if messages is None:  # a completion: text, or token ids as they are
            prompt = request.prompt
            if isinstance(prompt, list):
                return RenderedPrompt(list(prompt))
            if self.tokenizer is not None:
                return RenderedPrompt(list(self.tokenizer.encode(prompt, add_special_tokens=False)), prompt)
            return RenderedPrompt(word_tokens(prompt), prompt)
        turns = [{"role": m["role"], "content": content_text(m.get("content"))} for m in messages]
        if self.tokenizer is not None:
            from vllm_fleet.worker.openai.parsing import chat_template_kwargs

            kwargs = {"add_generation_prompt": True, **chat_template_kwargs(request)}
            ids = self.tokenizer.apply_chat_template(turns, tokenize=True, **kwargs)
            return RenderedPrompt(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
        text = "".join(f" <|{turn['role']}|> {turn['content']}" for turn in turns) + " <|assistant|>"
        return RenderedPrompt(word_tokens(text), text)

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is not None:
            return self.tokenizer.decode(token_ids, skip_special_tokens=True)
        return "".join(VOCAB[i] for i in token_ids if i >= len(SPECIALS))

    async def generate(
        self, engine_request_id: str, prompt_token_ids: list[int], params: Any, *, priority: int = 0,
        adapter: HeldAdapter | None = None, cache_salt: str | None = None,
    ) -> AsyncIterator[list[SampleDelta]]:
        """`params`: vLLM's SamplingParams as prepare.py made them (or mock_subset.py's, without vLLM)."""
        self._verify(params)
        n = params.n
        max_tokens = params.max_tokens
        if self._slots is not None:
            self._waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self._waiting -= 1
        self._active += 1
        try:
            cached = 0
            if self._prefix_cache is not None:
                cached = self._prefix_cache.admit(prompt_token_ids, adapter.name if adapter is not None else "",
                                                  cache_salt or "")
            computed = len(prompt_token_ids) - cached  # cached tokens cost no prefill, as in vLLM
            prefill_s = computed * self.config.mock_prefill_ms_per_1k / 1e6
            await asyncio.sleep(self.config.mock_ttft_ms / 1000)
            if self._prefill_lane is None:
                await asyncio.sleep(prefill_s)
            else:
                async with self._prefill_lane:
                    await asyncio.sleep(prefill_s)
            if self._script is not None:
                steps = self._scripted_steps(prompt_token_ids, max_tokens, params, n)
            else:
                steps = self._hashed_steps(prompt_token_ids, max_tokens, params, n,
                                           adapter.name if adapter is not None else "", MockSampling.of(params))
            steps = apply_stop_strings(steps, params, self.decode)  # held-back text and all, as vLLM
            next_step = time.monotonic()
            for deltas in steps:
                if adapter is not None and adapter.lora_id not in self._adapter_ids:
                    raise RuntimeError(f"adapter {adapter.name!r} was removed while a request ran on it")
                if self.config.mock_stall_file:
                    await _wait_while_exists(self.config.mock_stall_file)
                count = len(deltas[0].token_ids)
                self._count_output(count * n)
                for delta in deltas:
                    delta.cached_tokens = cached
                yield deltas
                if self._step_clock is not None:
                    await self._step_clock.next_step()
                    continue
                next_step += count / self.config.mock_tokens_per_s
                await asyncio.sleep(max(0.0, next_step - time.monotonic()))
        finally:
            self._active -= 1
            if self._slots is not None:
                self._slots.release()

    def _verify(self, params: Any) -> None:
        """What vLLM's engine checks of the parameters against the model when a request is added
        (SamplingParams.verify), with vLLM's own checks, against the mock's vocabulary."""
        vocabulary = SimpleNamespace(get_vocab_size=lambda: self.vocab_size)
        for name in ("_validate_logit_bias", "_validate_allowed_token_ids", "_validate_stop_token_ids"):
            check = getattr(params, name, None)  # vLLM's private checks; absent ones are skipped
            if check is None:
                continue
            from vllm_fleet.worker.openai.errors import invalid_request, vllm_error_types

            try:
                check(vocabulary)
            except vllm_error_types() as exc:
                raise invalid_request(exc) from None

    def _hashed_steps(self, prompt_token_ids: list[int], max_tokens: int, params: Any,
                      n: int, adapter: str = "", sampling: MockSampling = GREEDY) -> Iterator[list[SampleDelta]]:
        """The deterministic hashed tokens, ~10 ms of tokens per step."""
        per_step = max(1, round(self.config.mock_tokens_per_s * _STEP_S))
        position = 0
        sequences = [list(prompt_token_ids[-2:]) for _ in range(n)]
        prompt_logprobs = (self._prompt_logprobs(prompt_token_ids)
                           if getattr(params, "prompt_logprobs", None) is not None else None)
        while position < max_tokens:
            count = min(per_step, max_tokens - position)
            deltas = []
            for sample in range(n):
                ids = []
                for k in range(count):
                    token = mock_next_token(sequences[sample], sample, first=position + k == 0, adapter=adapter,
                                            sampling=sampling)
                    sequences[sample] = [sequences[sample][-1], token]
                    ids.append(token)
                done = position + count >= max_tokens
                deltas.append(SampleDelta(
                    sample=sample,
                    text=self.decode(ids) if self.tokenizer is not None else "".join(VOCAB[i] for i in ids),
                    token_ids=ids,
                    finish_reason="length" if done else None,
                    logprobs=[TokenLogprob(i, VOCAB[i], -0.5) for i in ids] if params.logprobs is not None else None,
                    prompt_logprobs=prompt_logprobs if position == 0 else None,  # once, as vLLM sends them
                ))
            position += count
            yield deltas

    def _prompt_logprobs(self, prompt_token_ids: list[int]) -> list[PromptLogprob]:
        """The mock's prompt logprobs: none for the first token (as vLLM), -0.25 and rank 1 for the rest."""
        def token(i: int) -> str:
            return self.tokenizer.decode(i) if self.tokenizer is not None else (VOCAB[i] if i < len(VOCAB) else "")

        return [PromptLogprob(i, token(i), None) if k == 0
                else PromptLogprob(i, token(i), -0.25, [(i, token(i), -0.25, 1)])
                for k, i in enumerate(prompt_token_ids)]

    def _scripted_steps(self, prompt_token_ids: list[int], max_tokens: int, params: Any,
                        n: int) -> Iterator[list[SampleDelta]]:
        """The script after what the prompt already holds; every sample answers the same."""
        assert self._script is not None
        skip = params.skip_special_tokens if params.skip_special_tokens is not None else True
        for step in self._script.steps(prompt_token_ids, max_tokens, skip_special_tokens=skip):
            yield [SampleDelta(sample=sample, text=step.text, token_ids=list(step.token_ids),
                               finish_reason=step.finish_reason) for sample in range(n)]

    async def add_adapter(self, adapter: HeldAdapter) -> None:
        # The registry checked the folder; the mock holds no weights, only the name (it salts tokens).
        await asyncio.sleep(self.config.mock_ttft_ms / 1000)  # a load takes a moment, as a real one does
        self._adapter_ids.add(adapter.lora_id)

    async def remove_adapter(self, adapter: HeldAdapter) -> None:
        self._adapter_ids.discard(adapter.lora_id)

    async def abort(self, engine_request_ids: list[str]) -> None:
        # Requests are aborted by cancelling their consumer; nothing else holds state.
        return None

    def _count_output(self, tokens: int) -> None:
        second = int(time.monotonic())
        if self._recent and self._recent[-1][0] == second:
            self._recent[-1][1] += tokens
            return
        self._recent.append([second, tokens])
        while self._recent[0][0] <= second - RATE_WINDOW_S:
            self._recent.popleft()

    def load(self) -> WorkerLoad:
        since = int(time.monotonic()) - RATE_WINDOW_S
        capacity = self.config.max_num_seqs or 256
        cache = self._prefix_cache
        return WorkerLoad(
            running=self._active,
            waiting=self._waiting,
            kv_cache_usage=min(1.0, self._active / capacity),
            output_tokens_per_s=sum(n for second, n in self._recent if second > since) / RATE_WINDOW_S,
            prefix_cache_hit_rate=cache.hits / cache.queries if cache is not None and cache.queries else 0.0,
            prefix_cache_queries=cache.queries if cache is not None else 0,
            prefix_cache_hits=cache.hits if cache is not None else 0,
        )

    @property
    def healthy(self) -> bool:
        return self._alive

    async def shutdown(self) -> None:
        self._alive = False
        if self.kv_relay is not None:
            self.kv_relay.close()


async def _wait_while_exists(path: str) -> None:
    """The stall double: no step while `path` exists (the loop stays free, as a worker's does
    while its EngineCore process is wedged)."""
    while os.path.exists(path):
        await asyncio.sleep(_STEP_S)

