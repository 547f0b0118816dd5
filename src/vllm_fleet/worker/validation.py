"""The worker's own request rules: the envelope's shape and this worker's bounds, and the
prompt-length check that needs only its numbers.

Each rule is checked once, here, for every router (the gateway, Spark, the Python client): the
envelope's inputs and n, the worker's limits (--max-n, --max-inputs, --max-logprobs), priority
on an engine that does not schedule by it, and the context a resumed stream needs. What a
body field means and which values it takes is vLLM's rule, checked by vLLM's request model
(prepare.py), never restated here. Every message names the field and says what to change;
status.py turns InvalidRequestError into gRPC INVALID_ARGUMENT.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.types import GenerateRequest


@dataclass(frozen=True)
class Limits:
    max_n: int
    max_inputs: int
    max_logprobs: int


def validate_request(request: GenerateRequest, limits: Limits, *, schedules_by_priority: bool) -> None:
    if not request.inputs:
        raise InvalidRequestError("the request has no inputs; send at least one prompt", param="inputs")
    if len(request.inputs) > limits.max_inputs:
        raise InvalidRequestError(
            f"the request has {len(request.inputs)} inputs; this worker takes at most {limits.max_inputs} per request",
            param="inputs",
        )
    if not 1 <= request.n <= limits.max_n:
        raise InvalidRequestError(f"n must be between 1 and {limits.max_n} (got {request.n})", param="n")
    if request.priority and not schedules_by_priority:
        raise InvalidRequestError(
            f"priority {request.priority} needs a worker that schedules by priority "
            "(vllm-fleet worker --engine-arg scheduling_policy=priority); send priority 0 here", param="priority")
    for index, item in enumerate(request.inputs):
        where = f"input {index}"
        if item.messages is not None:
            if not item.messages:
                raise InvalidRequestError(f"{where}: messages is empty; send at least one message", param="messages")
        elif item.token_ids is not None:
            if not item.token_ids:
                raise InvalidRequestError(f"{where}: token_ids is empty", param="prompt")
        elif not item.text:
            raise InvalidRequestError(f"{where}: the prompt is empty", param="prompt")
        if item.resume_token_ids and request.n != 1:
            raise InvalidRequestError(f"{where}: resume_token_ids needs n=1 (resume each sample on its own)",
                                      param="n")


def check_logprobs(logprobs: int | None, max_logprobs: int) -> None:
    """This worker's bound on top logprobs per token, on the value vLLM read from the body."""
    if logprobs is not None and not 0 <= logprobs <= max_logprobs:
        raise InvalidRequestError(f"logprobs must be between 0 and {max_logprobs} (got {logprobs})",
                                  param="logprobs")


def check_prompt_fits(index: int, prompt_len: int, resume_len: int, max_model_len: int, vocab_size: int | None,
                      token_ids: list[int]) -> None:
    """The prompt the engine will run (the rendered prompt plus any resumed tokens) must leave room
    for an answer, and token ids must be in the vocabulary. vLLM's renderer checks the rendered
    prompt of a fresh request too; the resumed tokens are ours to add, so this check is ours.
    (The answer's length needs no check: max_tokens was clamped to the room left, as vLLM does.)"""
    where = f"input {index}"
    if vocab_size is not None:
        bad_ids = [t for t in token_ids if t >= vocab_size]
        if bad_ids:
            raise InvalidRequestError(
                f"{where}: token id {bad_ids[0]} is outside the model's vocabulary of {vocab_size}", param="prompt"
            )
    if prompt_len + resume_len >= max_model_len:
        raise InvalidRequestError(
            f"{where}: the prompt is {prompt_len} tokens, but the model's context is {max_model_len} tokens "
            f"and at least one must be left for the answer; shorten the prompt",
            param="prompt",
        )
