"""kill -9 of the worker streaming a Responses API answer (endpoint "responses") mid-tool-call.

The Responses body is read on the worker by vLLM's ResponsesRequest and run as vLLM's chat
conversion of it, so the router migrates it like a chat stream: the survivor re-converts the same
input items, primes its parsers with the tokens already sent, and the client's text and tool-call
arguments equal an uninterrupted run's, with no token lost or repeated.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from chaos_support import router_for
from parser_tokenizer import parser_tokenizer_dir  # noqa: F401  (fixture)
from support import wait_until
from test_parsed_stream_migration import ARGUMENTS, SCRIPT, Seen, consume
from vllm_fleet.protocol.types import GenerateInput, GenerateRequest, RequestBody
from vllm_fleet.router import RouterConfig

pytestmark = pytest.mark.timeout(300)

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "note": {"type": "string"}}, "required": ["city"]}}


def responses_request(request_id: str) -> GenerateRequest:
    body = {"tools": [TOOL], "instructions": "Use tools.", "max_output_tokens": 500}
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Zürich?"}]}]
    return GenerateRequest(request_id=request_id, inputs=[GenerateInput(messages=items)],
                           body=RequestBody("responses", json.dumps(body).encode()))


async def test_kill_9_mid_tool_call_a_responses_stream_continues(mock_worker_factory, tmp_path,
                                                                 parser_tokenizer_dir):  # noqa: F811
    script = tmp_path / "answer.txt"
    script.write_text(SCRIPT, encoding="utf-8")
    options = dict(served_model_name="chaos", mock_tokenizer=str(parser_tokenizer_dir), mock_script=str(script),
                   tool_call_parser="hermes", enable_auto_tool_choice=True, reasoning_parser="qwen3",
                   mock_tokens_per_s=25, mock_ttft_ms=5, timeout=180)
    pool = await mock_worker_factory.start_many(2, **options)
    async with router_for([w.address for w in pool], RouterConfig(retry_budget_min_per_s=100)) as router:
        await wait_until(lambda: len(router.models()) == 1 and all(v.state == "serving" for v in router.snapshot()),
                         timeout=60, message="both workers serving")
        seen = Seen()
        task = asyncio.ensure_future(consume(router.stream(responses_request("migrated")), seen))
        await wait_until(lambda: bool(seen.calls) and len(seen.calls[0]["arguments"]) > 5 or task.done(),
                         timeout=90, message="the tool call's arguments to start streaming")
        assert not task.done(), "the answer finished before the fault: make the script longer"
        [victim] = [w for w in pool if router.snapshot().get(w.address).in_flight]
        victim.kill()
        migrated = await task
        whole = await consume(router.stream(responses_request("uninterrupted")), Seen())

    assert (migrated.reasoning, migrated.content) == (whole.reasoning, whole.content) != ("", "")
    assert migrated.calls == whole.calls and migrated.calls[0]["name"] == "get_weather"
    assert json.loads(migrated.calls[0]["arguments"]) == ARGUMENTS
    assert migrated.token_ids == whole.token_ids  # no token lost or repeated
