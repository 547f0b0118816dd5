"""The coalescer as a unit: at most one chunk per interval per (input, sample), finals at once."""

from vllm_fleet.protocol.types import TokenLogprob, Usage
from vllm_fleet.worker.coalescer import Coalescer
from vllm_fleet.worker.engines.base import SampleDelta


def delta(text: str, ids: list[int], sample: int = 0, finish: str | None = None, **extra) -> SampleDelta:
    return SampleDelta(sample, text, ids, finish_reason=finish, **extra)


def test_with_no_interval_every_step_is_a_chunk_carrying_everything():
    coalescer = Coalescer(0)
    logprobs = [TokenLogprob(7, " a", -0.1)]
    usage = Usage(3, 2, 1)
    first = coalescer.add(1, delta(" a", [7], sample=2, logprobs=logprobs), now=0.0)
    last = coalescer.add(1, delta(" b", [8], sample=2, finish="stop", stop_reason="."), now=0.0, usage=usage)
    assert (first.index, first.sample, first.text, first.token_ids, first.logprobs) == (1, 2, " a", [7], logprobs)
    assert (last.finish_reason, last.stop_reason, last.usage) == ("stop", ".", usage)
    assert coalescer.next_deadline() is None


def test_tokens_within_the_interval_are_merged_into_one_chunk_when_it_falls_due():
    coalescer = Coalescer(0.1)
    first = coalescer.add(0, delta(" a", [1]), now=10.0)
    assert first.token_ids == [1]  # the first chunk is never held back (TTFT)
    assert coalescer.add(0, delta(" b", [2], logprobs=[TokenLogprob(2, " b", -1.0)]), now=10.03) is None
    assert coalescer.add(0, delta(" c", [3], logprobs=[TokenLogprob(3, " c", -2.0)]), now=10.06) is None
    assert coalescer.next_deadline() == 10.1
    assert coalescer.due(10.09) == []
    [merged] = coalescer.due(10.1)
    assert (merged.text, merged.token_ids, merged.finish_reason) == (" b c", [2, 3], None)
    assert [lp.token_id for lp in merged.logprobs] == [2, 3]
    assert coalescer.next_deadline() is None  # nothing is held back any more


def test_a_delta_after_the_interval_goes_out_at_once_with_what_was_held():
    coalescer = Coalescer(0.1)
    coalescer.add(0, delta(" a", [1]), now=0.0)
    assert coalescer.add(0, delta(" b", [2]), now=0.05) is None
    chunk = coalescer.add(0, delta(" c", [3]), now=0.1)
    assert (chunk.text, chunk.token_ids) == (" b c", [2, 3])


def test_the_final_delta_flushes_at_once_with_its_usage():
    coalescer = Coalescer(10.0)
    coalescer.add(0, delta(" a", [1]), now=0.0)
    assert coalescer.add(0, delta(" b", [2]), now=0.001) is None
    usage = Usage(5, 3, 0)
    final = coalescer.add(0, delta(" c", [3], finish="stop", stop_reason="c"), now=0.002, usage=usage)
    assert (final.text, final.token_ids) == (" b c", [2, 3])
    assert (final.finish_reason, final.stop_reason, final.usage) == ("stop", "c", usage)
    assert coalescer.next_deadline() is None


def test_each_input_and_sample_is_coalesced_on_its_own():
    coalescer = Coalescer(0.1)
    keys = [(0, 0), (0, 1), (1, 0)]
    for index, sample in keys:  # each stream's first chunk goes out at once
        chunk = coalescer.add(index, delta("x", [index * 10 + sample], sample=sample), now=0.0)
        assert (chunk.index, chunk.sample) == (index, sample)
    coalescer.add(0, delta(" p", [100], sample=0), now=0.01)
    coalescer.add(0, delta(" q", [101], sample=1), now=0.02)
    coalescer.add(1, delta(" r", [102], sample=0), now=0.03)
    final = coalescer.add(0, delta(" s", [103], sample=1, finish="length"), now=0.04)
    assert (final.index, final.sample, final.token_ids) == (0, 1, [101, 103])  # not (0, 0)'s token
    due = {(c.index, c.sample): c.token_ids for c in coalescer.due(0.1)}
    assert due == {(0, 0): [100], (1, 0): [102]}


def test_a_character_split_across_tokens_reaches_the_client_whole_with_every_id():
    # The engine holds a partial character back: its first tokens come with empty text and the
    # completing token carries the whole character. The coalescer only concatenates, so a chunk
    # never carries half a character, and the ids of the text-less tokens are not lost.
    emoji = list("😀".encode())
    steps = [delta("", emoji[:1]), delta("", emoji[1:3]), delta("😀", emoji[3:]), delta(" ok", [9], finish="stop")]
    for interval in (0, 0.1):
        coalescer = Coalescer(interval)
        chunks = [c for step in steps if (c := coalescer.add(0, step, now=0.01)) is not None]
        chunks += coalescer.due(1.0)
        assert "".join(c.text for c in chunks) == "😀 ok"
        assert [i for c in chunks for i in c.token_ids] == emoji + [9]
        for chunk in chunks:
            chunk.text.encode("utf-8")  # a lone surrogate (half a character) would raise here
