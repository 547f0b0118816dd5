"""Conversions between the generated protobuf messages and our dataclasses."""

from __future__ import annotations

import json

from vllm_fleet.protocol import worker_pb2 as pb
from vllm_fleet.protocol.types import (
    Adapter,
    Chunk,
    GenerateInput,
    GenerateRequest,
    RequestBody,
    PromptLogprob,
    RoutingHints,
    TokenLogprob,
    ToolCallDelta,
    Usage,
    WorkerInfo,
    WorkerLoad,
)


class MalformedRequestError(ValueError):
    """A request whose bytes cannot be read as this protocol's form (a client's bug, not a user's
    input): the worker answers INVALID_ARGUMENT naming `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def input_to_pb(item: GenerateInput) -> pb.GenerateInput:
    msg = pb.GenerateInput(resume_token_ids=item.resume_token_ids)
    if item.resume_delivered_chars is not None:
        msg.resume_delivered_chars = item.resume_delivered_chars
    if item.messages is not None:
        msg.messages_json = _json(item.messages)
    elif item.token_ids is not None:
        msg.token_ids.ids.extend(item.token_ids)
        if not item.token_ids:
            msg.token_ids.SetInParent()
    else:
        msg.text = item.text or ""
    if item.router_token_ids:
        msg.router_token_ids.extend(item.router_token_ids)
        msg.router_ids_digest = item.router_ids_digest
    return msg


def input_from_pb(msg: pb.GenerateInput) -> GenerateInput:
    """Raises MalformedRequestError when `messages_json` is not a JSON list of objects."""
    kind = msg.WhichOneof("kind")
    resume = list(msg.resume_token_ids)
    delivered = msg.resume_delivered_chars if msg.HasField("resume_delivered_chars") else None
    if kind == "token_ids":  # ids as given: nothing for the router's to replace
        return GenerateInput(token_ids=list(msg.token_ids.ids), resume_token_ids=resume,
                             resume_delivered_chars=delivered)
    router_ids = list(msg.router_token_ids) if msg.router_token_ids else None
    extra = {"resume_token_ids": resume, "resume_delivered_chars": delivered, "router_token_ids": router_ids,
             "router_ids_digest": msg.router_ids_digest if router_ids else ""}
    if kind == "messages_json":
        return GenerateInput(messages=_messages(msg.messages_json), **extra)
    return GenerateInput(text=msg.text, **extra)


def _json(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _messages(data: bytes) -> list:
    try:
        messages = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MalformedRequestError(f"messages_json is not JSON: {exc}", "messages") from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise MalformedRequestError("messages must be a list of message objects", "messages")
    return messages


def request_to_pb(request: GenerateRequest) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request.request_id,
        inputs=[input_to_pb(i) for i in request.inputs],
        session_id=request.session_id,
        priority=request.priority,
        stream_interval_ms=request.stream_interval_ms,
        body=pb.RequestBody(endpoint=request.body.endpoint, body_json=request.body.body_json),
        constrained=request.constrained,
        adapter=request.adapter,
        n=request.n,
        batch=request.hints.service_class == "batch",
    )


def request_from_pb(msg: pb.GenerateRequest) -> GenerateRequest:
    """Raises MalformedRequestError for inputs that cannot be read."""
    return GenerateRequest(
        request_id=msg.request_id,
        inputs=[input_from_pb(i) for i in msg.inputs],
        body=RequestBody(endpoint=msg.body.endpoint, body_json=msg.body.body_json),
        n=msg.n,  # 0 from a new router is a bug the worker refuses (n must be at least 1)
        session_id=msg.session_id,
        priority=msg.priority,
        stream_interval_ms=msg.stream_interval_ms,
        constrained=msg.constrained,
        adapter=msg.adapter,
        hints=RoutingHints(service_class="batch" if msg.batch else "interactive"),
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
    if chunk.prompt_logprobs:
        msg.prompt_logprobs.extend(
            pb.PromptLogprob(token_id=lp.token_id, token=lp.token, logprob=lp.logprob,
                             candidates=[pb.TopLogprob(token_id=t, token=s, logprob=p, rank=r)
                                         for t, s, p, r in lp.candidates])
            for lp in chunk.prompt_logprobs
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
    prompt_logprobs = None
    if msg.prompt_logprobs:
        prompt_logprobs = [
            PromptLogprob(lp.token_id, lp.token, lp.logprob if lp.HasField("logprob") else None,
                          [(t.token_id, t.token, t.logprob, t.rank) for t in lp.candidates])
            for lp in msg.prompt_logprobs
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
        prompt_logprobs=prompt_logprobs,
    )


def info_to_pb(info: WorkerInfo) -> pb.WorkerInfo:
    return pb.WorkerInfo(
        model=info.model, max_model_len=info.max_model_len, engine=info.engine, version=info.version,
        engine_version=info.engine_version, settings=info.settings, device=info.device,
        worker_id=info.worker_id, pool=info.pool, request_form=info.request_form,
        kv_block_size=info.kv_block_size, kv_events=info.kv_events, tasks=info.tasks,
        pooling_endpoints=info.pooling_endpoints, tokenizer_digest=info.tokenizer_digest,
        takes_router_ids=info.takes_router_ids,
    )


def info_from_pb(msg: pb.WorkerInfo) -> WorkerInfo:
    return WorkerInfo(
        model=msg.model, max_model_len=msg.max_model_len, engine=msg.engine, version=msg.version,
        engine_version=msg.engine_version, settings=dict(msg.settings), device=msg.device,
        worker_id=msg.worker_id, pool=msg.pool, request_form=msg.request_form,
        kv_block_size=msg.kv_block_size, kv_events=msg.kv_events, tasks=list(msg.tasks),
        pooling_endpoints=list(msg.pooling_endpoints), tokenizer_digest=msg.tokenizer_digest,
        takes_router_ids=msg.takes_router_ids,
    )


def load_to_pb(load: WorkerLoad) -> pb.WorkerLoad:
    return pb.WorkerLoad(
        running=load.running, waiting=load.waiting, kv_cache_usage=load.kv_cache_usage,
        prefix_cache_hit_rate=load.prefix_cache_hit_rate, output_tokens_per_s=load.output_tokens_per_s,
        in_flight=load.in_flight, draining=load.draining, adapters=load.adapters,
        max_adapters=load.max_adapters, health=load.health,
        prefix_cache_queries=load.prefix_cache_queries, prefix_cache_hits=load.prefix_cache_hits,
        interactive_ttft_p90_ms=load.interactive_ttft_p90_ms, interactive_itl_p90_ms=load.interactive_itl_p90_ms,
        interactive_ttft_p90_floor_ms=load.interactive_ttft_p90_floor_ms,
        interactive_itl_p90_floor_ms=load.interactive_itl_p90_floor_ms,
        interactive_ttft_baseline_ms=load.interactive_ttft_baseline_ms,
        interactive_itl_baseline_ms=load.interactive_itl_baseline_ms, engine_silent_s=load.engine_silent_s,
    )


def load_from_pb(msg: pb.WorkerLoad) -> WorkerLoad:
    return WorkerLoad(
        running=msg.running, waiting=msg.waiting, kv_cache_usage=msg.kv_cache_usage,
        prefix_cache_hit_rate=msg.prefix_cache_hit_rate, output_tokens_per_s=msg.output_tokens_per_s,
        in_flight=msg.in_flight, draining=msg.draining, adapters=list(msg.adapters),
        max_adapters=msg.max_adapters, health=msg.health,
        prefix_cache_queries=msg.prefix_cache_queries, prefix_cache_hits=msg.prefix_cache_hits,
        interactive_ttft_p90_ms=msg.interactive_ttft_p90_ms, interactive_itl_p90_ms=msg.interactive_itl_p90_ms,
        interactive_ttft_p90_floor_ms=msg.interactive_ttft_p90_floor_ms,
        interactive_itl_p90_floor_ms=msg.interactive_itl_p90_floor_ms,
        interactive_ttft_baseline_ms=msg.interactive_ttft_baseline_ms,
        interactive_itl_baseline_ms=msg.interactive_itl_baseline_ms, engine_silent_s=msg.engine_silent_s,
    )


def adapters_to_pb(adapters: list[Adapter], max_adapters: int) -> pb.AdapterList:
    return pb.AdapterList(
        adapters=[pb.Adapter(name=a.name, path=a.path, rank=a.rank, base_model=a.base_model) for a in adapters],
        max_adapters=max_adapters,
    )


def adapters_from_pb(msg: pb.AdapterList) -> tuple[list[Adapter], int]:
    return [Adapter(a.name, a.path, a.rank, a.base_model) for a in msg.adapters], msg.max_adapters
