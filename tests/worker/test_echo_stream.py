"""Echo (completions): the prompt's text rides on the first chunk of each sample, once."""

from prometheus_client import CollectorRegistry
from vllm import SamplingParams as VllmSamplingParams

from vllm_fleet.protocol.types import PromptLogprob
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


PROMPT_LOGPROBS = [PromptLogprob(1, "Once", None), PromptLogprob(2, " upon", -1.5, [(2, " upon", -1.5, 1)])]


def test_prompt_logprobs_ride_on_each_samples_first_chunk_once():
    # vLLM sends them once, with the step that ends prefill; every sample's client needs them.
    stream = stream_of(PreparedInput([1, 2], VllmSamplingParams(), 2), n=2)
    chunks = stream.on_deltas(0, [SampleDelta(0, " a", [7], prompt_logprobs=PROMPT_LOGPROBS),
                                  SampleDelta(1, " b", [8], prompt_logprobs=PROMPT_LOGPROBS)], now=1.0)
    chunks += stream.on_deltas(0, [SampleDelta(0, " c", [9]), SampleDelta(1, " d", [10], "stop")], now=1.1)
    assert [(c.sample, c.prompt_logprobs) for c in chunks] == [
        (0, PROMPT_LOGPROBS), (1, PROMPT_LOGPROBS), (0, None), (1, None)]
    # And they survive the wire.
    from vllm_fleet.protocol.convert import chunk_from_pb, chunk_to_pb

    assert chunk_from_pb(chunk_to_pb(chunks[0])).prompt_logprobs == PROMPT_LOGPROBS


async def test_a_resumed_input_asks_the_engine_for_no_prompt_logprobs():
    # The client has them from the first worker; the resumed prompt (prompt + tokens sent) would give others.
    from vllm_fleet.protocol.sampling import SamplingParams, build_request
    from vllm_fleet.protocol.types import GenerateInput
    from vllm_fleet.worker.engines.mock_engine import MockEngine
    from vllm_fleet.worker.prepare import prepare_input
    from vllm_fleet.config import EngineConfig

    engine = MockEngine(EngineConfig(engine="mock"))
    await engine.start()
    fresh = GenerateInput(text="Once upon a time")
    resumed = GenerateInput(text="Once upon a time", resume_token_ids=[40, 41])
    for item, wanted in ((fresh, 1), (resumed, None)):
        request = build_request("r", [item], SamplingParams(max_tokens=8, logprobs=1),
                                extra_body={"echo": True})
        prepared = await prepare_input(engine, 0, request, max_logprobs=20)
        assert prepared.engine_params.prompt_logprobs == wanted
