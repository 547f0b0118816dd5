"""The real engine's `render_ids` (worker/openai/render.py) on vLLM's own renderer, without an
engine: the packaged model's config and tokenizer (vLLM's HfRenderer, what AsyncLLM.renderer is in
a running worker). Given ids come back as the prompt, and vLLM's checks still refuse a prompt too
long for the context, and an answer longer than the context (the request's own token parameters),
as for a rendered prompt."""

from __future__ import annotations

import json

import pytest

from model_files import default_model_folder, worker_renderer
from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, RequestBody

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Grüße aus 北京 😀, naïve café?"}]


@pytest.fixture(scope="module")
def renderer():
    return worker_renderer(default_model_folder(), max_model_len=256)


def _vllm_request(body: dict, item: GenerateInput):
    from vllm_fleet.worker.openai.request import build_vllm_request

    endpoint = "chat" if item.messages is not None else "completion"
    request = GenerateRequest("r", [item], RequestBody(endpoint, json.dumps(body).encode()))
    return build_vllm_request(request, item)


async def test_given_ids_are_the_prompt_as_rendering_makes_it(renderer):
    for item in (GenerateInput(messages=MESSAGES), GenerateInput(text="Once upon a time in 北京")):
        request = _vllm_request({"max_tokens": 8}, item)
        rendered = await renderer.render(request)
        assert (await renderer.render_ids(request, rendered.token_ids)).token_ids == rendered.token_ids


async def test_vllms_length_checks_still_refuse_given_ids(renderer):
    request = _vllm_request({"max_tokens": 8}, GenerateInput(messages=MESSAGES))
    rendered = await renderer.render(request)
    with pytest.raises(InvalidRequestError) as refused:
        await renderer.render_ids(request, rendered.token_ids * 40)   # past the 256-token context
    assert "256" in str(refused.value)


async def test_vllms_answer_length_check_still_refuses_given_ids(renderer):
    ids = (await renderer.render(_vllm_request({"max_tokens": 8}, GenerateInput(messages=MESSAGES)))).token_ids
    request = _vllm_request({"max_tokens": 300}, GenerateInput(messages=MESSAGES))   # an answer past the context
    with pytest.raises(InvalidRequestError) as rendering_refused:
        await renderer.render(request)
    with pytest.raises(InvalidRequestError) as refused:
        await renderer.render_ids(request, ids)
    assert str(refused.value) == str(rendering_refused.value) and "256" in str(refused.value)
