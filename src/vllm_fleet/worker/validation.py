"""Request checks that need no engine, and the prompt-length check that needs only its numbers.

Every message names the field and says what to change, and `param` carries the field's name;
status.py turns InvalidRequestError into gRPC INVALID_ARGUMENT.

An OpenAI request (`request.openai` set) gets vLLM's own checks on the vLLM engine (its request
model, vllm_prompt.py): here it meets only this worker's limits (n, logprobs), so a value vLLM
accepts is never refused by a stricter rule of ours; the mock engine, which has no vLLM, checks
its typed fields with `check_values` instead (engine.py). Typed requests get all the checks
below; what they leave open (e.g. min_p's range, logit_bias ids) vLLM checks when it builds
its params.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.types import CHAT_ROLES, GenerateRequest, SamplingParams


@dataclass(frozen=True)
class Limits:
    max_n: int
    max_inputs: int
    max_logprobs: int


def validate_request(request: GenerateRequest, limits: Limits) -> None:
    if not request.inputs:
        raise InvalidRequestError("the request has no inputs; send at least one prompt", param="inputs")
    if len(request.inputs) > limits.max_inputs:
        raise InvalidRequestError(
            f"the request has {len(request.inputs)} inputs; this worker takes at most {limits.max_inputs} per request",
            param="inputs",
        )
    if request.openai is None:
        validate_params(request.params, limits)
    else:
        validate_limits(request.params, limits)
    n = request.params.n or 1
    for index, item in enumerate(request.inputs):
        where = f"input {index}"
        if item.messages is not None:
            if not item.messages:
                raise InvalidRequestError(f"{where}: messages is empty; send at least one message", param="messages")
            for position, message in enumerate(item.messages):
                if message.role not in CHAT_ROLES:
                    raise InvalidRequestError(
                        f"{where}: message {position} has unknown role {message.role!r}; "
                        f"use one of {', '.join(CHAT_ROLES)}",
                        param="messages",
                    )
        elif item.token_ids is not None:
            if not item.token_ids:
                raise InvalidRequestError(f"{where}: token_ids is empty", param="prompt")
        elif not item.text:
            raise InvalidRequestError(f"{where}: the prompt is empty", param="prompt")
        if item.resume_token_ids and n != 1:
            raise InvalidRequestError(f"{where}: resume_token_ids needs n=1 (resume each sample on its own)",
                                      param="n")


def validate_limits(params: SamplingParams, limits: Limits) -> None:
    """This worker's own bounds, which hold whatever vLLM accepts."""
    if params.n is not None and not 1 <= params.n <= limits.max_n:
        raise InvalidRequestError(f"n must be between 1 and {limits.max_n} (got {params.n})", param="n")
    if params.logprobs is not None and not 0 <= params.logprobs <= limits.max_logprobs:
        raise InvalidRequestError(f"logprobs must be between 0 and {limits.max_logprobs} (got {params.logprobs})",
                                  param="logprobs")


def validate_params(params: SamplingParams, limits: Limits) -> None:
    validate_limits(params, limits)
    check_values(params)


def check_values(params: SamplingParams) -> None:
    """Each typed field's own range and shape."""
    def bad(message: str, param: str) -> None:
        raise InvalidRequestError(message, param=param)

    if params.max_tokens is not None and params.max_tokens < 1:
        bad(f"max_tokens must be at least 1 (got {params.max_tokens})", "max_tokens")
    if params.min_tokens is not None and params.min_tokens < 0:
        bad(f"min_tokens must be 0 or more (got {params.min_tokens})", "min_tokens")
    if params.min_tokens and params.max_tokens is not None and params.min_tokens > params.max_tokens:
        bad(f"min_tokens ({params.min_tokens}) is larger than max_tokens ({params.max_tokens})", "min_tokens")
    if params.temperature is not None and not 0 <= params.temperature <= 2:
        bad(f"temperature must be between 0 and 2 (got {params.temperature})", "temperature")
    if params.top_p is not None and not 0 < params.top_p <= 1:
        bad(f"top_p must be in (0, 1] (got {params.top_p})", "top_p")
    if params.top_k is not None and params.top_k != -1 and params.top_k < 0:
        bad(f"top_k must be -1 (off), 0 (off) or positive (got {params.top_k})", "top_k")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(params, name)
        if value is not None and not -2 <= value <= 2:
            bad(f"{name} must be between -2 and 2 (got {value})", name)
    if params.repetition_penalty is not None and not 0 < params.repetition_penalty <= 2:
        bad(f"repetition_penalty must be in (0, 2] (got {params.repetition_penalty})", "repetition_penalty")
    if any(not s for s in params.stop):
        bad("stop strings must not be empty", "stop")
    if params.constraint is not None and params.constraint.kind is None:
        bad("constraint is empty: set one of json_schema, json_object, regex, choice, grammar, structural_tag",
            "constraint")


def check_prompt_fits(index: int, prompt_len: int, resume_len: int, max_tokens: int | None,
                      max_model_len: int, vocab_size: int | None, token_ids: list[int]) -> None:
    """The prompt (plus any resumed tokens) and the answer must fit in the model's context."""
    where = f"input {index}"
    if vocab_size is not None:
        bad_ids = [t for t in token_ids if t >= vocab_size]
        if bad_ids:
            raise InvalidRequestError(
                f"{where}: token id {bad_ids[0]} is outside the model's vocabulary of {vocab_size}", param="prompt"
            )
    total_prompt = prompt_len + resume_len
    if total_prompt >= max_model_len:
        raise InvalidRequestError(
            f"{where}: the prompt is {prompt_len} tokens, but the model's context is {max_model_len} tokens "
            f"and at least one must be left for the answer; shorten the prompt",
            param="prompt",
        )
    if max_tokens is not None and prompt_len + max_tokens > max_model_len:
        raise InvalidRequestError(
            f"{where}: the prompt is {prompt_len} tokens and max_tokens is {max_tokens}: "
            f"{prompt_len + max_tokens} tokens exceed the model's context of {max_model_len}; "
            f"lower max_tokens to at most {max_model_len - prompt_len} or shorten the prompt",
            param="max_tokens",
        )
