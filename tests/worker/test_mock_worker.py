"""The worker's protocol behaviour, on the mock engine (no model needed)."""

from __future__ import annotations

import asyncio
import signal

import pytest

from support import wait_until
from vllm_fleet.client import ClientOptions, WorkerClient
from vllm_fleet.errors import InvalidRequestError, WorkerUnavailableError
from vllm_fleet.protocol import ChatMessage, GenerateInput, GenerateRequest, SamplingParams, build_request


async def collect(client: WorkerClient, request: GenerateRequest):
    chunks = [c async for c in client.generate(request, timeout=60)]
    texts: dict[tuple[int, int], str] = {}
    tokens: dict[tuple[int, int], list[int]] = {}
    finals = {}
    for c in chunks:
        texts[(c.index, c.sample)] = texts.get((c.index, c.sample), "") + c.text
        tokens.setdefault((c.index, c.sample), []).extend(c.token_ids)
        if c.finish_reason:
            finals[(c.index, c.sample)] = c
    return chunks, texts, tokens, finals


@pytest.fixture(scope="module", params=[True, False], ids=["one-call-for-all", "one-call-per-request"])
async def mock(module_mock_workers, request):
    # Every behaviour here holds over both transports: GenerateMany (the default) and Generate.
    worker = await module_mock_workers.start(mock_tokens_per_s=400, mock_ttft_ms=5)
    client = WorkerClient(worker.address, ClientOptions(multiplex=request.param))
    yield worker, client
    await client.close()


@pytest.mark.parametrize("inputs", [
    [GenerateInput(text="one two"), GenerateInput(text="three"), GenerateInput(token_ids=[5, 6, 7])],
    [GenerateInput(messages=[ChatMessage("user", "hi")]), GenerateInput(messages=[{"role": "user", "content": "yo"}]),
     GenerateInput(messages=[ChatMessage("system", "s"), ChatMessage("user", "hello")])],
], ids=["prompts", "chats"])
async def test_inputs_and_samples_come_back_under_their_indexes(mock, inputs):
    _, client = mock
    request = build_request("multi", inputs, SamplingParams(max_tokens=6, n=2))  # one kind of input per request
    _, texts, tokens, finals = await collect(client, request)
    assert set(finals) == {(i, s) for i in range(3) for s in range(2)}
    for key, final in finals.items():
        assert final.usage.completion_tokens == 6 == len(tokens[key])
    # The same input alone gives the same answer as inside a batch.
    _, alone, _, _ = await collect(client, build_request("alone", [inputs[2]], SamplingParams(max_tokens=6)))
    assert alone[(0, 0)] == texts[(2, 0)]


async def test_coalescing_bounds_chunks_per_interval(mock):
    _, client = mock
    loop = asyncio.get_running_loop()
    params = SamplingParams(max_tokens=200)
    every_step, _, tokens_a, _ = await collect(client, build_request("fine", [GenerateInput(text="a b")], params))
    started = loop.time()
    coalesced, _, tokens_b, _ = await collect(
        client, build_request("coarse", [GenerateInput(text="a b")], params, stream_interval_ms=100))
    elapsed = loop.time() - started
    assert tokens_a == tokens_b  # coalescing never changes the tokens
    # One chunk per 100 ms at most, plus the first and the final chunk.
    assert len(coalesced) <= elapsed / 0.1 + 2
    assert len(coalesced) < len(every_step)


async def test_resumed_stream_continues_where_it_left_off(mock):
    _, client = mock
    prompt = [11, 12, 13]
    _, _, full, _ = await collect(client, build_request("full", [GenerateInput(token_ids=prompt)],
                                                          SamplingParams(max_tokens=20)))
    sent = full[(0, 0)][:7]
    _, _, rest, finals = await collect(client, build_request(
        "resume", [GenerateInput(token_ids=prompt, resume_token_ids=sent)], SamplingParams(max_tokens=20)))
    assert sent + rest[(0, 0)] == full[(0, 0)]
    assert finals[(0, 0)].usage.completion_tokens == 13  # only what this worker generated


# (request, words of the message, the field named as `param`)
REFUSED = [
    (build_request("e1", []), "no inputs", "inputs"),
    (build_request("e2", [GenerateInput(text="")]), "prompt is empty", "prompt"),
    (build_request("e3", [GenerateInput(text="x")], SamplingParams(max_tokens=0)), "max_tokens must be at least 1",
     "max_tokens"),  # vLLM's rule, in vLLM's words
    (build_request("e4", [GenerateInput(text="x")], extra_body={"n": 2}), "travels in GenerateRequest.n", "n"),
    (build_request("e5", [GenerateInput(text="x")], SamplingParams(n=99)), "n must be between 1 and 16", "n"),
    (build_request("e6", [GenerateInput(text="x " * 5000)], SamplingParams(max_tokens=5)),
     r"maximum context length \(4096\)", "prompt"),
    (build_request("e8", [GenerateInput(token_ids=[1, 999999])]), "outside the model's vocabulary", "prompt"),
    (build_request("e9", [GenerateInput(text="x")], SamplingParams(temperature=-1)), "temperature", "temperature"),
]


@pytest.mark.parametrize("request_, needle, param", REFUSED, ids=[r.request_id for r, _, _ in REFUSED])
async def test_bad_input_is_rejected_and_the_worker_keeps_serving(mock, request_, needle, param):
    _, client = mock
    with pytest.raises(InvalidRequestError, match=needle) as refused:
        await collect(client, request_)
    if param is not None:
        assert refused.value.param == param
    _, texts, _, _ = await collect(client, build_request("ok", [GenerateInput(text="still there?")],
                                                           SamplingParams(max_tokens=3)))
    assert texts[(0, 0)]


async def test_max_tokens_beyond_the_context_is_lowered_to_what_fits_as_vllm_does(mock):
    _, client = mock
    request = build_request("long", [GenerateInput(text="x " * 4000)], SamplingParams(max_tokens=500))
    _, _, tokens, finals = await collect(client, request)
    assert len(tokens[(0, 0)]) == 4096 - 4000 == finals[(0, 0)].usage.completion_tokens
    assert finals[(0, 0)].finish_reason == "length"


async def test_client_cancel_aborts_the_engine_request(mock):
    _, client = mock
    stream = client.generate(build_request("cancel-me", [GenerateInput(text="long")], SamplingParams(max_tokens=4000)))
    await stream.__anext__()
    assert (await client.load()).running == 1
    await stream.aclose()
    await wait_until(lambda: _idle(client), timeout=10, message="Load back to zero running")


# One input is read by the request's own task (no pump, in_flight.next_direct); two are pumped.
@pytest.mark.parametrize("texts", [["a"], ["a", "b"]], ids=["one input, read directly", "two inputs, pumped"])
async def test_abort_rpc_ends_the_stream_with_reason_abort(mock, texts):
    _, client = mock
    request = build_request("abort-me", [GenerateInput(text=text) for text in texts],
                              SamplingParams(max_tokens=4000))
    task, chunks = _streaming(client, request)
    await wait_until(lambda: len(chunks) >= 2, timeout=10, message="first chunks")
    assert await client.abort("abort-me") is True
    await asyncio.wait_for(task, 10)
    assert {(c.index, c.finish_reason) for c in chunks if c.finish_reason} == {(i, "abort") for i in range(len(texts))}
    await wait_until(lambda: _idle(client), timeout=10, message="Load back to zero")
    assert await client.abort("unknown-id") is False


def _streaming(client: WorkerClient, request) -> tuple[asyncio.Task, list]:
    """A task reading the request's stream, and the list its chunks go to as they come."""
    chunks = []

    async def consume():
        async for chunk in client.generate(request, timeout=60):
            chunks.append(chunk)

    return asyncio.create_task(consume()), chunks


async def _idle(client: WorkerClient) -> bool:
    load = await client.load()
    return load.running == 0 and load.in_flight == 0


async def test_sigterm_drains_in_flight_streams_then_exits(module_mock_workers):
    worker = await module_mock_workers.start(mock_tokens_per_s=100, mock_ttft_ms=5, drain_grace_s=30)
    client = WorkerClient(worker.address)
    task, chunks = _streaming(client, build_request("drain", [GenerateInput(text="x")], SamplingParams(max_tokens=150)))
    await wait_until(lambda: chunks, timeout=10, message="the stream to start")
    worker.signal(signal.SIGTERM)
    await wait_until(lambda: _status_is(client, "NOT_SERVING"), timeout=10, message="NOT_SERVING on drain")
    with pytest.raises(WorkerUnavailableError, match="draining"):
        async for _ in client.generate(build_request("late", [GenerateInput(text="x")])):
            pass
    await asyncio.wait_for(task, 30)  # the in-flight stream finished
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 150
    await wait_until(lambda: worker.process.poll() is not None, timeout=15, message="exit after drain")
    assert worker.process.returncode == 0
    await client.close()


async def _status_is(client: WorkerClient, status: str) -> bool:
    return await client.health() == status


async def test_a_cancelled_consumer_sees_cancellation_not_a_worker_error(mock):
    # Callers (the router's failover, the bench's drain) must tell "I gave up" from "the worker
    # failed": a cancelled task has to end with CancelledError, whatever gRPC raises inside.
    _, client = mock
    first_chunk = asyncio.Event()

    async def consume(n: int):
        request = build_request(f"cancel-me-{n}", [GenerateInput(text="a b")], SamplingParams(max_tokens=2000))
        async for _ in client.generate(request, timeout=60):
            first_chunk.set()

    for n in range(20):  # the cancel must land while the task waits inside call.read()
        first_chunk.clear()
        task = asyncio.create_task(consume(n))
        await asyncio.wait_for(first_chunk.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_abort_rpc_ends_a_one_input_stream_its_engine_went_silent_on(module_mock_workers, tmp_path):
    """A one-input request's own task waits on the engine (no pump between): an Abort while the
    engine sends nothing must cut that wait, not wait for a token that may never come."""
    stall = tmp_path / "stall"
    worker = await module_mock_workers.start(mock_tokens_per_s=200, mock_ttft_ms=5, mock_stall_file=str(stall),
                                             no_engine_stall_check=True)
    client = WorkerClient(worker.address)
    request = build_request("silent", [GenerateInput(text="a")], SamplingParams(max_tokens=4000))
    task, chunks = _streaming(client, request)
    try:
        await wait_until(lambda: len(chunks) >= 1, timeout=10, message="a first chunk")
        stall.touch()  # the mock engine stops before its next step
        assert await client.abort("silent") is True
        await asyncio.wait_for(task, 10)
        assert chunks[-1].finish_reason == "abort"
        await wait_until(lambda: _idle(client), timeout=10, message="Load back to zero")
    finally:
        stall.unlink(missing_ok=True)
        task.cancel()
        await client.close()
