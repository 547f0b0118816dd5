"""vLLM's outputs in our terms: a RequestOutput (output kind DELTA) becomes one SampleDelta
per sample that stepped, with its logprobs and the prompt's. vLLM's text is used as is: its
detokenizer already holds back partial UTF-8 characters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_fleet.protocol.types import PromptLogprob, TokenLogprob
from vllm_fleet.worker.engines.base import SampleDelta


def sample_deltas(output: Any, want_logprobs: bool, decode_one: Callable[[int], str]) -> list[SampleDelta]:
    """One RequestOutput as deltas; `decode_one` decodes a prompt token vLLM did not decode."""
    cached = output.num_cached_tokens or 0
    # vLLM sends the prompt's logprobs once, with the output that ends prefill.
    prompt_logprobs = (convert_prompt_logprobs(output.prompt_token_ids, output.prompt_logprobs, decode_one)
                       if output.prompt_logprobs else None)
    return [
        SampleDelta(
            sample=completion.index,
            text=completion.text,
            token_ids=list(completion.token_ids),
            finish_reason=completion.finish_reason,
            stop_reason=None if completion.stop_reason is None else str(completion.stop_reason),
            logprobs=convert_logprobs(completion) if want_logprobs else None,
            cached_tokens=cached,
            prompt_logprobs=prompt_logprobs,
        )
        for completion in output.outputs
    ]


def convert_logprobs(completion: Any) -> list[TokenLogprob] | None:
    """A sample's new tokens' logprobs, each with its top candidates in vLLM's rank order."""
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


def convert_prompt_logprobs(prompt_ids: list[int], positions: Any,
                            decode_one: Callable[[int], str]) -> list[PromptLogprob]:
    """vLLM's prompt logprobs (one {token id: Logprob} per prompt token, None for the first), in
    vLLM's order. A token vLLM did not decode is decoded as vLLM's server does (`decode(id)`)."""
    result = []
    for token_id, position in zip(prompt_ids, positions):
        if position is None:
            result.append(PromptLogprob(token_id, decode_one(token_id), None))
            continue
        candidates = [(tid, lp.decoded_token if lp.decoded_token is not None else decode_one(tid),
                       lp.logprob, lp.rank or 0) for tid, lp in position.items()]
        chosen = next((c for c in candidates if c[0] == token_id), None)
        result.append(PromptLogprob(token_id, chosen[1] if chosen else decode_one(token_id),
                                    chosen[2] if chosen else float("-inf"), candidates))
    return result
