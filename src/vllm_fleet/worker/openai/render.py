"""The vLLM engine's prompt rendering: vLLM's own renderer, with the template arguments `vllm serve` uses.

Chat: `request.build_chat_params(...)` merges chat_template_kwargs with add_generation_prompt,
continue_final_message, documents and reasoning_effort; `tools` (as dicts) join as template
defaults, as vLLM's preprocess_chat does; `request.build_tok_params(model_config)` carries
truncate_prompt_tokens, add_special_tokens and the context-length check. Completion: vLLM's
prompt parsing (text or token ids) and the same token parameters.

vLLM names used, present in both 0.26 and 0.32: AsyncLLM.renderer with render_chat_async /
render_cmpl_async, ChatCompletionRequest.build_chat_params / build_tok_params,
CompletionRequest.build_tok_params, ChatParams.with_defaults,
vllm.renderers.inputs.preprocess.parse_model_prompt / extract_prompt_components.
"""

from __future__ import annotations

from typing import Any

from vllm_fleet.worker.engines.base import RenderedPrompt
from vllm_fleet.worker.openai.errors import invalid_request, vllm_error_types
from vllm_fleet.worker.openai.parsing import is_chat_request

# vLLM's server default (--chat-template-content-format auto): detect from the template.
CHAT_TEMPLATE_CONTENT_FORMAT = "auto"


class VllmRenderer:
    """Renders requests for one started AsyncLLM."""

    def __init__(self, llm: Any, tokenizer: Any) -> None:
        self._llm = llm
        self._tokenizer = tokenizer
        self._model_config = llm.vllm_config.model_config

    async def render(self, request: Any) -> RenderedPrompt:
        if is_chat_request(request):
            return await self._render_chat(request)
        return await self._render_completion(request)

    async def _render_chat(self, request: Any) -> RenderedPrompt:
        tool_dicts = None if request.tools is None else [tool.model_dump() for tool in request.tools]
        try:
            chat_params = request.build_chat_params(None, CHAT_TEMPLATE_CONTENT_FORMAT).with_defaults(
                {"tools": tool_dicts, "tokenize": _is_mistral(self._tokenizer)})
            tok_params = request.build_tok_params(self._model_config)  # checks the lengths asked for
            _, (engine_input,) = await self._llm.renderer.render_chat_async([request.messages], chat_params,
                                                                            tok_params)
        except vllm_error_types() as exc:
            raise invalid_request(exc, "messages") from None
        return self._components(engine_input)

    async def _render_completion(self, request: Any) -> RenderedPrompt:
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        try:
            tok_params = request.build_tok_params(self._model_config)
            prompt = parse_model_prompt(self._model_config, request.prompt)
            (engine_input,) = await self._llm.renderer.render_cmpl_async([prompt], tok_params)
        except vllm_error_types() as exc:
            raise invalid_request(exc, "prompt") from None
        return self._components(engine_input)

    async def render_ids(self, request: Any, token_ids: list[int]) -> RenderedPrompt:
        """A chat or completion request whose prompt is already these ids (a router's rendering with
        this model's files, worker/router_ids.py): vLLM's token stage on them with the request's own
        token parameters, so its checks after tokenization (context length, the answer's room) run as
        for a rendered prompt, and the template and tokenizer do not."""
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        param = "messages" if is_chat_request(request) else "prompt"
        try:
            tok_params = request.build_tok_params(self._model_config)
            prompt = parse_model_prompt(self._model_config, list(token_ids))
            (engine_input,) = await self._llm.renderer.render_cmpl_async([prompt], tok_params)
        except vllm_error_types() as exc:
            raise invalid_request(exc, param) from None
        return self._components(engine_input)

    def _components(self, engine_input: Any) -> RenderedPrompt:
        from vllm.renderers.inputs.preprocess import extract_prompt_components

        components = extract_prompt_components(self._model_config, engine_input)
        return RenderedPrompt(list(components.token_ids or []), components.text)


def _is_mistral(tokenizer: Any) -> bool:
    """vLLM renders with tokenize=True for Mistral's own tokenizer (its preprocess_chat)."""
    try:
        from vllm.utils.mistral import is_mistral_tokenizer
    except ImportError:  # moved between versions; only Mistral-tokenizer models need it
        return False
    return bool(is_mistral_tokenizer(tokenizer))
