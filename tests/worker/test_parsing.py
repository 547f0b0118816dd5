"""Tool calls and reasoning on the worker, with vLLM's own parsers, through RequestStream.

The engine's deltas come from the mock's scripted answer (real token ids of a real tokenizer,
cut into steps of 1-4 tokens, so deltas end inside the JSON arguments and beside `</think>`).
What a client relies on: content, reasoning and tool-call arguments come out separated as
vLLM's server separates them, whatever the delta boundaries, coalescing and migration.
"""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from parser_tokenizer import parser_tokenizer_dir  # noqa: F401  (fixture)
from vllm_fleet.errors import ConfigError, InvalidRequestError
from vllm_fleet.protocol.types import Chunk
from vllm_fleet.worker.openai import parsing
from vllm_fleet.worker.coalescer import merge_tool_call
from vllm_fleet.worker.engines.base import SampleDelta
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.engines.mock_script import MockScript, load_tokenizer
from vllm_fleet.worker.prepare import PreparedInput
from vllm_fleet.worker.request_stream import RequestStream

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
ARGUMENTS = {"city": "Zürich, \"old town\"", "days": 3}
REASONING = "The user wants the weather; I should call get_weather."
THINK_THEN_CALL = (f"<think>{REASONING}</think>Let me look that up."
                   f"<tool_call>\n{json.dumps({'name': 'get_weather', 'arguments': ARGUMENTS})}\n</tool_call>")
THINK_THEN_ANSWER = "<think>Two and two: four.</think>The answer is 4."
MESSAGES = [{"role": "user", "content": "What is the weather in Zürich?"}]


@pytest.fixture(scope="module")
def tokenizer(parser_tokenizer_dir):  # noqa: F811
    return load_tokenizer(str(parser_tokenizer_dir))


def engine_params():
    from vllm import SamplingParams as VllmSamplingParams

    return VllmSamplingParams()


def vllm_request(parser_cls, tokenizer, **body):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest(model="m", messages=MESSAGES, **body)
    return parsing.adjust_request(parser_cls, tokenizer, request, enable_auto_tool_choice=True)


def prompt_ids(tokenizer, request) -> list[int]:
    kwargs = {"add_generation_prompt": True, **parsing.chat_template_kwargs(request)}
    ids = tokenizer.apply_chat_template(MESSAGES, tokenize=True, **kwargs)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


class Answer:
    """The client's view of one (input, sample) stream."""

    def __init__(self, chunks: list[Chunk]) -> None:
        self.chunks = chunks
        self.content = "".join(c.text for c in chunks)
        self.reasoning = "".join(c.reasoning for c in chunks)
        self.token_ids = [i for c in chunks for i in c.token_ids]
        self.calls: dict[int, dict] = {}
        for chunk in chunks:
            for piece in chunk.tool_calls or ():
                call = self.calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += piece.id
                call["name"] += piece.name
                call["arguments"] += piece.arguments
        self.finish_reason = chunks[-1].finish_reason if chunks else None


def run(tokenizer, script: str, parser_cls, request, *, resume: list[int] | None = None, interval_s: float = 0.0,
        stop_after: int | None = None) -> Answer:
    """Stream the script's answer to `request` through a RequestStream, as the worker does."""
    prompt = prompt_ids(tokenizer, request)
    resumed = list(resume or [])
    item = PreparedInput(prompt_token_ids=prompt + resumed, engine_params=engine_params(), prompt_len=len(prompt),
                         vllm_request=request, parser_cls=parser_cls, tokenizer=tokenizer)
    stream = RequestStream([item], 1, interval_s, WorkerMetrics(CollectorRegistry()), started=0.0)
    chunks, now = [], 0.0
    steps = MockScript(tokenizer, script).steps(prompt + resumed, max_tokens=1000)
    for step in steps[:stop_after]:
        now += 0.01
        chunks += stream.on_deltas(0, [SampleDelta(0, step.text, list(step.token_ids), step.finish_reason)], now)
        chunks += stream.on_deadline(now)
    chunks += stream.on_deadline(now + 10)
    return Answer(chunks)


def test_reasoning_and_content_are_split_at_think_whatever_the_delta_boundaries(tokenizer):
    parser_cls = parsing.parser_class(None, "qwen3", tokenizer=tokenizer)
    answer = run(tokenizer, THINK_THEN_ANSWER, parser_cls, vllm_request(parser_cls, tokenizer))
    assert (answer.reasoning, answer.content) == ("Two and two: four.", "The answer is 4.")
    assert answer.finish_reason == "stop"
    assert answer.token_ids == tokenizer.encode(THINK_THEN_ANSWER, add_special_tokens=False)  # ids untouched


def test_include_reasoning_false_drops_the_reasoning_and_keeps_the_content(tokenizer):
    parser_cls = parsing.parser_class(None, "qwen3", tokenizer=tokenizer)
    answer = run(tokenizer, THINK_THEN_ANSWER, parser_cls,
                 vllm_request(parser_cls, tokenizer, include_reasoning=False))
    assert (answer.reasoning, answer.content) == ("", "The answer is 4.")


def test_with_thinking_disabled_in_the_template_everything_is_content(tokenizer):
    # The prompt ends with an empty <think></think>: vLLM decides from the prompt that reasoning
    # is over, so an answer without think tags is content, not reasoning.
    parser_cls = parsing.parser_class(None, "qwen3", tokenizer=tokenizer)
    request = vllm_request(parser_cls, tokenizer, chat_template_kwargs={"enable_thinking": False})
    assert prompt_ids(tokenizer, request)[-5:].count(tokenizer.convert_tokens_to_ids("</think>")) == 1
    answer = run(tokenizer, "The answer is 4.", parser_cls, request)
    assert (answer.reasoning, answer.content) == ("", "The answer is 4.")


def test_a_hermes_tool_call_split_inside_its_arguments_streams_as_one_call(tokenizer):
    parser_cls = parsing.parser_class("hermes", "qwen3", enable_auto_tool_choice=True, tokenizer=tokenizer)
    answer = run(tokenizer, THINK_THEN_CALL, parser_cls, vllm_request(parser_cls, tokenizer, tools=TOOLS))
    assert answer.reasoning == REASONING
    assert answer.content == "Let me look that up."
    [call] = answer.calls.values()
    assert call["name"] == "get_weather" and call["id"]
    assert json.loads(call["arguments"]) == ARGUMENTS
    assert answer.finish_reason == "tool_calls"  # as vLLM's server reports an auto tool call


def test_coalesced_chunks_merge_content_reasoning_and_tool_call_pieces(tokenizer):
    parser_cls = parsing.parser_class("hermes", "qwen3", enable_auto_tool_choice=True, tokenizer=tokenizer)
    request = vllm_request(parser_cls, tokenizer, tools=TOOLS)
    every_step = run(tokenizer, THINK_THEN_CALL, parser_cls, request)
    coalesced = run(tokenizer, THINK_THEN_CALL, parser_cls, vllm_request(parser_cls, tokenizer, tools=TOOLS),
                    interval_s=0.05)
    assert len(coalesced.chunks) < len(every_step.chunks)
    assert (coalesced.content, coalesced.reasoning, coalesced.token_ids) == \
        (every_step.content, every_step.reasoning, every_step.token_ids)
    assert json.loads(coalesced.calls[0]["arguments"]) == ARGUMENTS
    for chunk in coalesced.chunks:  # one piece per call in a chunk: pieces of a call were merged
        indexes = [piece.index for piece in chunk.tool_calls or ()]
        assert len(indexes) == len(set(indexes))


def test_merging_tool_call_pieces_keeps_id_and_name_and_joins_arguments():
    from vllm_fleet.protocol.types import ToolCallDelta

    calls: list[ToolCallDelta] = []
    for piece in (ToolCallDelta(0, "call-1", "f", ""), ToolCallDelta(0, arguments='{"a"'),
                  ToolCallDelta(0, arguments=": 1}"), ToolCallDelta(1, "call-2", "g", "{}")):
        calls = merge_tool_call(calls, piece)
    assert calls == [ToolCallDelta(0, "call-1", "f", '{"a": 1}'), ToolCallDelta(1, "call-2", "g", "{}")]


@pytest.mark.parametrize("tool_choice, finish", [
    ({"type": "function", "function": {"name": "get_weather"}}, "stop"),  # OpenAI: "stop" for a named call
    ("required", "tool_calls"),
])
def test_named_or_required_tool_choice_without_a_tool_parser_streams_a_tool_call(tokenizer, tool_choice, finish):
    request = vllm_request(None, tokenizer, tools=TOOLS, tool_choice=tool_choice)
    schema = request.structured_outputs.json  # the output is constrained to the tool's JSON
    assert schema is not None and request.response_format is None
    if tool_choice == "required":
        script = json.dumps([{"name": "get_weather", "parameters": ARGUMENTS}])
    else:
        script = json.dumps(ARGUMENTS)
    answer = run(tokenizer, script, None, request)
    assert answer.content == ""
    [call] = answer.calls.values()
    assert call["name"] == "get_weather" and call["id"]
    assert json.loads(call["arguments"]) == ARGUMENTS
    assert answer.finish_reason == finish


def test_a_named_tool_choice_with_only_a_reasoning_parser_gives_reasoning_then_the_call(tokenizer):
    parser_cls = parsing.parser_class(None, "qwen3", tokenizer=tokenizer)
    request = vllm_request(parser_cls, tokenizer, tools=TOOLS,
                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    answer = run(tokenizer, f"<think>{REASONING}</think>{json.dumps(ARGUMENTS)}", parser_cls, request)
    assert (answer.reasoning, answer.content) == (REASONING, "")
    [call] = answer.calls.values()
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == ARGUMENTS


def test_auto_tool_choice_without_a_tool_parser_is_refused_in_vllms_words(tokenizer):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    request = ChatCompletionRequest(model="m", messages=MESSAGES, tools=TOOLS, tool_choice="auto")
    with pytest.raises(InvalidRequestError) as error:
        parsing.adjust_request(None, tokenizer, request, enable_auto_tool_choice=False)
    assert error.value.param == "tool_choice"
    assert "--enable-auto-tool-choice" in str(error.value)


def test_an_unknown_parser_name_is_a_config_error_listing_the_known_ones():
    with pytest.raises(ConfigError) as error:
        parsing.parser_class("no-such-parser", None)
    assert "hermes" in str(error.value)


def test_the_tool_parser_is_used_only_with_auto_tool_choice_enabled_as_in_vllm_serve(tokenizer):
    assert parsing.parser_class("hermes", None, enable_auto_tool_choice=False) is None
    assert parsing.parser_class("hermes", None, enable_auto_tool_choice=True).tool_parser_cls is not None


@pytest.mark.parametrize("script, tools", [(THINK_THEN_CALL, TOOLS), (THINK_THEN_ANSWER, None)],
                         ids=["tool-call", "reasoning"])
def test_a_stream_resumed_after_any_chunk_continues_the_parse_byte_for_byte(tokenizer, script, tools):
    parser_cls = parsing.parser_class("hermes", "qwen3", enable_auto_tool_choice=True, tokenizer=tokenizer)
    body = {"tools": tools} if tools else {}
    whole = run(tokenizer, script, parser_cls, vllm_request(parser_cls, tokenizer, **body))
    steps = len(MockScript(tokenizer, script).steps([], 1000))
    for cut in range(1, steps):
        # The first worker died after `cut` engine steps; the client has their chunks.
        before = run(tokenizer, script, parser_cls, vllm_request(parser_cls, tokenizer, **body), stop_after=cut)
        after = run(tokenizer, script, parser_cls, vllm_request(parser_cls, tokenizer, **body),
                    resume=before.token_ids)
        joined = Answer(before.chunks + after.chunks)
        assert (joined.content, joined.reasoning, joined.token_ids) == \
            (whole.content, whole.reasoning, whole.token_ids), f"cut after step {cut}"
        assert [{k: v for k, v in c.items() if k != "id"} for c in joined.calls.values()] == \
            [{k: v for k, v in c.items() if k != "id"} for c in whole.calls.values()], f"cut after step {cut}"
        assert all(c["id"] for c in joined.calls.values())
        assert joined.finish_reason == whole.finish_reason
