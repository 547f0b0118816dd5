"""One input of a request made ready to run: the one preparation path, for every engine.

The body gives the request its meaning, through vLLM, in `vllm serve`'s order of effect:
  1. vLLM's own request model, built from the body and the envelope's input and n
     (openai/request.py), whose validators run;
  2. chat: the tool/reasoning parser's `adjust_request` (openai/parsing.py), which e.g. turns a
     named or required tool_choice into a JSON-schema constraint;
  3. the prompt, rendered by the engine (`Engine.render`: vLLM's renderer on the real engine,
     the model's tokenizer or the mock's words on the mock), or a router's rendering of it where
     this worker takes those (`Engine.render_ids`, which checks them as `render` checks its own;
     router_ids.py says when, and which it renders anyway to compare);
  4. max_tokens: the request's (max_completion_tokens, else max_tokens), else what is left of
     the context (vLLM's get_max_tokens, with the generation config's max_tokens);
  5. `request.to_sampling_params(max_tokens, generation-config defaults)`, output kind DELTA
     (the worker always streams).
The mock engine samples from the same vLLM SamplingParams the real engine gets. Where vLLM is not
installed (a mock worker on a machine without it) mock_subset.py reads a documented subset of
the body instead and refuses the rest by name.

Then the worker's own rules: its logprobs bound, and a resume (migration), which continues from
the tokens another worker already sent: they join the prompt and count against max_tokens /
min_tokens; a character they end inside of is held and regenerated (resume/held.py).

vLLM names used, present in both 0.26 and 0.32: vllm.entrypoints.serve.utils.api_utils.get_max_tokens,
ChatCompletionRequest / CompletionRequest.to_sampling_params, vllm.sampling_params.RequestOutputKind.
Not done here (vLLM 0.32's server passes them to AsyncLLM.generate): `reasoning_ended` and
`reasoning_parser_kwargs`; the engine then finds the end of reasoning itself from the prompt.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.sampling import requested_max_tokens
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest
from vllm_fleet.worker.engines.base import Engine
from vllm_fleet.worker.resume.held import HeldTokens, held_tail_length
from vllm_fleet.worker.resume.stops import StopResume, for_resume
from vllm_fleet.worker.validation import check_logprobs, check_prompt_fits

if TYPE_CHECKING:
    from vllm import SamplingParams as VllmSamplingParams

    from vllm_fleet.worker.engines.mock_subset import SubsetSampling
    from vllm_fleet.worker.openai.request import VllmRequest
    from vllm_fleet.worker.router_ids import RouterIds

    EngineParams = VllmSamplingParams | SubsetSampling


@dataclass
class PreparedInput:
    """One input ready to run.

    `engine_params` is what Engine.generate takes: vLLM's SamplingParams, output kind DELTA
    (the documented subset's, mock_subset.py, where vLLM is missing), already lowered by resumed
    tokens. `vllm_request` is vLLM's ChatCompletionRequest / CompletionRequest after the parser's
    adjust_request (None on the subset path): RequestStream builds its tool/reasoning parsers from
    it, with `parser_cls` and `tokenizer` (the engine's).
    `echo_text` is set for a completion with `echo`: the prompt's text, which RequestStream puts
    on the first chunk of each sample (Chunk.prompt_text).
    """

    prompt_token_ids: list[int]
    engine_params: EngineParams
    prompt_len: int
    exhausted: bool = False  # resumed with no tokens left to generate
    held: HeldTokens | None = None  # resumed mid-character: tokens to regenerate silently
    vllm_request: VllmRequest | None = None
    echo_text: str | None = None
    parser_cls: type | None = None
    tokenizer: Any = None
    stop_resume: StopResume | None = None  # resumed with held-back text or stop strings (resume/stops.py)
    cache_salt: str | None = None  # vLLM's request field: the engine shares prefix-cache blocks only within a salt
    from_router: bool = False  # the prompt ids are the router's (not rendered here): checked as given ids


@functools.cache
def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def import_vllm_meaning() -> None:
    """Import what the preparation path uses of vLLM, before the worker says SERVING: the first
    import costs ~9 s of CPU (torch comes with it), which must not land on a first request."""
    if vllm_installed():
        from vllm.entrypoints.openai.chat_completion import protocol as _chat  # noqa: F401
        from vllm.entrypoints.openai.completion import protocol as _completion  # noqa: F401
        from vllm.entrypoints.serve.utils import api_utils as _api_utils  # noqa: F401


async def prepare_input(engine: Engine, index: int, request: GenerateRequest, *, max_logprobs: int,
                        router_ids: RouterIds | None = None) -> PreparedInput:
    """Raises InvalidRequestError when the input cannot be served (a field vLLM refuses, empty,
    too long, bad ids). `router_ids`: this worker's account of router ids, when it takes them."""
    item = request.inputs[index]
    if vllm_installed():
        prepared = await _with_vllm(engine, request, item, router_ids)
    else:
        from vllm_fleet.worker.engines.mock_subset import subset_input

        prepared = await subset_input(engine, request, item)
    prompt_ids = prepared.prompt_token_ids
    if not prompt_ids:
        raise InvalidRequestError(f"input {index}: the prompt tokenizes to nothing", param="prompt")
    check_logprobs(prepared.engine_params.logprobs, max_logprobs)
    resume = item.resume_token_ids
    check_prompt_fits(index, len(prompt_ids), len(resume), engine.max_model_len, engine.vocab_size,
                      prompt_ids + resume if item.token_ids is not None or resume or prepared.from_router else [])
    if resume:
        _resume(engine, prepared, item)
    return prepared


async def _with_vllm(engine: Engine, request: GenerateRequest, item: GenerateInput,
                     router_ids: RouterIds | None) -> PreparedInput:
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens
    from vllm.sampling_params import RequestOutputKind

    from vllm_fleet.worker.openai.errors import invalid_request, vllm_error_types
    from vllm_fleet.worker.openai.parsing import adjust_request, is_chat_request
    from vllm_fleet.worker.openai.request import build_vllm_request

    vllm_request = build_vllm_request(
        request, item, tokenizer=engine.tokenizer,
        has_reasoning_parser=getattr(engine.parser_cls, "reasoning_parser_cls", None) is not None)
    chat = is_chat_request(vllm_request)
    if chat:
        _refuse_request_template(vllm_request)
        vllm_request = adjust_request(engine.parser_cls, engine.tokenizer, vllm_request,
                                      engine.enable_auto_tool_choice)
    given = router_ids.offered(request, item, vllm_request, engine.vocab_size) if router_ids is not None else None
    if given is None:
        prompt = await engine.render(vllm_request)
    elif router_ids.should_verify():  # the worker's own rendering runs, whatever the comparison says
        prompt = await engine.render(vllm_request)
        router_ids.compare(request.request_id, given, prompt.token_ids)
        given = None
    else:
        prompt = await engine.render_ids(vllm_request, given)
        router_ids.used()
    try:
        max_tokens = get_max_tokens(engine.max_model_len, requested_max_tokens(dict(vllm_request)),
                                    len(prompt.token_ids), engine.sampling_defaults, engine.max_tokens_override,
                                    truncate_prompt_tokens=vllm_request.truncate_prompt_tokens)
    except vllm_error_types() as exc:  # the prompt leaves no room for an answer
        raise invalid_request(exc, "prompt") from None
    try:
        params = vllm_request.to_sampling_params(max_tokens, engine.sampling_defaults)
    except vllm_error_types() as exc:
        raise invalid_request(exc) from None
    params.output_kind = RequestOutputKind.DELTA
    echo_text = None
    if not chat and vllm_request.echo:
        echo_text = prompt.text if prompt.text is not None else engine.decode(prompt.token_ids)
    return PreparedInput(prompt_token_ids=prompt.token_ids, engine_params=params, prompt_len=len(prompt.token_ids),
                         vllm_request=vllm_request, echo_text=echo_text, parser_cls=engine.parser_cls,
                         tokenizer=engine.tokenizer, cache_salt=getattr(vllm_request, "cache_salt", None),
                         from_router=given is not None)


def _refuse_request_template(vllm_request: Any) -> None:
    """As vllm serve without --trust-request-chat-template: the model's template only (a template
    a request brings is code the worker would run)."""
    kwargs = vllm_request.chat_template_kwargs or {}
    if vllm_request.chat_template is not None or kwargs.get("chat_template") is not None:
        raise InvalidRequestError("a request may not bring its own chat template; the model's is used",
                                  param="chat_template")


def _resume(engine: Engine, prepared: PreparedInput, item: GenerateInput) -> None:
    """Continue after the tokens another worker sent: they join the prompt and count as spent."""
    prompt_ids = prepared.prompt_token_ids
    resume = item.resume_token_ids
    held_count = held_tail_length(engine.decode, resume)
    if held_count:
        prepared.held = HeldTokens(resume[-held_count:])
        resume = resume[:-held_count]
    prepared.prompt_token_ids = prompt_ids + list(resume)
    prepared.engine_params, prepared.exhausted = _spend(prepared.engine_params, len(resume))
    # The client got the prompt's logprobs from the first worker (they come once, at prefill); the
    # resumed prompt (prompt + tokens sent) would give other, longer ones: ask for none.
    if getattr(prepared.engine_params, "prompt_logprobs", None) is not None:
        prepared.engine_params.prompt_logprobs = None
    prepared.stop_resume = for_resume(engine.decode, prompt_ids, list(resume), item.resume_delivered_chars,
                                      prepared.engine_params)


def _spend(params: EngineParams, used: int) -> tuple[EngineParams, bool]:
    """A copy of `params` with `used` tokens taken off max_tokens and min_tokens, and whether
    none are left."""
    params = copy.copy(params)
    exhausted = False
    if params.max_tokens is not None:
        params.max_tokens -= used
        exhausted = params.max_tokens < 1
    if params.min_tokens:
        params.min_tokens = max(0, params.min_tokens - used)
    return params, exhausted
