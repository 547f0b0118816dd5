"""One input of a request, made into an engine prompt: tokenize, check it fits, apply a resume.

A resumed input (migration) continues from the tokens another worker already sent: they join
the prompt and count against max_tokens / min_tokens; a character they end inside of is held
and regenerated (resume.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.types import GenerateRequest, SamplingParams
from vllm_fleet.worker.engine import Engine
from vllm_fleet.worker.resume import HeldTokens, held_tail_length
from vllm_fleet.worker.validation import check_prompt_fits


@dataclass
class PreparedInput:
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt_len: int
    exhausted: bool = False  # resumed with no tokens left to generate
    held: HeldTokens | None = None  # resumed mid-character: tokens to regenerate silently


async def prepare_input(engine: Engine, index: int, request: GenerateRequest) -> PreparedInput:
    """Raises InvalidRequestError when the input cannot be served (empty, too long, bad ids)."""
    item = request.inputs[index]
    prompt_ids = await engine.tokenize(item)
    if not prompt_ids:
        raise InvalidRequestError(f"input {index}: the prompt tokenizes to nothing", param="prompt")
    params = request.params
    resume = item.resume_token_ids
    check_prompt_fits(index, len(prompt_ids), len(resume), params.max_tokens, engine.max_model_len,
                      engine.vocab_size, prompt_ids + resume if item.token_ids is not None or resume else [])
    if not resume:
        return PreparedInput(prompt_token_ids=prompt_ids, params=params, prompt_len=len(prompt_ids))
    held = None
    held_count = held_tail_length(engine.decode, resume)
    if held_count:
        held = HeldTokens(resume[-held_count:])
        resume = resume[:-held_count]
    # The tokens already sent count against the budget; the rest is generated here.
    updates = {}
    exhausted = False
    if params.max_tokens is not None:
        updates["max_tokens"] = params.max_tokens - len(resume)
        exhausted = updates["max_tokens"] < 1
    if params.min_tokens:
        updates["min_tokens"] = max(0, params.min_tokens - len(resume))
    return PreparedInput(prompt_token_ids=prompt_ids + list(resume), params=dataclasses.replace(params, **updates),
                         prompt_len=len(prompt_ids), exhausted=exhausted, held=held)
