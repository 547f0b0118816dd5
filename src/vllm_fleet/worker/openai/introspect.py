"""`vllm serve`'s token and rendering endpoints, answered by vLLM's own serving classes on the worker.

    tokenize           POST /tokenize                   (a prompt, or chat messages with tools, ...)
    detokenize         POST /detokenize
    render_chat        POST /v1/chat/completions/render  (the token ids and sampling vLLM would run)
    render_completion  POST /v1/completions/render

A body comes in and goes out as JSON in vLLM's own shapes: vLLM's request models read it
(a field they do not know is refused by name here, where vLLM itself would only log it), and
vLLM's ServingTokenization / ServingRender answer, built once over the worker's AsyncLLM as
`vllm serve` builds them (launchers/api_server/app_state.py). The worker's chat-template and
tool settings are the ones its generation uses, so /tokenize counts what a chat request runs.

vLLM names used: vllm.entrypoints.serve.tokenize.{serving.ServingTokenization, protocol.*},
vllm.entrypoints.scale_out.render.serving.ServingRender, vllm.renderers.online_renderer.OnlineRenderer,
vllm.entrypoints.openai.models.{serving.OpenAIServingModels, protocol.BaseModelPath}. They are
vLLM 0.32's, and present in 0.26 too (whose render methods take no HTTP request: call_serving);
where they cannot be imported every endpoint here is refused with a message saying so, and
generation is unaffected. On the H200 with vLLM 0.26 (2026-12-03) /tokenize and /detokenize
answered; the render route failed on that signature before call_serving.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from vllm_fleet.errors import IntrospectUnsupportedError, InvalidRequestError
from vllm_fleet.worker.openai.errors import invalid_request, vllm_error_types

logger = logging.getLogger(__name__)

ENDPOINTS = ("tokenize", "detokenize", "render_chat", "render_completion")
# vLLM's server default (--chat-template-content-format auto), as openai/render.py uses.
CHAT_TEMPLATE_CONTENT_FORMAT = "auto"


class VllmIntrospection:
    """vLLM's tokenization and render serving objects for one started AsyncLLM, built on first use."""

    def __init__(self, llm: Any, served_name: str, *, tool_call_parser: str | None,
                 enable_auto_tool_choice: bool, reasoning_parser: str | None) -> None:
        self._llm = llm
        self._served_name = served_name
        self._parsers = dict(tool_parser=tool_call_parser, enable_auto_tools=enable_auto_tool_choice,
                             reasoning_parser=reasoning_parser)
        self._tokenization: Any = None
        self._render: Any = None

    async def answer(self, endpoint: str, body: dict[str, Any]) -> Any:
        """vLLM's JSON answer to `body` at `endpoint`; InvalidRequestError for what vLLM refuses."""
        if endpoint not in ENDPOINTS:
            raise InvalidRequestError(f"unknown introspection endpoint {endpoint!r}; known: {', '.join(ENDPOINTS)}")
        self._build()
        request = _parse(endpoint, body)
        try:
            if endpoint == "tokenize":
                result = await call_serving(self._tokenization.create_tokenize, request)
            elif endpoint == "detokenize":
                result = await call_serving(self._tokenization.create_detokenize, request)
            elif endpoint == "render_chat":
                result = await call_serving(self._render.render_chat_request, request)
            else:
                result = await call_serving(self._render.render_completion_request, request)
        except vllm_error_types() as exc:
            raise invalid_request(exc, "messages" if "messages" in body else "prompt") from None
        _raise_error_response(result)
        if isinstance(result, list):
            return [item.model_dump(mode="json") for item in result]
        return result.model_dump(mode="json")

    def _build(self) -> None:
        if self._tokenization is not None:
            return
        try:
            from vllm.entrypoints.openai.models.protocol import BaseModelPath
            from vllm.entrypoints.openai.models.serving import OpenAIServingModels
            from vllm.entrypoints.scale_out.render.serving import ServingRender
            from vllm.entrypoints.serve.tokenize.serving import ServingTokenization
            from vllm.renderers.online_renderer import OnlineRenderer
        except ImportError as exc:
            raise IntrospectUnsupportedError(
                f"this worker's vLLM has no ServingTokenization/ServingRender where vLLM 0.32 keeps them ({exc}); "
                "/tokenize, /detokenize and the render routes need a worker on vLLM 0.32") from None
        model_config = self._llm.model_config
        models = OpenAIServingModels(engine_client=self._llm, base_model_paths=[
            BaseModelPath(name=self._served_name, model_path=str(model_config.model))])
        renderer = OnlineRenderer(model_config=model_config, renderer=self._llm.renderer, request_logger=None,
                                  chat_template=None, chat_template_content_format=CHAT_TEMPLATE_CONTENT_FORMAT,
                                  **self._parsers)
        self._tokenization = ServingTokenization(models, renderer, chat_template=None,
                                                 chat_template_content_format=CHAT_TEMPLATE_CONTENT_FORMAT)
        self._render = ServingRender(models, renderer)


async def call_serving(method: Any, request: Any) -> Any:
    """`method(request, raw_request=None)` where it takes the HTTP request too (vLLM 0.32, and
    0.26's tokenization), `method(request)` where it does not (0.26's render methods)."""
    if len(inspect.signature(method).parameters) >= 2:
        return await method(request, None)
    return await method(request)


def _parse(endpoint: str, body: dict[str, Any]) -> Any:
    """vLLM's request model for `body`; every field it does not know is refused by name."""
    from pydantic import TypeAdapter, ValidationError

    if endpoint in ("tokenize", "detokenize"):
        from vllm.entrypoints.serve.tokenize import protocol

        schema: Any = protocol.TokenizeRequest if endpoint == "tokenize" else protocol.DetokenizeRequest
    elif endpoint == "render_chat":
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as schema
    else:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest as schema
    try:
        request = TypeAdapter(schema).validate_python(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first.get("loc", ()) if isinstance(part, str)) or None
        raise InvalidRequestError(f"invalid request: {first.get('msg')} ({param})", param=param) from None
    except vllm_error_types() as exc:
        raise invalid_request(exc) from None
    unknown = sorted(set(body) - set(type(request).model_fields))
    if unknown:
        raise InvalidRequestError(f"unknown field(s) {', '.join(unknown)} for {type(request).__name__}: "
                                  "vLLM does not read them", param=unknown[0])
    return request


def _raise_error_response(result: Any) -> None:
    error = getattr(result, "error", None)
    if error is None or not hasattr(error, "message"):
        return
    if int(getattr(error, "code", 400)) >= 500:
        raise RuntimeError(f"vLLM failed: {error.message}")
    raise InvalidRequestError(error.message, param=getattr(error, "param", None))
