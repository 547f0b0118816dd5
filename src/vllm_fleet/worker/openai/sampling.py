"""Our typed SamplingParams (Spark, the Python client) as vLLM's own SamplingParams.

Each field keeps vLLM's meaning: we only carry values across, and vLLM checks them (its
ValueError / VLLMValidationError becomes an InvalidRequestError naming the field, through
`invalid_request`). What is ours to check is the Constraint's shape: exactly one kind, and
JSON text where JSON is expected.

vLLM names used (both in vLLM 0.26 and 0.32): `vllm.SamplingParams`,
`vllm.sampling_params.StructuredOutputsParams` and `RequestOutputKind`,
`vllm.exceptions.VLLMValidationError` (a ValueError in 0.26; in 0.32 a VLLMClientError, which
is not a ValueError, so both are caught by type here).
"""

from __future__ import annotations

import json
from typing import Any

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.types import Constraint, SamplingParams

# Typed fields copied as they are when set (None: the model's default, then vLLM's).
_OPTIONAL = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "min_tokens", "seed", "n", "logprobs",
             "presence_penalty", "frequency_penalty", "repetition_penalty", "skip_special_tokens")


def vllm_error_types() -> tuple[type[BaseException], ...]:
    """The exception types vLLM raises for a request it refuses (not for its own failures)."""
    from vllm import exceptions

    types: list[type[BaseException]] = [ValueError, TypeError, exceptions.VLLMValidationError]
    client_error = getattr(exceptions, "VLLMClientError", None)  # 0.32; absent in 0.26
    if client_error is not None:
        types.append(client_error)
    return tuple(types)


def invalid_request(exc: BaseException, default_param: str | None = None) -> InvalidRequestError:
    """vLLM's refusal of a request as our InvalidRequestError, keeping the field vLLM named."""
    param = getattr(exc, "parameter", None) or default_param
    return InvalidRequestError(f"vLLM refused the request: {exc}", param=param)


def structured_outputs(constraint: Constraint) -> Any:
    """A Constraint as vLLM's StructuredOutputsParams; raises InvalidRequestError (param
    `constraint`) for one with no kind, several kinds, or JSON fields that are not JSON."""
    from vllm.sampling_params import StructuredOutputsParams

    kinds = [name for name in ("json_schema", "regex", "choice", "grammar", "structural_tag")
             if getattr(constraint, name) is not None] + (["json_object"] if constraint.json_object else [])
    if len(kinds) != 1:
        raise InvalidRequestError(
            "constraint must set exactly one of json_schema, json_object, regex, choice, grammar, structural_tag"
            + (f" (it sets {', '.join(kinds)})" if kinds else " (it sets none)"),
            param="constraint",
        )
    kind = kinds[0]
    if kind == "json_schema":
        return StructuredOutputsParams(json=_json_text(constraint.json_schema, "json_schema"))
    if kind == "structural_tag":
        _json_text(constraint.structural_tag, "structural_tag")  # vLLM takes it as text
        return StructuredOutputsParams(structural_tag=constraint.structural_tag)
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "choice":
        if not constraint.choice:
            raise InvalidRequestError("constraint.choice is empty; give at least one choice", param="constraint")
        return StructuredOutputsParams(choice=list(constraint.choice))
    value = getattr(constraint, kind)
    if not value:
        raise InvalidRequestError(f"constraint.{kind} is empty", param="constraint")
    return StructuredOutputsParams(**{kind: value})


def _json_text(text: str | None, name: str) -> Any:
    try:
        return json.loads(text or "")
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"constraint.{name} is not JSON: {exc}", param="constraint") from None


def vllm_sampling_params(params: SamplingParams, defaults: dict[str, Any]) -> Any:
    """vLLM's SamplingParams for our typed ones, on top of the model's generation-config
    defaults, streaming deltas. Raises InvalidRequestError for values vLLM refuses."""
    from vllm import SamplingParams as VllmSamplingParams
    from vllm.sampling_params import RequestOutputKind

    kwargs: dict[str, Any] = dict(defaults)
    for name in _OPTIONAL:
        value = getattr(params, name)
        if value is not None:
            kwargs[name] = value
    if params.stop:
        kwargs["stop"] = list(params.stop)
    if params.stop_token_ids:
        kwargs["stop_token_ids"] = list(params.stop_token_ids)
    if params.ignore_eos:
        kwargs["ignore_eos"] = True
    if params.include_stop_str_in_output:
        kwargs["include_stop_str_in_output"] = True
    if params.logit_bias:
        kwargs["logit_bias"] = dict(params.logit_bias)
    if params.bad_words:
        kwargs["bad_words"] = list(params.bad_words)
    if params.allowed_token_ids:
        kwargs["allowed_token_ids"] = list(params.allowed_token_ids)
    if params.constraint is not None:
        kwargs["structured_outputs"] = structured_outputs(params.constraint)
    try:
        return VllmSamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)
    except vllm_error_types() as exc:
        raise invalid_request(exc) from None


def truncate_prompt(prompt_ids: list[int], truncate_prompt_tokens: int | None, max_model_len: int,
                    max_tokens: int | None) -> list[int]:
    """vLLM's truncate_prompt_tokens: keep the last k prompt tokens (-1: as many as fit beside
    the answer)."""
    if truncate_prompt_tokens is None:
        return prompt_ids
    if truncate_prompt_tokens < -1:
        raise InvalidRequestError(
            f"truncate_prompt_tokens must be -1 or at least 0 (got {truncate_prompt_tokens})",
            param="truncate_prompt_tokens",
        )
    keep = truncate_prompt_tokens if truncate_prompt_tokens >= 0 else max_model_len - (max_tokens or 1)
    return prompt_ids[len(prompt_ids) - keep:] if len(prompt_ids) > keep else prompt_ids
