"""OpenAI response shapes: streamed events and whole answers."""

from __future__ import annotations

import json

from vllm_fleet.gateway.aggregate import Aggregate
from vllm_fleet.gateway.api_error import ApiError
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.schemas import ChatCompletionRequest, CompletionRequest
from vllm_fleet.gateway.sse import DONE, StreamEncoder
from vllm_fleet.gateway.translate import chat_plan, completion_plan, parse_body
from vllm_fleet.protocol.types import Chunk, TokenLogprob, ToolCallDelta, Usage


def plan_of(kind: str, **body):
    if kind == "chat":
        parsed = parse_body(ChatCompletionRequest, json.dumps({"model": "m", "messages": [{"role": "user", "content": "q"}], **body}))
        return chat_plan(parsed, request_id="r", session_id="", config=GatewayConfig(), max_model_len=1000)
    parsed = parse_body(CompletionRequest, json.dumps({"model": "m", **body}))
    return completion_plan(parsed, request_id="r", session_id="", config=GatewayConfig(), max_model_len=1000)


def events(raw: bytes) -> list:
    assert raw.endswith(b"\n\n")
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        assert block.startswith("data: ")
        payload = block[len("data: "):]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_chat_stream_shape_with_usage():
    plan = plan_of("chat", n=2, stream=True, stream_options={"include_usage": True})
    enc = StreamEncoder(plan, "chatcmpl-x", 123)
    raw = b"".join([
        enc.event(Chunk(0, 0, "Hel", [1, 2])),
        enc.event(Chunk(0, 1, "Yo", [5])),
        enc.event(Chunk(0, 0, "lo ✓", [3], finish_reason="stop", usage=Usage(4, 3, 0))),
        enc.event(Chunk(0, 1, "", [], finish_reason="length", usage=Usage(4, 1, 0))),
        enc.end(),
    ])
    ev = events(raw)
    assert ev[-1] == "[DONE]"
    first = ev[0]
    assert first["object"] == "chat.completion.chunk" and first["id"] == "chatcmpl-x" and first["usage"] is None
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "Hel"}
    assert ev[1]["choices"][0]["index"] == 1
    assert ev[2]["choices"][0] == {"index": 0, "delta": {"content": "lo ✓"}, "logprobs": None, "finish_reason": "stop"}
    assert ev[3]["choices"][0]["delta"] == {} and ev[3]["choices"][0]["finish_reason"] == "length"
    assert ev[4]["choices"] == [] and ev[4]["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}


def test_completion_stream_indexes_prompts_times_n_and_logprobs():
    plan = plan_of("completion", prompt=["a", "b"], n=2, logprobs=1, stream=True)
    enc = StreamEncoder(plan, "cmpl-x", 1)
    lp = [TokenLogprob(7, "ab", -0.5, [(7, "ab", -0.5)]), TokenLogprob(8, "c", -1.0, [(9, "d", -0.2)])]
    ev = events(enc.event(Chunk(1, 1, "abc", [7, 8], logprobs=lp)) + enc.end())
    choice = ev[0]["choices"][0]
    assert choice["index"] == 3 and choice["text"] == "abc"
    assert choice["logprobs"] == {"tokens": ["ab", "c"], "token_logprobs": [-0.5, -1.0],
                                  "top_logprobs": [{"ab": -0.5}, {"d": -0.2}], "text_offset": [0, 2]}
    assert "usage" not in ev[0] and ev[1] == "[DONE]"


def test_error_event_then_done():
    ev = events(StreamEncoder.error(ApiError(502, "worker died", type="upstream_error")))
    assert ev[0]["error"]["message"] == "worker died" and ev[1] == "[DONE]"


def test_whole_chat_answer():
    plan = plan_of("chat", logprobs=True, top_logprobs=1)
    agg = Aggregate(plan, "chatcmpl-y", 5)
    agg.add(Chunk(0, 0, "Pa", [1], logprobs=[TokenLogprob(1, "Pa", -0.1, [(1, "Pa", -0.1)])]))
    agg.add(Chunk(0, 0, "ris", [2], finish_reason="stop", usage=Usage(10, 2, 4),
                  logprobs=[TokenLogprob(2, "ris", -0.2, [(2, "ris", -0.2)])]))
    body = agg.body()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Paris"} and choice["finish_reason"] == "stop"
    assert [e["token"] for e in choice["logprobs"]["content"]] == ["Pa", "ris"]
    assert choice["logprobs"]["content"][0]["top_logprobs"][0]["bytes"] == list(b"Pa")
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                             "prompt_tokens_details": {"cached_tokens": 4}}


def test_whole_completion_counts_each_prompt_once():
    plan = plan_of("completion", prompt=["a", "b"], n=2)
    agg = Aggregate(plan, "cmpl-z", 5)
    for index in range(2):
        for sample in range(2):
            agg.add(Chunk(index, sample, f"{index}{sample}", [1], finish_reason="stop", usage=Usage(3 + index, 1, 0)))
    body = agg.body()
    assert [c["text"] for c in body["choices"]] == ["00", "01", "10", "11"]
    assert body["usage"]["prompt_tokens"] == 7 and body["usage"]["completion_tokens"] == 4


def test_chat_stream_reasoning_and_tool_call_pieces_in_openai_shape():
    enc = StreamEncoder(plan_of("chat", stream=True), "chatcmpl-t", 1)
    ev = events(b"".join([
        enc.event(Chunk(0, 0, "", [1], reasoning="think")),
        enc.event(Chunk(0, 0, "", [2], tool_calls=[ToolCallDelta(0, id="call_1", name="f")])),
        enc.event(Chunk(0, 0, "", [3], tool_calls=[ToolCallDelta(0, arguments='{"a": 1}')],
                        finish_reason="tool_calls", usage=Usage(3, 3, 0))),
        enc.end(),
    ]))
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "reasoning": "think"}
    assert ev[1]["choices"][0]["delta"] == {"tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]}
    assert ev[2]["choices"][0]["delta"] == {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}
    assert ev[2]["choices"][0]["finish_reason"] == "tool_calls"


def test_whole_chat_answer_with_reasoning_and_tool_calls():
    agg = Aggregate(plan_of("chat"), "chatcmpl-w", 1)
    agg.add(Chunk(0, 0, "", [1], reasoning="hm"))
    agg.add(Chunk(0, 0, "", [2], tool_calls=[ToolCallDelta(0, id="a", name="f"), ToolCallDelta(1, id="b", name="g")]))
    agg.add(Chunk(0, 0, "", [3], tool_calls=[ToolCallDelta(1, arguments="{}"), ToolCallDelta(0, arguments='{"x":')]))
    agg.add(Chunk(0, 0, "", [4], tool_calls=[ToolCallDelta(0, arguments="2}")], finish_reason="tool_calls",
                  usage=Usage(5, 4, 0)))
    message = agg.body()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": None, "reasoning": "hm", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": '{"x":2}'}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}


def test_continuous_usage_on_every_event():
    plan = plan_of("completion", prompt=["a", "b"], stream=True,
                   stream_options={"include_usage": True, "continuous_usage_stats": True})
    enc = StreamEncoder(plan, "cmpl-u", 1)
    ev = events(enc.event(Chunk(1, 0, "x", [1, 2])) + enc.event(Chunk(0, 0, "y", [3], finish_reason="stop",
                                                                        usage=Usage(4, 1, 0)))
                + enc.event(Chunk(1, 0, "z", [4], finish_reason="stop", usage=Usage(6, 3, 0))) + enc.end())
    assert [e["usage"] for e in ev[:3]] == [
        {"prompt_tokens": 0, "completion_tokens": 2, "total_tokens": 2},   # prompt not reported yet
        {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
        {"prompt_tokens": 6, "completion_tokens": 3, "total_tokens": 9}]
    assert ev[3]["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}


def test_text_events_from_the_template_are_the_bytes_of_the_general_path():
    """StreamEncoder writes a text-only event from a byte template; it must equal the dict path's."""
    for kind, body in (("chat", {"n": 2}), ("completion", {"prompt": "p", "n": 2, "stream_options": {"include_usage": True}}),
                       ("completion", {"prompt": ["a", "b"], "logprobs": 1})):
        plan = plan_of(kind, stream=True, **body)
        fast, general = StreamEncoder(plan, "id-1", 5), StreamEncoder(plan, "id-1", 5)
        general._plain = False
        for chunk in (Chunk(1, 1, "x", [1]), Chunk(1, 1, 'a "quoted" ✓\n', [2, 3]), Chunk(0, 0, "é", [4])):
            assert fast.event(chunk) == general.event(chunk)
