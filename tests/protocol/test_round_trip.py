"""dataclass → protobuf → bytes → protobuf → dataclass is the identity (protocol/convert.py).

Property-based: hypothesis draws every input kind, envelopes with any body, and chunks with and
without logprobs, usage and finish reasons. The values drawn
are those the wire can hold: integers within their proto widths, floats that fit 32 bits (the
proto's `float`), text without lone surrogates (protobuf strings are UTF-8).
"""

from __future__ import annotations

from hypothesis import given, strategies as st

import json

from vllm_fleet.protocol import worker_pb2 as pb
from vllm_fleet.protocol.convert import (
    adapters_from_pb,
    adapters_to_pb,
    chunk_from_pb,
    chunk_to_pb,
    info_from_pb,
    info_to_pb,
    load_from_pb,
    load_to_pb,
    request_from_pb,
    request_to_pb,
)
from vllm_fleet.protocol.sampling import Constraint, SamplingParams, build_request
from vllm_fleet.protocol.types import (
    CHAT_ROLES,
    Adapter,
    Chunk,
    GenerateInput,
    GenerateRequest,
    RequestBody,
    TokenLogprob,
    ToolCallDelta,
    Usage,
    WorkerInfo,
    WorkerLoad,
)

# Zero drawn often on purpose: it is proto3's "unset", where presence bugs hide.
u32 = st.just(0) | st.integers(0, 2**32 - 1)
i32 = st.just(0) | st.integers(-(2**31), 2**31 - 1)
i64 = st.just(0) | st.integers(-(2**63), 2**63 - 1)
f32 = st.just(0.0) | st.floats(width=32, allow_nan=False)  # NaN != NaN; infinities cross (a logprob may be -inf)
text = st.text(st.characters(codec="utf-8"), max_size=20)
ids = st.lists(u32, max_size=8)


def _maybe(values: st.SearchStrategy) -> st.SearchStrategy:
    """Unset, zero, or any value: None and 0 must stay apart (proto3 `optional`)."""
    return st.one_of(st.none(), st.just(0), values)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | text,
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                           max_leaves=6)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(CHAT_ROLES) | text, "content": text | st.none()},
                                          optional={"name": text, "tool_call_id": text, "reasoning": text,
                                                    "tool_calls": st.lists(json_values, max_size=2)}),
                    max_size=4)
# Exactly one kind per input, including the empty one of each (an empty prompt stays a prompt).
delivered = st.none() | u32
# The router's ids come with the digest of the files that rendered them, or not at all (canonical:
# None and "", never an empty list); an input of token ids never carries them.
router_ids = st.one_of(st.just({}), st.fixed_dictionaries({"router_token_ids": st.lists(u32, min_size=1, max_size=8),
                                                           "router_ids_digest": text}))
inputs = st.one_of(
    router_ids.flatmap(lambda r: st.builds(GenerateInput, text=text, resume_token_ids=ids,
                                           resume_delivered_chars=delivered, **{k: st.just(v) for k, v in r.items()})),
    router_ids.flatmap(lambda r: st.builds(GenerateInput, messages=messages, resume_token_ids=ids,
                                           resume_delivered_chars=delivered, **{k: st.just(v) for k, v in r.items()})),
    st.builds(GenerateInput, token_ids=ids, resume_token_ids=ids, resume_delivered_chars=delivered),
)
requests = st.builds(
    GenerateRequest, request_id=text, inputs=st.lists(inputs, max_size=4),
    body=st.builds(RequestBody, endpoint=st.sampled_from(["chat", "completion"]), body_json=st.binary(max_size=40)),
    n=st.integers(1, 2**32 - 1), session_id=text, priority=i32, stream_interval_ms=u32, constrained=st.booleans(),
    adapter=text,
)

# A chunk's canonical form: finish/stop reasons are None or non-empty, logprobs None or non-empty
# (types.Chunk says so; test_non_canonical_chunk_fields_read_back_canonical covers the rest).
token_logprobs = st.builds(TokenLogprob, token_id=u32, token=text, logprob=f32,
                           top=st.lists(st.tuples(u32, text, f32), max_size=3))
chunks = st.builds(
    Chunk, index=u32, sample=u32, text=text, token_ids=ids,
    finish_reason=st.none() | st.sampled_from(["stop", "length", "abort"]) | text.filter(bool),
    usage=st.none() | st.builds(Usage, u32, u32, u32),
    logprobs=st.none() | st.lists(token_logprobs, min_size=1, max_size=4),
    stop_reason=st.none() | text.filter(bool),
    reasoning=text,
    tool_calls=st.none() | st.lists(st.builds(ToolCallDelta, index=u32, id=text, name=text, arguments=text),
                                    min_size=1, max_size=3),
    prompt_text=st.none() | text,
)
infos = st.builds(
    WorkerInfo, model=text, max_model_len=u32, engine=text, version=text, engine_version=text,
    settings=st.dictionaries(text, text, max_size=4), device=text, worker_id=text, pool=text,
    tokenizer_digest=text, takes_router_ids=st.booleans(),
)
loads = st.builds(
    WorkerLoad, running=u32, waiting=u32, kv_cache_usage=f32, prefix_cache_hit_rate=f32,
    output_tokens_per_s=f32, in_flight=u32, draining=st.booleans(), adapters=st.lists(text, max_size=3),
    max_adapters=u32,
)


def _over_the_wire(message):
    """What the other side parses: the message serialized and read back."""
    return type(message).FromString(message.SerializeToString())


@given(requests)
def test_generate_request_round_trip(request):
    assert request_from_pb(_over_the_wire(request_to_pb(request))) == request


@given(chunks)
def test_chunk_round_trip(chunk):
    assert chunk_from_pb(_over_the_wire(chunk_to_pb(chunk))) == chunk


@given(chunks)
def test_chunk_round_trip_inside_a_mux_event(chunk):
    event = pb.MuxEvent(stream=1, chunks=[chunk_to_pb(chunk)])
    assert [chunk_from_pb(c) for c in _over_the_wire(event).chunks] == [chunk]


@given(infos)
def test_worker_info_round_trip(info):
    assert info_from_pb(_over_the_wire(info_to_pb(info))) == info


@given(st.lists(st.builds(Adapter, name=text, path=text, rank=u32, base_model=text), max_size=3), u32)
def test_adapter_list_round_trip(adapters, max_adapters):
    assert adapters_from_pb(_over_the_wire(adapters_to_pb(adapters, max_adapters))) == (adapters, max_adapters)


@given(loads)
def test_worker_load_round_trip(load):
    assert load_from_pb(_over_the_wire(load_to_pb(load))) == load


def test_unset_and_zero_sampling_params_stay_apart_in_the_body():
    # temperature=0 is greedy, None is the model's default: collapsing them changes the answer.
    zeros = SamplingParams(temperature=0.0, top_k=0, max_tokens=0, seed=0, logprobs=0, presence_penalty=0.0)
    unset = json.loads(build_request("r", [GenerateInput(text="x")], SamplingParams()).body.body_json)
    zero = json.loads(build_request("r", [GenerateInput(text="x")], zeros).body.body_json)
    assert unset == {}
    assert zero == {"temperature": 0.0, "top_k": 0, "max_tokens": 0, "seed": 0, "logprobs": 0, "presence_penalty": 0.0}


def test_the_envelope_carries_no_sampling_field():
    request = build_request("r", [GenerateInput(text="x")], SamplingParams(temperature=0.5, max_tokens=7, n=3,
                                                                          stop=["."], logit_bias={5: 1.0}))
    msg = request_to_pb(request)
    assert msg.n == 3
    assert json.loads(msg.body.body_json) == {"temperature": 0.5, "max_tokens": 7, "stop": ["."],
                                              "logit_bias": {"5": 1.0}}


def test_the_previous_release_fields_are_retired_for_good():
    # No compatibility shims before 1.0: typed params (3) and typed chat inputs (2) are gone, and
    # their numbers reserved so a stale peer's bytes are never read as some new field.
    assert "params" not in pb.GenerateRequest.DESCRIPTOR.fields_by_name
    assert 3 not in pb.GenerateRequest.DESCRIPTOR.fields_by_number
    assert "chat" not in pb.GenerateInput.DESCRIPTOR.fields_by_name
    assert 2 not in pb.GenerateInput.DESCRIPTOR.fields_by_number
    assert not hasattr(pb, "SamplingParams") and not hasattr(pb, "ChatMessages")


def test_messages_that_are_not_a_json_list_are_refused_naming_them():
    msg = pb.GenerateRequest(request_id="bad", n=1, body=pb.RequestBody(endpoint="chat", body_json=b"{}"))
    msg.inputs.add().messages_json = b'{"role": "user"}'
    try:
        request_from_pb(msg)
    except ValueError as exc:
        assert getattr(exc, "param", None) == "messages"
    else:
        raise AssertionError("a request whose messages are not a list was read")


def test_non_canonical_chunk_fields_read_back_canonical():
    # Empty reasons and an empty logprobs list mean "none" on the wire, as in types.Chunk.
    chunk = Chunk(index=0, sample=0, text="", token_ids=[], finish_reason="", logprobs=[], stop_reason="",
                  tool_calls=[])
    assert chunk_from_pb(_over_the_wire(chunk_to_pb(chunk))) == Chunk(index=0, sample=0, text="", token_ids=[])
