"""A request's stream as a unit: engine events in, the chunks a client gets out."""

import pytest
from prometheus_client import CollectorRegistry
from vllm import SamplingParams as VllmSamplingParams

from vllm_fleet.worker.engines.base import SampleDelta
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.prepare import PreparedInput
from vllm_fleet.worker.request_stream import TOKEN_REPORT_S, RequestStream
from vllm_fleet.worker.resume.held import HeldTokens


def prepared(prompt_len: int, held: list[int] | None = None) -> PreparedInput:
    return PreparedInput(prompt_token_ids=list(range(prompt_len)), engine_params=VllmSamplingParams(),
                         prompt_len=prompt_len,
                         held=HeldTokens(held) if held else None)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def stream_of(registry, *inputs: PreparedInput, n: int = 1, interval_s: float = 0.0) -> RequestStream:
    return RequestStream(list(inputs), n, interval_s, WorkerMetrics(registry), started=100.0)


def metric(registry: CollectorRegistry, name: str) -> float:
    return registry.get_sample_value("vllm_fleet_worker_" + name) or 0.0


def test_each_final_chunk_carries_its_own_samples_usage(registry):
    stream = stream_of(registry, prepared(7), prepared(3), n=2)
    stream.on_deltas(0, [SampleDelta(0, " a", [1]), SampleDelta(1, " b", [2, 3])], now=100.1)
    chunks = stream.on_deltas(0, [SampleDelta(0, " c", [4], finish_reason="length", cached_tokens=5),
                                  SampleDelta(1, " d", [5])], now=100.2)
    final = {(c.index, c.sample): c for c in chunks if c.finish_reason}
    assert final[(0, 0)].usage.prompt_tokens == 7
    assert final[(0, 0)].usage.completion_tokens == 2
    assert final[(0, 0)].usage.cached_tokens == 5
    [last] = stream.on_deltas(0, [SampleDelta(1, "", [], finish_reason="stop")], now=100.3)
    assert last.usage.completion_tokens == 3  # sample 1's own tokens, not sample 0's
    [other] = stream.on_deltas(1, [SampleDelta(0, " e", [6], finish_reason="stop")], now=100.4)
    assert (other.index, other.usage.prompt_tokens, other.usage.completion_tokens) == (1, 3, 1)
    assert all(c.usage is None for c in chunks if not c.finish_reason)


def test_held_tokens_of_a_resumed_input_are_not_sent_again_but_their_text_is(registry):
    emoji = list("😀".encode())
    stream = stream_of(registry, prepared(4, held=emoji[2:]))  # the client has emoji[:2] already
    first = stream.on_deltas(0, [SampleDelta(0, "", emoji[2:3])], now=100.1)
    second = stream.on_deltas(0, [SampleDelta(0, "😀 x", emoji[3:] + [120], finish_reason="stop")], now=100.2)
    assert [i for c in first + second for i in c.token_ids] == [120]
    assert "".join(c.text for c in first + second) == "😀 x"
    assert second[-1].usage.completion_tokens == 1  # only what the client had not received


def test_an_aborted_input_ends_each_unfinished_sample_with_abort(registry):
    stream = stream_of(registry, prepared(2), prepared(2), n=3)
    stream.on_deltas(0, [SampleDelta(0, " a", [1]), SampleDelta(1, " b", [2], finish_reason="stop")], now=100.1)
    assert stream.open_inputs == 2
    chunks = stream.on_end(0, aborted=True)
    assert [(c.index, c.sample, c.finish_reason) for c in chunks] == [(0, 0, "abort"), (0, 2, "abort")]
    assert all(c.token_ids == [] and c.text == "" for c in chunks)
    assert stream.open_inputs == 1
    assert stream.on_end(1, aborted=False) == []  # a finished input adds nothing
    assert stream.open_inputs == 0


def test_chunks_held_back_by_the_interval_come_out_when_due(registry):
    stream = stream_of(registry, prepared(2), interval_s=0.05)
    assert [c.token_ids for c in stream.on_deltas(0, [SampleDelta(0, " a", [1])], now=100.0)] == [[1]]
    assert stream.on_deltas(0, [SampleDelta(0, " b", [2])], now=100.01) == []
    assert stream.next_deadline() == pytest.approx(100.05)
    assert [c.token_ids for c in stream.on_deadline(100.05)] == [[2]]
    assert stream.next_deadline() is None


def test_ttft_is_observed_once_and_every_streamed_token_is_counted(registry):
    stream = stream_of(registry, prepared(5), n=2)
    stream.on_deltas(0, [SampleDelta(0, "", []), SampleDelta(1, "", [])], now=100.1)  # no tokens yet
    assert metric(registry, "time_to_first_token_seconds_count") == 0
    stream.on_deltas(0, [SampleDelta(0, " a", [1, 2]), SampleDelta(1, " b", [3])], now=100.25)
    for step in range(1, 4):
        stream.on_deltas(0, [SampleDelta(0, " c", [4])], now=100.25 + step * TOKEN_REPORT_S / 10)
    assert metric(registry, "time_to_first_token_seconds_count") == 1
    assert metric(registry, "time_to_first_token_seconds_sum") == pytest.approx(0.25)
    stream.close()
    assert metric(registry, "output_tokens_total") == 6
    assert metric(registry, "inter_token_latency_seconds_count") == 3  # chunks after the first


def test_tokens_are_counted_while_a_long_stream_runs(registry):
    stream = stream_of(registry, prepared(5))
    stream.on_deltas(0, [SampleDelta(0, " a", [1])], now=100.0)
    stream.on_deltas(0, [SampleDelta(0, " b", [2])], now=100.0 + TOKEN_REPORT_S)
    assert metric(registry, "output_tokens_total") == 2  # without waiting for the end
