"""Echo (completions): the prompt's text rides on the first chunk of each sample, once."""

from prometheus_client import CollectorRegistry
from vllm import SamplingParams as VllmSamplingParams

from vllm_fleet.worker.engines.base import SampleDelta
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.prepare import PreparedInput
from vllm_fleet.worker.request_stream import RequestStream


def stream_of(item: PreparedInput, n: int, interval_s: float = 0.0) -> RequestStream:
    return RequestStream([item], n, interval_s, WorkerMetrics(CollectorRegistry()), started=0.0)


def test_each_samples_first_chunk_carries_the_prompt_text_and_no_other_does():
    stream = stream_of(PreparedInput([1, 2, 3], VllmSamplingParams(), 3, echo_text="Once upon"), n=2, interval_s=0.05)
    chunks = stream.on_deltas(0, [SampleDelta(0, " a", [7]), SampleDelta(1, " b", [8])], now=1.0)
    chunks += stream.on_deltas(0, [SampleDelta(0, " c", [9]), SampleDelta(1, " d", [10], "stop")], now=1.01)
    chunks += stream.on_deltas(0, [SampleDelta(0, " e", [11], "length")], now=1.02)
    assert [(c.sample, c.prompt_text) for c in chunks] == [(0, "Once upon"), (1, "Once upon"), (1, None), (0, None)]


def test_a_resumed_stream_does_not_echo_again():
    # The client got the prompt text from the first worker.
    resumed = PreparedInput([1, 2, 3, 7], VllmSamplingParams(), 3, echo_text="Once upon")
    [chunk] = stream_of(resumed, n=1).on_deltas(0, [SampleDelta(0, " c", [9])], now=1.0)
    assert chunk.prompt_text is None
