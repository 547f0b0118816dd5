"""Conversions between the generated protobuf messages and our dataclasses."""

from __future__ import annotations

from vllm_fleet.protocol import worker_pb2 as pb
from vllm_fleet.protocol.types import (
    ChatMessage,
    Chunk,
    GenerateInput,
    GenerateRequest,
    SamplingParams,
    TokenLogprob,
    Usage,
    WorkerInfo,
    WorkerLoad,
)

_OPTIONAL_PARAMS = (
    "temperature", "top_p", "top_k", "max_tokens", "min_tokens", "seed", "n", "logprobs",
    "presence_penalty", "frequency_penalty", "repetition_penalty",
)


def params_to_pb(params: SamplingParams) -> pb.SamplingParams:
    msg = pb.SamplingParams(
        stop=params.stop, stop_token_ids=params.stop_token_ids, ignore_eos=params.ignore_eos
    )
    for name in _OPTIONAL_PARAMS:
        value = getattr(params, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def params_from_pb(msg: pb.SamplingParams) -> SamplingParams:
    params = SamplingParams(
        stop=list(msg.stop), stop_token_ids=list(msg.stop_token_ids), ignore_eos=msg.ignore_eos
    )
    for name in _OPTIONAL_PARAMS:
        if msg.HasField(name):
            setattr(params, name, getattr(msg, name))
    return params


def input_to_pb(item: GenerateInput) -> pb.GenerateInput:
    msg = pb.GenerateInput(resume_token_ids=item.resume_token_ids)
    if item.messages is not None:
        msg.chat.messages.extend(pb.ChatMessage(role=m.role, content=m.content) for m in item.messages)
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
    if kind == "chat":
        return GenerateInput(
            messages=[ChatMessage(role=m.role, content=m.content) for m in msg.chat.messages],
            resume_token_ids=resume,
        )
    if kind == "token_ids":
        return GenerateInput(token_ids=list(msg.token_ids.ids), resume_token_ids=resume)
    return GenerateInput(text=msg.text, resume_token_ids=resume)


def request_to_pb(request: GenerateRequest) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request.request_id,
        inputs=[input_to_pb(i) for i in request.inputs],
        params=params_to_pb(request.params),
        session_id=request.session_id,
        priority=request.priority,
        stream_interval_ms=request.stream_interval_ms,
    )


def request_from_pb(msg: pb.GenerateRequest) -> GenerateRequest:
    return GenerateRequest(
        request_id=msg.request_id,
        inputs=[input_from_pb(i) for i in msg.inputs],
        params=params_from_pb(msg.params),
        session_id=msg.session_id,
        priority=msg.priority,
        stream_interval_ms=msg.stream_interval_ms,
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
    return Chunk(
        index=msg.index,
        sample=msg.sample,
        text=msg.text,
        token_ids=list(msg.token_ids),
        finish_reason=msg.finish_reason or None,
        usage=usage,
        logprobs=logprobs,
        stop_reason=msg.stop_reason or None,
    )


def info_to_pb(info: WorkerInfo) -> pb.WorkerInfo:
    return pb.WorkerInfo(
        model=info.model, max_model_len=info.max_model_len, engine=info.engine, version=info.version,
        engine_version=info.engine_version, settings=info.settings, device=info.device,
        worker_id=info.worker_id,
    )


def info_from_pb(msg: pb.WorkerInfo) -> WorkerInfo:
    return WorkerInfo(
        model=msg.model, max_model_len=msg.max_model_len, engine=msg.engine, version=msg.version,
        engine_version=msg.engine_version, settings=dict(msg.settings), device=msg.device,
        worker_id=msg.worker_id,
    )


def load_to_pb(load: WorkerLoad) -> pb.WorkerLoad:
    return pb.WorkerLoad(
        running=load.running, waiting=load.waiting, kv_cache_usage=load.kv_cache_usage,
        prefix_cache_hit_rate=load.prefix_cache_hit_rate, output_tokens_per_s=load.output_tokens_per_s,
        in_flight=load.in_flight, draining=load.draining,
    )


def load_from_pb(msg: pb.WorkerLoad) -> WorkerLoad:
    return WorkerLoad(
        running=msg.running, waiting=msg.waiting, kv_cache_usage=msg.kv_cache_usage,
        prefix_cache_hit_rate=msg.prefix_cache_hit_rate, output_tokens_per_s=msg.output_tokens_per_s,
        in_flight=msg.in_flight, draining=msg.draining,
    )
