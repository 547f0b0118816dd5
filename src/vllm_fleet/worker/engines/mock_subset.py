"""The mock engine's sampling where vLLM is not installed: a documented subset of the body.

With vLLM installed (every worker machine, and CI) the mock gets vLLM's own request model and
SamplingParams, exactly as the real engine does (prepare.py). A mock worker on a machine without
vLLM (a gateway host running control-plane checks) reads these body fields instead, with vLLM's
names and defaults, and refuses every other field by name rather than dropping it:

    max_tokens, max_completion_tokens, min_tokens, stop, include_stop_str_in_output, ignore_eos,
    logprobs (+ top_logprobs for chat), seed, temperature, top_p, top_k, logit_bias,
    allowed_token_ids, skip_special_tokens, and for chat add_generation_prompt.

Only the shape of each value is checked; the mock does not judge ranges as vLLM would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.sampling import requested_max_tokens
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest

if TYPE_CHECKING:
    from vllm_fleet.worker.engines.base import Engine
    from vllm_fleet.worker.prepare import PreparedInput

SUBSET = ("max_tokens", "max_completion_tokens", "min_tokens", "stop", "include_stop_str_in_output", "ignore_eos",
          "logprobs", "top_logprobs", "seed", "temperature", "top_p", "top_k", "logit_bias", "allowed_token_ids",
          "skip_special_tokens", "add_generation_prompt", "cache_salt")


@dataclass
class SubsetSampling:
    """The subset's sampling parameters, under vLLM SamplingParams' attribute names."""

    n: int = 1
    max_tokens: int = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    allowed_token_ids: list[int] | None = None
    skip_special_tokens: bool = True


async def subset_input(engine: Engine, request: GenerateRequest, item: GenerateInput) -> PreparedInput:
    from vllm_fleet.worker.openai.request import request_fields
    from vllm_fleet.worker.prepare import PreparedInput

    if request.body.endpoint == "messages":  # its meaning is vLLM's conversion (openai/messages.py)
        raise InvalidRequestError("the Messages API needs vLLM installed on the worker", param="model")
    fields = request_fields(request, item)
    unknown = sorted(set(fields) - set(SUBSET) - {"messages", "prompt", "n", "priority"})
    if unknown:
        raise InvalidRequestError(
            f"{', '.join(unknown)}: not honoured by the mock engine without vLLM installed (it reads only "
            f"{', '.join(SUBSET)}); install vLLM on the worker or leave the field out", param=unknown[0])
    shape = SimpleNamespace(messages=fields.get("messages"), prompt=fields.get("prompt"),
                            chat_template_kwargs=None, add_generation_prompt=fields.get("add_generation_prompt", True))
    prompt = await engine.render(shape)
    params = _sampling(fields, engine.max_model_len - len(prompt.token_ids))
    salt = fields.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise InvalidRequestError("cache_salt must be a non-empty string", param="cache_salt")
    return PreparedInput(prompt_token_ids=prompt.token_ids, engine_params=params, prompt_len=len(prompt.token_ids),
                         cache_salt=salt)


def _sampling(fields: dict[str, Any], room: int) -> SubsetSampling:
    def typed(name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        value = fields.get(name, default)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise InvalidRequestError(f"{name} must be of type {names} (got {value!r:.40})", param=name)
        return value

    stop = fields.get("stop") or []
    logprobs = typed("logprobs", (bool, int))
    if fields.get("messages") is not None:  # chat: a flag, with the count in top_logprobs
        logprobs = typed("top_logprobs", int, 0) if logprobs else None
    elif logprobs is False:
        logprobs = None
    max_tokens = requested_max_tokens(fields)
    try:
        bias = {int(token): float(value) for token, value in (typed("logit_bias", dict) or {}).items()}
    except (TypeError, ValueError):
        raise InvalidRequestError(f"logit_bias must map token ids to numbers (got {json.dumps(fields['logit_bias'])[:40]})",
                                  param="logit_bias") from None
    return SubsetSampling(
        n=fields["n"], max_tokens=room if max_tokens is None else min(max_tokens, room),  # vLLM clamps so too
        min_tokens=typed("min_tokens", int, 0),
        stop=[stop] if isinstance(stop, str) else list(stop), ignore_eos=bool(typed("ignore_eos", bool, False)),
        include_stop_str_in_output=bool(typed("include_stop_str_in_output", bool, False)), logprobs=logprobs,
        seed=typed("seed", int), logit_bias=bias, allowed_token_ids=typed("allowed_token_ids", list),
        skip_special_tokens=bool(typed("skip_special_tokens", bool, True)),
    )
