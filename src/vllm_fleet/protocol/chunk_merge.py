"""Folding chunks of one (index, sample) stream that are already waiting into one.

A chunk that is still waiting when the next one of its stream arrives reaches the client no
sooner than that one: sent as one, they cost each hop one pass instead of two (a chunk in the
worker's message, a chunk through the router, an SSE event, a socket write). vLLM's own front
end does the same when its consumer lags (RequestOutputCollector merges DELTA outputs). Only
chunks that wait anyway are folded, so nothing is delayed; text, token ids, logprobs and
reasoning are concatenated, so no token is lost or repeated, and a folded chunk is what the
worker's coalescing (`stream_interval_ms`) would have sent.

A chunk is folded into the one before it only if that one has not finished and neither carries
tool-call pieces (they merge by call index: the worker's coalescer does that), and the later one
carries no prompt echo or prompt logprobs (those start a stream).
"""

from __future__ import annotations

from vllm_fleet.protocol import worker_pb2 as pb
from vllm_fleet.protocol.types import Chunk


def can_fold(earlier: pb.GenerateChunk, later: pb.GenerateChunk | Chunk) -> bool:
    """Whether `later` (the next chunk of the same stream) may be folded into `earlier`."""
    if earlier.finish_reason or earlier.tool_calls or later.tool_calls or later.prompt_logprobs:
        return False
    return not (later.HasField("prompt_text") if isinstance(later, pb.GenerateChunk) else later.prompt_text is not None)


def fold(earlier: pb.GenerateChunk, later: pb.GenerateChunk) -> None:
    """Append `later` to `earlier` in place (can_fold said yes)."""
    earlier.text += later.text
    earlier.token_ids.extend(later.token_ids)
    if later.logprobs:
        earlier.logprobs.extend(later.logprobs)
    if later.reasoning:
        earlier.reasoning += later.reasoning
    if later.finish_reason:
        earlier.finish_reason = later.finish_reason
        earlier.stop_reason = later.stop_reason
    if later.HasField("usage"):
        earlier.usage.CopyFrom(later.usage)


def fold_chunk(earlier: pb.GenerateChunk, later: Chunk) -> None:
    """`fold` for a chunk not yet on the wire (the worker's outbox)."""
    earlier.text += later.text
    earlier.token_ids.extend(later.token_ids)
    if later.logprobs:
        earlier.logprobs.extend(
            pb.TokenLogprob(token_id=lp.token_id, token=lp.token, logprob=lp.logprob,
                            top=[pb.TopLogprob(token_id=t, token=s, logprob=p) for t, s, p in lp.top])
            for lp in later.logprobs)
    if later.reasoning:
        earlier.reasoning += later.reasoning
    if later.finish_reason:
        earlier.finish_reason = later.finish_reason
        earlier.stop_reason = later.stop_reason or ""
    if later.usage is not None:
        earlier.usage.prompt_tokens = later.usage.prompt_tokens
        earlier.usage.completion_tokens = later.usage.completion_tokens
        earlier.usage.cached_tokens = later.usage.cached_tokens


def merge_waiting(chunks: list[pb.GenerateChunk]) -> list[pb.GenerateChunk]:
    """`chunks` (in arrival order, several streams mixed) with each stream's foldable runs folded;
    a stream's chunks keep their order. Mutates the messages it folds into."""
    if len(chunks) < 2:
        return chunks
    merged: list[pb.GenerateChunk] = []
    last: dict[tuple[int, int], pb.GenerateChunk] = {}
    for chunk in chunks:
        key = (chunk.index, chunk.sample)
        earlier = last.get(key)
        if earlier is not None and can_fold(earlier, chunk):
            fold(earlier, chunk)
        else:
            merged.append(chunk)
            last[key] = chunk
    return merged
