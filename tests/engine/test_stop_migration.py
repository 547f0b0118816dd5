"""Migration with a stop string that spans the switch, on the real engine (#15, #28).

vLLM holds back the last len(stop) - 1 characters of an answer while their token ids go out
(they may begin the stop string). A greedy answer's worker is killed after the stop string has
begun but before it completes: the text held back at the kill must still reach the client, the
next worker must match the stop string across the switch, and the answer must end there exactly
as a fault-free run of the same prompt alone does. The stop string is cut from that answer's
own tokens, so the engine, not a copy of our matching code, decides what is held back.
"""

from __future__ import annotations

import asyncio
import signal

import pytest
from prometheus_client import CollectorRegistry

from support import WorkerProcess, vllm_worker_args, wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol import ChatMessage, GenerateInput, SamplingParams
from vllm_fleet.registry import StaticRegistry, WorkerRecord
from vllm_fleet.router import Router, RouterConfig

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

QUESTION = [GenerateInput(messages=[ChatMessage("user", "Describe Paris in two sentences.")])]
TOKENS = 48
STOP_BEGINS_IN_TOKEN = 3    # the stop string starts with the last character of this token
# and runs through this many more tokens. The victim is frozen when the *client* has seen
# KILL_AFTER ids; on a loaded machine the client reads behind the worker, and what the worker had
# already sent still arrives after the freeze. A stop string a few tokens long let the whole answer
# through that way in one fresh-clone suite run ("nothing migrated"); twenty tokens of margin do not.
STOP_TOKENS = 24
KILL_AFTER = STOP_BEGINS_IN_TOKEN + 2   # token ids out: the stop string has begun, far from complete


@pytest.fixture
async def victim():
    """A real worker of our own on core 1 (the shared one is on core 0), to be killed."""
    args, env = vllm_worker_args("1")
    worker = WorkerProcess(args, env).start()
    try:
        await worker.wait_serving(600)
        yield worker
    finally:
        worker.kill()


async def _alone(address: str, stop: list[str], rid: str) -> tuple[list[tuple[int, str]], object]:
    """(token ids, text) of each chunk, and the final chunk, of the greedy answer alone."""
    chunks, final = [], None
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, stop=stop)
    async with WorkerClient(address) as client:
        async for chunk in client.generate(build_request(rid, QUESTION, params, stream_interval_ms=1), timeout=120):
            chunks.append((len(chunk.token_ids), chunk.text))
            final = chunk if chunk.finish_reason else final
    return chunks, final


def _spanning_stop(chunks: list[tuple[int, str]]) -> tuple[str, int, int]:
    """A stop string cut from the answer: its last character of token STOP_BEGINS_IN_TOKEN through
    STOP_TOKENS more tokens; where it starts (characters) and the token count that completes it."""
    text, ids, start, start_ids = "", 0, None, 0
    for count, piece in chunks:
        text, ids = text + piece, ids + count
        if start is None and ids >= STOP_BEGINS_IN_TOKEN and piece:
            start, start_ids = len(text) - 1, ids
        elif start is not None and ids >= start_ids + STOP_TOKENS:
            stop = text[start:]
            assert text.find(stop) == start, f"{stop!r} occurs earlier in {text!r}"
            return stop, start, ids
    raise AssertionError(f"the answer is too short for a stop string of {STOP_TOKENS} tokens: {text!r}")


async def test_a_stop_string_spanning_a_kill_is_matched_on_the_next_worker_with_the_held_text(
        vllm_worker, victim):
    plain, _ = await _alone(vllm_worker.address, [], "plain")
    stop, start, completing_ids = _spanning_stop(plain)
    answer = "".join(text for _, text in plain)
    chunks, want_final = await _alone(vllm_worker.address, [stop], "alone")
    want = "".join(text for _, text in chunks)
    assert want == answer[:start] and (want_final.finish_reason, want_final.stop_reason) == ("stop", stop)

    # The stream starts on the victim alone; the survivor joins once it is under way.
    registry = StaticRegistry([WorkerRecord(address=victim.address)])
    config = RouterConfig(stall_timeout_s=300, first_chunk_timeout_s=300, load_poll_interval_s=0.2,
                          health_poll_interval_s=0.2)
    router = Router(registry, config, metrics_registry=CollectorRegistry())
    await router.start()
    got: dict = {"text": "", "ids": [], "final": None}
    try:
        await router.wait_ready(timeout=60)
        stream = router.stream(build_request("migrating", QUESTION, SamplingParams(
            temperature=0.0, max_tokens=TOKENS, stop=[stop]), stream_interval_ms=1))

        async def consume():
            async with stream:
                async for chunk in stream:
                    got["text"] += chunk.text
                    got["ids"] += chunk.token_ids
                    got["final"] = chunk if chunk.finish_reason else got["final"]

        task = asyncio.create_task(consume())
        await wait_until(lambda: len(got["ids"]) >= KILL_AFTER or task.done(), timeout=120,
                         message=f"{KILL_AFTER} token ids out")
        victim.signal(signal.SIGSTOP)  # frozen mid-answer while the survivor joins
        ids_at_kill = len(got["ids"])
        assert not task.done() and ids_at_kill < completing_ids, "the stop string completed before the fault"
        registry.set_workers([WorkerRecord(address=victim.address), WorkerRecord(address=vllm_worker.address)])
        await wait_until(lambda: any(w.address == vllm_worker.address for w in router.snapshot().eligible()),
                         timeout=30, message="the survivor in rotation")
        text_at_kill = got["text"]
        victim.kill()
        await asyncio.wait_for(task, 120)
    finally:
        await router.close()
    assert stream.migrations == 1, "the answer finished before the kill: nothing migrated"
    # Held back at the kill: the stop string had begun in the ids sent, and text before it was unsent.
    assert want.startswith(text_at_kill) and len(text_at_kill) < len(want), (
        f"nothing was held back at the kill: {text_at_kill!r} of {want!r}")
    assert (got["final"].finish_reason, got["final"].stop_reason) == ("stop", stop)
    assert got["text"] == want, f"{text_at_kill!r} before the kill, stop {stop!r}"
