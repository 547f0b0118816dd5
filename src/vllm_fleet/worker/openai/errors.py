"""vLLM's refusals of a request, as our InvalidRequestError naming the field vLLM named.

vLLM names used (both in vLLM 0.26 and 0.32): `vllm.exceptions.VLLMValidationError` (a ValueError
in 0.26; in 0.32 a VLLMClientError, which is not a ValueError, so both are caught by type here).
"""

from __future__ import annotations

import re

from vllm_fleet.errors import InvalidRequestError

# A refusal that names no field (vLLM 0.32's SamplingParams checks raise without `parameter`)
# starts with the field's name: "min_p must be in [0, 1], got 5.0."
_LEADING_FIELD = re.compile(r"\s*([a-z][a-z0-9_]*)\b")
_SAMPLING_FIELDS = frozenset((
    "n", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "bad_words",
    "max_tokens", "min_tokens", "logprobs", "prompt_logprobs", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logit_bias", "allowed_token_ids", "ignore_eos", "skip_special_tokens",
    "include_stop_str_in_output", "truncate_prompt_tokens", "structured_outputs",
))


def vllm_error_types() -> tuple[type[BaseException], ...]:
    """The exception types vLLM raises for a request it refuses (not for its own failures)."""
    from vllm import exceptions

    types: list[type[BaseException]] = [ValueError, TypeError, exceptions.VLLMValidationError]
    client_error = getattr(exceptions, "VLLMClientError", None)  # 0.32; absent in 0.26
    if client_error is not None:
        types.append(client_error)
    return tuple(types)


def invalid_request(exc: BaseException, default_param: str | None = None) -> InvalidRequestError:
    """vLLM's refusal of a request as our InvalidRequestError, keeping the field vLLM named (or the
    sampling field its message starts with, or `default_param`)."""
    param = getattr(exc, "parameter", None)
    if param is None:
        match = _LEADING_FIELD.match(str(exc))
        param = match.group(1) if match and match.group(1) in _SAMPLING_FIELDS else default_param
    return InvalidRequestError(f"vLLM refused the request: {exc}", param=param)
