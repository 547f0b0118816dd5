"""Conversions between the generated protobuf messages and our dataclasses."""

from __future__ import annotations

from vllm_fleet.protocol import worker_pb2 as pb
from vllm_fleet.protocol.types import (
    Adapter,
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

_OPTIONAL_PARAMS = (
    "temperature", "top_p", "top_k", "max_tokens", "min_tokens", "seed", "n", "logprobs",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "skip_special_tokens",
    "truncate_prompt_tokens",
)
_CONSTRAINT_TEXT = ("json_schema", "regex", "grammar", "structural_tag")


def params_to_pb(params: SamplingParams) -> pb.SamplingParams:
    msg = pb.SamplingParams(
        stop=params.stop, stop_token_ids=params.stop_token_ids, ignore_eos=params.ignore_eos,
        logit_bias=params.logit_bias, bad_words=params.bad_words, allowed_token_ids=params.allowed_token_ids,
        include_stop_str_in_output=params.include_stop_str_in_output,
    )
    for name in _OPTIONAL_PARAMS:
        value = getattr(params, name)
        if value is not None:
            setattr(msg, name, value)
    if params.constraint is not None:
        constraint_to_pb(msg.constraint, params.constraint)
    return msg


def params_from_pb(msg: pb.SamplingParams) -> SamplingParams:
    params = SamplingParams(
        stop=list(msg.stop), stop_token_ids=list(msg.stop_token_ids), ignore_eos=msg.ignore_eos,
        logit_bias=dict(msg.logit_bias), bad_words=list(msg.bad_words),
        allowed_token_ids=list(msg.allowed_token_ids), include_stop_str_in_output=msg.include_stop_str_in_output,
    )
    for name in _OPTIONAL_PARAMS:
        if msg.HasField(name):
            setattr(params, name, getattr(msg, name))
    if msg.HasField("constraint"):
        params.constraint = constraint_from_pb(msg.constraint)
    return params


def constraint_to_pb(msg: pb.Constraint, constraint: Constraint) -> None:
    kind = constraint.kind
    if kind in _CONSTRAINT_TEXT:
        setattr(msg, kind, getattr(constraint, kind))
    elif kind == "choice":
        msg.choice.choices.extend(constraint.choice or [])
        msg.choice.SetInParent()
    elif kind == "json_object":
        msg.json_object = True
    else:
        msg.SetInParent()  # an empty constraint stays one (the worker refuses it by name)


def constraint_from_pb(msg: pb.Constraint) -> Constraint:
    kind = msg.WhichOneof("kind")
    if kind in _CONSTRAINT_TEXT:
        return Constraint(**{kind: getattr(msg, kind)})
    if kind == "choice":
        return Constraint(choice=list(msg.choice.choices))
    return Constraint(json_object=kind == "json_object" and msg.json_object)


def message_to_pb(message: ChatMessage) -> pb.ChatMessage:
    return pb.ChatMessage(role=message.role, content=message.content, name=message.name,
                          tool_call_id=message.tool_call_id, tool_calls_json=message.tool_calls_json,
                          reasoning=message.reasoning)


def message_from_pb(msg: pb.ChatMessage) -> ChatMessage:
    return ChatMessage(role=msg.role, content=msg.content, name=msg.name, tool_call_id=msg.tool_call_id,
                       tool_calls_json=msg.tool_calls_json, reasoning=msg.reasoning)


def input_to_pb(item: GenerateInput) -> pb.GenerateInput:
    msg = pb.GenerateInput(resume_token_ids=item.resume_token_ids)
    if item.resume_delivered_chars is not None:
        msg.resume_delivered_chars = item.resume_delivered_chars
    if item.messages is not None:
        msg.chat.messages.extend(message_to_pb(m) for m in item.messages)
        if not item.messages:
            msg.chat.SetInParent()
    elif item.token_ids is not None:
        msg.token_ids.ids.extend(item.token_ids)
        if not item.token_ids:
            msg.token_ids.SetInParent()
    else:
        msg.text = item.text or ""
    return msg


def input_from_pb(msg: pb.GenerateInput) -> GenerateInput:
    kind = msg.WhichOneof("kind")
    resume = list(msg.resume_token_ids)
    delivered = msg.resume_delivered_chars if msg.HasField("resume_delivered_chars") else None
    if kind == "chat":
        return GenerateInput(messages=[message_from_pb(m) for m in msg.chat.messages],
                             resume_token_ids=resume, resume_delivered_chars=delivered)
    if kind == "token_ids":
        return GenerateInput(token_ids=list(msg.token_ids.ids), resume_token_ids=resume,
                             resume_delivered_chars=delivered)
    return GenerateInput(text=msg.text, resume_token_ids=resume, resume_delivered_chars=delivered)


def request_to_pb(request: GenerateRequest) -> pb.GenerateRequest:
    msg = pb.GenerateRequest(
        request_id=request.request_id,
        inputs=[input_to_pb(i) for i in request.inputs],
        params=params_to_pb(request.params),
        session_id=request.session_id,
        priority=request.priority,
        stream_interval_ms=request.stream_interval_ms,
        constrained=request.constrained,
        adapter=request.adapter,
    )
    if request.openai is not None:
        msg.openai.endpoint = request.openai.endpoint
        msg.openai.body_json = request.openai.body_json
    return msg


def request_from_pb(msg: pb.GenerateRequest) -> GenerateRequest:
    openai = None
    if msg.HasField("openai"):
        openai = OpenAIOptions(endpoint=msg.openai.endpoint, body_json=msg.openai.body_json)
    return GenerateRequest(
        request_id=msg.request_id,
        inputs=[input_from_pb(i) for i in msg.inputs],
        params=params_from_pb(msg.params),
        session_id=msg.session_id,
        priority=msg.priority,
        stream_interval_ms=msg.stream_interval_ms,
        openai=openai,
        constrained=msg.constrained,
        adapter=msg.adapter,
    )


def chunk_to_pb(chunk: Chunk) -> pb.GenerateChunk:
    msg = pb.GenerateChunk()
    fill_chunk_pb(msg, chunk)
    return msg


def fill_chunk_pb(msg: pb.GenerateChunk, chunk: Chunk) -> None:
    """Write `chunk` into an empty message (e.g. `event.chunks.add()`, which avoids a copy)."""
    msg.index = chunk.index
    msg.sample = chunk.sample
    msg.text = chunk.text
    msg.token_ids.extend(chunk.token_ids)
    if chunk.finish_reason:
        msg.finish_reason = chunk.finish_reason
    if chunk.stop_reason:
        msg.stop_reason = chunk.stop_reason
    if chunk.usage is not None:
        msg.usage.prompt_tokens = chunk.usage.prompt_tokens
        msg.usage.completion_tokens = chunk.usage.completion_tokens
        msg.usage.cached_tokens = chunk.usage.cached_tokens
    if chunk.logprobs:
        msg.logprobs.extend(
            pb.TokenLogprob(
                token_id=lp.token_id,
                token=lp.token,
                logprob=lp.logprob,
                top=[pb.TopLogprob(token_id=t, token=s, logprob=p) for t, s, p in lp.top],
            )
            for lp in chunk.logprobs
        )
    if chunk.reasoning:
        msg.reasoning = chunk.reasoning
    if chunk.tool_calls:
        msg.tool_calls.extend(
            pb.ToolCallDelta(index=call.index, id=call.id, name=call.name, arguments=call.arguments)
            for call in chunk.tool_calls
        )
    if chunk.prompt_text is not None:
        msg.prompt_text = chunk.prompt_text


def chunk_from_pb(msg: pb.GenerateChunk) -> Chunk:
    usage = None
    if msg.HasField("usage"):
        u = msg.usage
        usage = Usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
    logprobs = None
    if msg.logprobs:
        logprobs = [
            TokenLogprob(lp.token_id, lp.token, lp.logprob, [(t.token_id, t.token, t.logprob) for t in lp.top])
            for lp in msg.logprobs
        ]
    tool_calls = None
    if msg.tool_calls:
        tool_calls = [ToolCallDelta(c.index, c.id, c.name, c.arguments) for c in msg.tool_calls]
    return Chunk(
        index=msg.index,
        sample=msg.sample,
        text=msg.text,
        token_ids=list(msg.token_ids),
        finish_reason=msg.finish_reason or None,
        usage=usage,
        logprobs=logprobs,
        stop_reason=msg.stop_reason or None,
        reasoning=msg.reasoning,
        tool_calls=tool_calls,
        prompt_text=msg.prompt_text if msg.HasField("prompt_text") else None,
    )


def info_to_pb(info: WorkerInfo) -> pb.WorkerInfo:
    return pb.WorkerInfo(
        model=info.model, max_model_len=info.max_model_len, engine=info.engine, version=info.version,
        engine_version=info.engine_version, settings=info.settings, device=info.device,
        worker_id=info.worker_id, pool=info.pool,
    )


def info_from_pb(msg: pb.WorkerInfo) -> WorkerInfo:
    return WorkerInfo(
        model=msg.model, max_model_len=msg.max_model_len, engine=msg.engine, version=msg.version,
        engine_version=msg.engine_version, settings=dict(msg.settings), device=msg.device,
        worker_id=msg.worker_id, pool=msg.pool,
    )


def load_to_pb(load: WorkerLoad) -> pb.WorkerLoad:
    return pb.WorkerLoad(
        running=load.running, waiting=load.waiting, kv_cache_usage=load.kv_cache_usage,
        prefix_cache_hit_rate=load.prefix_cache_hit_rate, output_tokens_per_s=load.output_tokens_per_s,
        in_flight=load.in_flight, draining=load.draining, adapters=load.adapters,
        max_adapters=load.max_adapters, health=load.health,
    )


def load_from_pb(msg: pb.WorkerLoad) -> WorkerLoad:
    return WorkerLoad(
        running=msg.running, waiting=msg.waiting, kv_cache_usage=msg.kv_cache_usage,
        prefix_cache_hit_rate=msg.prefix_cache_hit_rate, output_tokens_per_s=msg.output_tokens_per_s,
        in_flight=msg.in_flight, draining=msg.draining, adapters=list(msg.adapters),
        max_adapters=msg.max_adapters, health=msg.health,
    )


def adapters_to_pb(adapters: list[Adapter], max_adapters: int) -> pb.AdapterList:
    return pb.AdapterList(
        adapters=[pb.Adapter(name=a.name, path=a.path, rank=a.rank, base_model=a.base_model) for a in adapters],
        max_adapters=max_adapters,
    )


def adapters_from_pb(msg: pb.AdapterList) -> tuple[list[Adapter], int]:
    return [Adapter(a.name, a.path, a.rank, a.base_model) for a in msg.adapters], msg.max_adapters
