"""Folding waiting chunks of one stream (protocol/chunk_merge.py): every token once, in order."""

from __future__ import annotations

from vllm_fleet.protocol import worker_pb2 as pb
from vllm_fleet.protocol.chunk_merge import merge_waiting
from vllm_fleet.protocol.convert import chunk_from_pb
from vllm_fleet.protocol.types import Chunk, TokenLogprob, Usage
from vllm_fleet.worker.mux import MuxOutbox


def _pb(index: int, sample: int, text: str, ids: list[int], **fields) -> pb.GenerateChunk:
    return pb.GenerateChunk(index=index, sample=sample, text=text, token_ids=ids, **fields)


def test_a_streams_waiting_chunks_become_one_with_the_last_ones_finish_and_usage():
    chunks = [_pb(0, 0, "a", [1], prompt_text="p"), _pb(0, 0, "b", [2]),
              _pb(0, 0, "c", [3], finish_reason="stop", stop_reason="x", usage=pb.Usage(prompt_tokens=4, completion_tokens=3))]
    [merged] = [chunk_from_pb(m) for m in merge_waiting(chunks)]
    assert (merged.text, merged.token_ids, merged.finish_reason, merged.stop_reason) == ("abc", [1, 2, 3], "stop", "x")
    assert merged.usage == Usage(4, 3, 0) and merged.prompt_text == "p"


def test_streams_fold_apart_and_each_keeps_its_order():
    chunks = [_pb(0, 0, "a", [1]), _pb(0, 1, "x", [9]), _pb(0, 0, "b", [2]), _pb(1, 0, "q", [5]), _pb(0, 1, "y", [8])]
    merged = [(m.index, m.sample, m.text, list(m.token_ids)) for m in merge_waiting(chunks)]
    assert merged == [(0, 0, "ab", [1, 2]), (0, 1, "xy", [9, 8]), (1, 0, "q", [5])]


def test_nothing_folds_past_a_finish_across_tool_calls_or_into_a_later_streams_start():
    finished = [_pb(0, 0, "a", [1], finish_reason="stop"), _pb(0, 0, "", [])]
    tools = [_pb(0, 0, "", [1], tool_calls=[pb.ToolCallDelta(index=0, arguments="{")]), _pb(0, 0, "", [2])]
    echo = [_pb(0, 0, "a", [1]), _pb(0, 0, "b", [2], prompt_text="p")]
    for chunks in (finished, tools, echo):
        assert len(merge_waiting(chunks)) == 2


def test_logprobs_and_reasoning_are_concatenated():
    lp = lambda t: pb.TokenLogprob(token_id=t, token=str(t), logprob=-1.0)  # noqa: E731
    chunks = [_pb(0, 0, "a", [1], logprobs=[lp(1)], reasoning="r1"), _pb(0, 0, "b", [2], logprobs=[lp(2)], reasoning="r2")]
    [merged] = merge_waiting(chunks)
    assert [t.token_id for t in merged.logprobs] == [1, 2] and merged.reasoning == "r1r2"


async def test_the_workers_outbox_folds_a_streams_chunks_that_wait_for_the_same_message():
    outbox = MuxOutbox()
    outbox.add_chunk(7, Chunk(0, 0, "a", [1]))
    outbox.add_chunk(7, Chunk(0, 1, "x", [9]))
    outbox.add_chunk(7, Chunk(0, 0, "b", [2], logprobs=[TokenLogprob(2, "b", -0.5, [(2, "b", -0.5)])]))
    outbox.add_chunk(8, Chunk(0, 0, "z", [4]))
    outbox.add_chunk(7, Chunk(0, 0, "c", [3], finish_reason="length", usage=Usage(1, 3, 0)))
    outbox.add_chunk(7, Chunk(0, 0, "", [], finish_reason="abort"))  # after a finish: its own chunk
    events = {e.stream: [chunk_from_pb(c) for c in e.chunks] for e in await outbox.take()}
    assert [(c.sample, c.text, c.token_ids, c.finish_reason) for c in events[7]] == [
        (0, "abc", [1, 2, 3], "length"), (1, "x", [9], None), (0, "", [], "abort")]
    assert events[7][0].usage == Usage(1, 3, 0) and [t.token_id for t in events[7][0].logprobs] == [2]
    assert [c.text for c in events[8]] == ["z"]
    outbox.add_chunk(7, Chunk(0, 1, "y", [8]))  # the next message: nothing left to fold into
    assert [[c.text for c in e.chunks] for e in await outbox.take()] == [["y"]]
