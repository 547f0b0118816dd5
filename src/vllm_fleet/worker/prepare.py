"""One input of a request, made into an engine prompt: the engine's own preparation, the context
check, and a resume.

The engine gives the input its meaning (engine.py `prepare`: for vLLM, its own request models
and sampling parameters). A resumed input (migration) continues from the tokens another worker
already sent: they join the prompt and count against max_tokens / min_tokens; a character they
end inside of is held and regenerated (resume.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.types import GenerateRequest
from vllm_fleet.worker.engines.base import Engine
from vllm_fleet.worker.resume.held import HeldTokens, held_tail_length
from vllm_fleet.worker.resume.stops import StopResume, for_resume
from vllm_fleet.worker.validation import check_prompt_fits


@dataclass
class PreparedInput:
    """One input ready to run.

    `engine_params` is what Engine.generate takes (vLLM's SamplingParams, output kind DELTA, for
    the vLLM engine; our typed SamplingParams for the mock), already lowered by resumed tokens.
    `openai_request` is vLLM's ChatCompletionRequest / CompletionRequest (after the parser's
    adjust_request) when the request came as an OpenAI body to the vLLM engine, else None:
    RequestStream builds its tool/reasoning parsers from it, with `parser_cls` and `tokenizer`
    (the engine's; None on the typed path).
    `echo_text` is set for a completion with `echo`: the prompt's text, which RequestStream puts
    on the first chunk of each sample (Chunk.prompt_text).
    """

    prompt_token_ids: list[int]
    engine_params: Any
    prompt_len: int
    exhausted: bool = False  # resumed with no tokens left to generate
    held: HeldTokens | None = None  # resumed mid-character: tokens to regenerate silently
    openai_request: Any = None
    echo_text: str | None = None
    parser_cls: type | None = None
    tokenizer: Any = None
    stop_resume: StopResume | None = None  # resumed with held-back text or stop strings (stop_resume.py)


async def prepare_input(engine: Engine, index: int, request: GenerateRequest) -> PreparedInput:
    """Raises InvalidRequestError when the input cannot be served (empty, too long, bad ids)."""
    item = request.inputs[index]
    prompt = await engine.prepare(item, request)
    prompt_ids = prompt.prompt_token_ids
    if not prompt_ids:
        raise InvalidRequestError(f"input {index}: the prompt tokenizes to nothing", param="prompt")
    params = prompt.params
    resume = item.resume_token_ids
    check_prompt_fits(index, len(prompt_ids), len(resume), params.max_tokens, engine.max_model_len,
                      engine.vocab_size, prompt_ids + resume if item.token_ids is not None or resume else [])
    prepared = PreparedInput(prompt_token_ids=prompt_ids, engine_params=params, prompt_len=len(prompt_ids),
                             openai_request=prompt.openai_request, echo_text=prompt.echo_text)
    if prompt.openai_request is not None:
        prepared.parser_cls, prepared.tokenizer = engine.parser_cls, engine.tokenizer
    if not resume:
        return prepared
    held_count = held_tail_length(engine.decode, resume)
    if held_count:
        prepared.held = HeldTokens(resume[-held_count:])
        resume = resume[:-held_count]
    prepared.prompt_token_ids = prompt_ids + list(resume)
    prepared.engine_params, prepared.exhausted = _spend(params, len(resume))
    prepared.stop_resume = for_resume(engine.decode, prompt_ids, list(resume), item.resume_delivered_chars,
                                      prepared.engine_params)
    return prepared


def _spend(params: Any, used: int) -> tuple[Any, bool]:
    """A copy of `params` with `used` tokens taken off max_tokens and min_tokens, and whether
    none are left. Both engines' parameter types have these two attributes."""
    params = copy.copy(params)
    exhausted = False
    if params.max_tokens is not None:
        params.max_tokens -= used
        exhausted = params.max_tokens < 1
    if params.min_tokens:
        params.min_tokens = max(0, params.min_tokens - used)
    return params, exhausted
