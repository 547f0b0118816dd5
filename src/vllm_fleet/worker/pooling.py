"""The worker's pooling endpoints: vLLM's own serving code for them, on the worker's AsyncLLM.

`vllm serve` answers /v1/embeddings, /pooling, /score, /rerank and /classify with serving
classes from `vllm.entrypoints.pooling` (0.32). The worker builds the same objects on its own
engine client, so a pooled request means exactly what it means to `vllm serve`: vLLM's request
model validates the body, vLLM renders and tokenizes the inputs, runs them as concurrent engine
requests (the engine batches them with everything else in flight), and shapes the answer.

What we add: the body is checked for fields vLLM would ignore (its request models accept and
log unknown keys; we refuse them, naming them), encoding formats whose answer is not JSON are
refused, and vLLM's refusals become InvalidRequestError naming the field.

vLLM versions: the module layout used here is 0.32's. On a vLLM without it (0.26 keeps these
classes elsewhere, with other constructors) `VllmPooling.build` raises ConfigError saying so,
and a generating model is unaffected.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from vllm_fleet.errors import ConfigError, InvalidRequestError
from vllm_fleet.protocol.pooling import CLASSIFY, EMBEDDINGS, POOLING, RERANK, SCORE, PoolRequest, PoolResult
from vllm_fleet.worker.openai.errors import invalid_request, vllm_error_types

logger = logging.getLogger(__name__)

# Answers that are JSON. vLLM 0.32 also has "bytes" / "bytes_only", answered as raw octets with
# metadata in headers; the Pool RPC carries JSON bodies only, so those are refused, by name.
JSON_ENCODINGS = ("float", "base64")
_MAX_ERRORS_SHOWN = 3


@dataclass(frozen=True)
class _Endpoint:
    request_type: Any      # pydantic TypeAdapter of vLLM's request model (a union for most)
    field_names: frozenset[str]  # every field any variant of the request model has
    handler: Any           # vLLM's serving object: `await handler(request)` → a Response


class VllmPooling:
    """The pooling endpoints vLLM serves for the loaded model, and one call to run a request."""

    def __init__(self, endpoints: dict[str, _Endpoint], schedules_by_priority: bool) -> None:
        self._endpoints = endpoints
        self._schedules_by_priority = schedules_by_priority

    @property
    def endpoints(self) -> list[str]:
        return sorted(self._endpoints)

    @classmethod
    def build(cls, llm: Any, served_name: str, model_path: str, supported_tasks: tuple[str, ...]) -> VllmPooling:
        """The serving objects `vllm serve` would make for this model (vLLM's factories.py decides
        which: an embedding model also scores by cosine similarity, a 1-label classifier scores)."""
        try:
            from pydantic import TypeAdapter
            from vllm.entrypoints.openai.models.protocol import BaseModelPath
            from vllm.entrypoints.openai.models.serving import OpenAIServingModels
            from vllm.entrypoints.pooling.classify.protocol import ClassificationRequest
            from vllm.entrypoints.pooling.classify.serving import ServingClassification
            from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest
            from vllm.entrypoints.pooling.embed.serving import ServingEmbedding
            from vllm.entrypoints.pooling.pooling.protocol import PoolingRequest
            from vllm.entrypoints.pooling.pooling.serving import ServingPooling
            from vllm.entrypoints.pooling.scoring.protocol import RerankRequest, ScoreRequest
            from vllm.entrypoints.pooling.scoring.serving import ServingScores
            from vllm.entrypoints.pooling.utils import enable_scoring_api
            from vllm.renderers.chat_utils import ChatTemplateConfig
            from vllm.tasks import POOLING_TASKS
        except ImportError as exc:
            import vllm

            raise ConfigError(f"serving a pooling model needs vLLM's pooling entrypoints of vLLM 0.32 "
                              f"(vllm.entrypoints.pooling); this worker runs vLLM {vllm.__version__}: {exc}") from None
        model_config = llm.model_config
        models = OpenAIServingModels(llm, [BaseModelPath(name=served_name, model_path=model_path)])
        common = dict(request_logger=None, chat_template_config=ChatTemplateConfig())
        pooling_task = model_config.get_pooling_task(supported_tasks)
        endpoints: dict[str, _Endpoint] = {}

        def add(name: str, request_model: Any, handler: Any) -> None:
            endpoints[name] = _Endpoint(TypeAdapter(request_model), _field_names(request_model), handler)

        if any(task in POOLING_TASKS for task in supported_tasks):
            add(POOLING, PoolingRequest, ServingPooling(llm, models, supported_tasks=supported_tasks, **common))
        if pooling_task == "embed":
            add(EMBEDDINGS, EmbeddingRequest, ServingEmbedding(llm, models, **common))
        if pooling_task == "classify":
            add(CLASSIFY, ClassificationRequest, ServingClassification(llm, models, **common))
        if enable_scoring_api(supported_tasks, model_config):
            scores = ServingScores(llm, models, supported_tasks=supported_tasks, **common)
            add(SCORE, ScoreRequest, scores)
            add(RERANK, RerankRequest, scores)
        schedules_by_priority = llm.vllm_config.scheduler_config.policy == "priority"
        return cls(endpoints, schedules_by_priority)

    async def run(self, request: PoolRequest) -> PoolResult:
        """vLLM's answer to one pooling request. InvalidRequestError for a body vLLM refuses, a
        field it would ignore, or an endpoint this model does not serve."""
        endpoint = self._endpoints.get(request.endpoint)
        if endpoint is None:
            served = ", ".join(self.endpoints) or "none"
            raise InvalidRequestError(f"this worker's model does not serve {request.endpoint!r} (it serves: {served})",
                                      param="model")
        body = _body_of(request.body_json)
        unknown = sorted(set(body) - endpoint.field_names)
        if unknown:
            raise InvalidRequestError(f"unknown field(s) {', '.join(unknown)} for {request.endpoint}: vLLM would "
                                      f"ignore them, so they are refused", param=unknown[0])
        encoding = body.get("encoding_format", "float")
        if encoding not in JSON_ENCODINGS:
            raise InvalidRequestError(f"encoding_format {encoding!r} is not served here; use one of "
                                      f"{', '.join(JSON_ENCODINGS)}", param="encoding_format")
        # The fleet's id names the engine requests (unique per attempt); the envelope's priority
        # is the fleet's (batch runs later than interactive), applied where vLLM schedules by it.
        body["request_id"] = request.request_id
        if request.priority and self._schedules_by_priority:
            body["priority"] = body.get("priority", 0) + request.priority
        parsed = self._parse(endpoint, body)
        try:
            response = await endpoint.handler(parsed)
        except vllm_error_types() as exc:
            raise invalid_request(exc, default_param=_field_named(str(exc), body)) from None
        return _result_of(response)

    @staticmethod
    def _parse(endpoint: _Endpoint, body: dict) -> Any:
        from pydantic import ValidationError

        try:
            return endpoint.request_type.validate_python(body)
        except ValidationError as exc:
            raise _validation_error(exc) from None
        except vllm_error_types() as exc:  # a validator that raised vLLM's own error
            raise invalid_request(exc, default_param="input") from None


def _field_named(message: str, body: dict) -> str:
    """The body field a vLLM refusal is about: the first of the body's fields its message names
    (vLLM's pooling checks name no `parameter`), else the input."""
    for name in sorted(body, key=message.find):
        if name not in ("model", "request_id") and re.search(rf"\b{re.escape(name)}\b", message):
            return name
    return "input"


def _body_of(body_json: bytes) -> dict:
    try:
        body = json.loads(body_json or b"{}")
    except ValueError as exc:
        raise InvalidRequestError(f"the request body is not JSON: {exc}", param="body") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object", param="body")
    return body


def _field_names(request_model: Any) -> frozenset[str]:
    """Field names (and aliases) of a request model or of every member of a union of them."""
    import typing

    members = [request_model]
    names: set[str] = set()
    while members:
        member = members.pop()
        if typing.get_origin(member) is typing.Annotated:
            members.append(typing.get_args(member)[0])
        elif hasattr(member, "model_fields"):
            for name, info in member.model_fields.items():
                names.add(name)
                if info.alias:
                    names.add(info.alias)
        else:
            members.extend(typing.get_args(member))
    return frozenset(names)


def _validation_error(exc: Any) -> InvalidRequestError:
    """pydantic's errors for a union request model: the first field named (variant names and
    validator tags in the location are skipped), the first few problems in the message."""
    errors = exc.errors()
    param = "input"
    for error in errors:
        fields = [p for p in error.get("loc") or () if isinstance(p, str) and p.isidentifier() and p[:1].islower()]
        if fields:
            param = fields[0]
            break
    problems = []
    for error in errors[:_MAX_ERRORS_SHOWN]:
        where = ".".join(str(p) for p in error.get("loc") or ())
        problems.append(f"{where}: {error.get('msg', 'invalid')}" if where else error.get("msg", "invalid"))
    return InvalidRequestError(f"invalid request: {'; '.join(problems)}", param=param)


def _result_of(response: Any) -> PoolResult:
    """vLLM's Response (JSON) as our result; an error it returned instead of raising, refused."""
    status = getattr(response, "status_code", 200)
    body = getattr(response, "body", None)
    if body is None and hasattr(response, "model_dump_json"):  # a pydantic response or ErrorResponse
        body = response.model_dump_json().encode()
        error = getattr(response, "error", None)
        if error is not None:
            status = getattr(error, "code", 400)
    if status >= 400 or body is None:
        raise InvalidRequestError(f"vLLM refused the request: {body.decode(errors='replace') if body else status}")
    try:
        prompt_tokens = int(json.loads(body).get("usage", {}).get("prompt_tokens", 0))
    except (ValueError, AttributeError, TypeError):
        prompt_tokens = 0
    return PoolResult(body_json=bytes(body), prompt_tokens=prompt_tokens)
