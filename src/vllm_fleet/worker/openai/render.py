"""Inputs made ready for vLLM, with vLLM's meaning: the prompt ids and vLLM's SamplingParams.

Typed path (Spark, the Python client): the prompt is tokenized here (a chat with the model's
template) and our SamplingParams become vLLM's (sampling.py).

OpenAI path (`request.openai` set): vLLM's own request model (openai_request.py), then what
`vllm serve` does before it calls the engine, in its order of effect:
  - chat: the tool/reasoning parser's `adjust_request` (parsing.py), which e.g. turns a named or
    required tool_choice into a JSON-schema constraint;
  - the prompt rendered by vLLM's renderer: `request.build_chat_params(...)` merges
    chat_template_kwargs with add_generation_prompt, continue_final_message, documents and
    reasoning_effort; `tools` (as dicts) join as template defaults, as vLLM's
    preprocess_chat does; `request.build_tok_params(model_config)` carries
    truncate_prompt_tokens, add_special_tokens and the context-length check;
  - max_tokens: the request's (max_completion_tokens, else max_tokens), else what is left of the
    context (vLLM's get_max_tokens, with the generation config's max_tokens);
  - `request.to_sampling_params(max_tokens, generation-config defaults)`, output kind DELTA
    (the worker always streams to the gateway).

vLLM names used, present in both 0.26 and 0.32: AsyncLLM.renderer with render_chat_async /
render_cmpl_async, ChatCompletionRequest.build_chat_params / build_tok_params /
to_sampling_params, CompletionRequest.build_tok_params / to_sampling_params,
ChatParams.with_defaults, vllm.renderers.inputs.preprocess.parse_model_prompt /
extract_prompt_components, vllm.entrypoints.serve.utils.api_utils.get_max_tokens.
Not done here (vLLM 0.32's server passes them to AsyncLLM.generate): `reasoning_ended` and
`reasoning_parser_kwargs`; the engine then finds the end of reasoning itself from the prompt.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.types import CHAT_ROLES, GenerateInput, GenerateRequest, OpenAIOptions
from vllm_fleet.worker.engines.base import EnginePrompt
from vllm_fleet.worker.openai.request import build_vllm_request
from vllm_fleet.worker.openai.sampling import invalid_request, truncate_prompt, vllm_error_types, vllm_sampling_params

logger = logging.getLogger(__name__)

# vLLM's server default (--chat-template-content-format auto): detect from the template.
CHAT_TEMPLATE_CONTENT_FORMAT = "auto"


class VllmPrompts:
    """Prepares each input of a request for one started AsyncLLM."""

    def __init__(self, llm: Any, tokenizer: Any, defaults: dict[str, Any], *, parser_cls: type | None,
                 enable_auto_tool_choice: bool) -> None:
        self._llm = llm
        self._tokenizer = tokenizer
        self._defaults = defaults
        self._parser_cls = parser_cls
        self._enable_auto_tool_choice = enable_auto_tool_choice
        model_config = llm.vllm_config.model_config
        self._model_config = model_config
        # As vLLM's serving classes compute it: a max_tokens the operator set for the model caps
        # every request.
        if model_config.generation_config not in ("auto", "vllm"):
            self._override_max_tokens = defaults.get("max_tokens")
        else:
            self._override_max_tokens = (getattr(model_config, "override_generation_config", None) or {}).get(
                "max_new_tokens")

    async def prepare(self, item: GenerateInput, request: GenerateRequest) -> EnginePrompt:
        if request.openai is not None:
            return await self._openai(item, request.openai, request.params.n or 1)
        params = vllm_sampling_params(request.params, self._defaults)
        prompt_ids = truncate_prompt(await self.tokenize(item), request.params.truncate_prompt_tokens,
                                     self._model_config.max_model_len, params.max_tokens)
        return EnginePrompt(prompt_ids, params)

    async def tokenize(self, item: GenerateInput) -> list[int]:
        """Typed path: prompt ids of one input (the model's chat template for messages)."""
        if item.token_ids is not None:
            return list(item.token_ids)
        if self._tokenizer is None:
            raise InvalidRequestError("this worker's model has no tokenizer: send token_ids inputs", param="prompt")
        if item.messages is None:
            return self._tokenizer.encode(item.text or "")
        for i, message in enumerate(item.messages):
            if message.role not in CHAT_ROLES:
                raise InvalidRequestError(
                    f"message {i} has unknown role {message.role!r}; use one of {', '.join(CHAT_ROLES)}",
                    param="messages",
                )
        try:
            text = self._tokenizer.apply_chat_template(
                [{"role": m.role, "content": m.content} for m in item.messages],
                tokenize=False, add_generation_prompt=True,
            )
        except Exception as exc:  # the template itself rejects the conversation (e.g. role order)
            raise InvalidRequestError(f"the model's chat template rejected the messages: {exc}",
                                      param="messages") from None
        return self._tokenizer.encode(text, add_special_tokens=False)

    async def _openai(self, item: GenerateInput, openai: OpenAIOptions, samples: int) -> EnginePrompt:
        from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
        from vllm.sampling_params import RequestOutputKind

        if self._tokenizer is None:
            raise InvalidRequestError("this worker's model has no tokenizer, which OpenAI requests need",
                                      param="model")
        request = build_vllm_request(openai, item)
        chat = openai.endpoint == "chat"
        if chat:
            from vllm_fleet.worker.openai.parsing import adjust_request

            request = adjust_request(self._parser_cls, self._tokenizer, request, self._enable_auto_tool_choice)
            prompt_ids, prompt_text = await self._render_chat(request)
        else:
            prompt_ids, prompt_text = await self._render_completion(request)
        requested = getattr(request, "max_completion_tokens", None)
        if requested is None:
            requested = request.max_tokens
        try:
            max_tokens = get_max_tokens(self._model_config.max_model_len, requested, len(prompt_ids),
                                        self._defaults, self._override_max_tokens,
                                        truncate_prompt_tokens=request.truncate_prompt_tokens)
            params = request.to_sampling_params(max_tokens, self._defaults)
        except vllm_error_types() as exc:
            raise invalid_request(exc) from None
        params.output_kind = RequestOutputKind.DELTA
        # The typed n frames the stream, and the router lowers it to 1 when it resumes each
        # sample of an n>1 request on its own (the body still says the client's n).
        params.n = samples
        echo_text = None
        if not chat and request.echo:
            echo_text = prompt_text if prompt_text is not None else self._tokenizer.decode(prompt_ids)
        return EnginePrompt(prompt_ids, params, openai_request=request, echo_text=echo_text)

    async def _render_chat(self, request: Any) -> tuple[list[int], str | None]:
        """The chat prompt through vLLM's renderer, with the same template arguments as vllm serve."""
        # As vllm serve without --trust-request-chat-template: the model's template only (a
        # template is code the worker would run).
        kwargs = request.chat_template_kwargs or {}
        if request.chat_template is not None or kwargs.get("chat_template") is not None:
            raise InvalidRequestError("a request may not bring its own chat template; the model's is used",
                                      param="chat_template")
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

    async def _render_completion(self, request: Any) -> tuple[list[int], str | None]:
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        try:
            tok_params = request.build_tok_params(self._model_config)
            prompt = parse_model_prompt(self._model_config, request.prompt)
            (engine_input,) = await self._llm.renderer.render_cmpl_async([prompt], tok_params)
        except vllm_error_types() as exc:
            raise invalid_request(exc, "prompt") from None
        return self._components(engine_input)

    def _components(self, engine_input: Any) -> tuple[list[int], str | None]:
        from vllm.renderers.inputs.preprocess import extract_prompt_components

        components = extract_prompt_components(self._model_config, engine_input)
        return list(components.token_ids or []), components.text


def _is_mistral(tokenizer: Any) -> bool:
    """vLLM renders with tokenize=True for Mistral's own tokenizer (its preprocess_chat)."""
    try:
        from vllm.utils.mistral import is_mistral_tokenizer
    except ImportError:  # moved between versions; only Mistral-tokenizer models need it
        return False
    return bool(is_mistral_tokenizer(tokenizer))
