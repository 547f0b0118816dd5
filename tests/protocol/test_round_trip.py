"""dataclass → protobuf → bytes → protobuf → dataclass is the identity (protocol/convert.py).

Property-based: hypothesis draws every input kind, every optional sampling parameter unset,
zero or set, and chunks with and without logprobs, usage and finish reasons. The values drawn
are those the wire can hold: integers within their proto widths, floats that fit 32 bits (the
proto's `float`), text without lone surrogates (protobuf strings are UTF-8).
"""

from __future__ import annotations

from hypothesis import given, strategies as st

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
from vllm_fleet.protocol.types import (
    Adapter,
    CHAT_ROLES,
    ChatMessage,
    Chunk,
    Constraint,
    GenerateInput,
    GenerateRequest,
    OpenAIOptions,
    SamplingParams,
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


sampling_params = st.builds(
    SamplingParams,
    temperature=_maybe(f32), top_p=_maybe(f32), top_k=_maybe(i32), max_tokens=_maybe(i32),
    min_tokens=_maybe(i32), stop=st.lists(text, max_size=3), stop_token_ids=ids, seed=_maybe(i64),
    n=_maybe(i32), logprobs=_maybe(i32), ignore_eos=st.booleans(), presence_penalty=_maybe(f32),
    frequency_penalty=_maybe(f32), repetition_penalty=_maybe(f32), min_p=_maybe(f32),
    logit_bias=st.dictionaries(i32, f32, max_size=3), bad_words=st.lists(text, max_size=3),
    allowed_token_ids=ids, include_stop_str_in_output=st.booleans(), skip_special_tokens=st.none() | st.booleans(),
    truncate_prompt_tokens=_maybe(i32),
    # Exactly one kind per constraint (what the type promises), each possibly empty.
    constraint=st.none() | st.one_of(
        st.builds(Constraint, json_schema=text), st.builds(Constraint, json_object=st.just(True)),
        st.builds(Constraint, regex=text), st.builds(Constraint, choice=st.lists(text, max_size=3)),
        st.builds(Constraint, grammar=text), st.builds(Constraint, structural_tag=text),
    ),
)
messages = st.lists(st.builds(ChatMessage, role=st.sampled_from(CHAT_ROLES) | text, content=text, name=text,
                              tool_call_id=text, tool_calls_json=text, reasoning=text), max_size=4)
# Exactly one kind per input, including the empty one of each (an empty prompt stays a prompt).
delivered = st.none() | u32
inputs = st.one_of(
    st.builds(GenerateInput, text=text, resume_token_ids=ids, resume_delivered_chars=delivered),
    st.builds(GenerateInput, messages=messages, resume_token_ids=ids, resume_delivered_chars=delivered),
    st.builds(GenerateInput, token_ids=ids, resume_token_ids=ids, resume_delivered_chars=delivered),
)
requests = st.builds(
    GenerateRequest, request_id=text, inputs=st.lists(inputs, max_size=4), params=sampling_params,
    session_id=text, priority=i32, stream_interval_ms=u32,
    openai=st.none() | st.builds(OpenAIOptions, endpoint=st.sampled_from(["chat", "completion"]),
                                 body_json=st.binary(max_size=40)),
    constrained=st.booleans(), adapter=text,
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


def test_unset_and_zero_sampling_params_stay_apart():
    # temperature=0 is greedy, None is the model's default: collapsing them changes the answer.
    zeros = SamplingParams(temperature=0.0, top_k=0, max_tokens=0, seed=0, n=0, logprobs=0, presence_penalty=0.0)
    for params in (SamplingParams(), zeros):
        request = GenerateRequest("r", [GenerateInput(text="")], params)
        assert request_from_pb(_over_the_wire(request_to_pb(request))).params == params


def test_non_canonical_chunk_fields_read_back_canonical():
    # Empty reasons and an empty logprobs list mean "none" on the wire, as in types.Chunk.
    chunk = Chunk(index=0, sample=0, text="", token_ids=[], finish_reason="", logprobs=[], stop_reason="",
                  tool_calls=[])
    assert chunk_from_pb(_over_the_wire(chunk_to_pb(chunk))) == Chunk(index=0, sample=0, text="", token_ids=[])
