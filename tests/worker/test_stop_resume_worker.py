"""A mock worker given a resumed input whose held-back text completes a stop string (#15): the
input ends there as vLLM would have ended it, and its engine request stops at once while the
request's other inputs run on."""

from __future__ import annotations

import asyncio

from support import wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request


async def _pieces(client: WorkerClient, prompt: str, tokens: int) -> tuple[list[str], list[int]]:
    """Each token's text and id of the mock's answer (no stop strings: nothing held back)."""
    pieces, ids = [], []
    request = build_request(f"probe-{prompt}", [GenerateInput(text=prompt)], SamplingParams(max_tokens=tokens))
    async for chunk in client.generate(request, timeout=60):
        assert len(chunk.token_ids) <= 1
        pieces.append(chunk.text)
        ids += chunk.token_ids
    return pieces, ids


async def test_a_stop_string_completed_by_held_text_ends_its_input_and_stops_its_engine_request(mock_worker_factory):
    fast, slow = await asyncio.gather(mock_worker_factory.start(mock_tokens_per_s=50, mock_ttft_ms=1),
                                      mock_worker_factory.start(mock_tokens_per_s=20, mock_ttft_ms=1))
    async with WorkerClient(fast.address) as probe:
        for number in range(40):
            prompt = f"resumed with held text {number}"
            pieces, ids = await _pieces(probe, prompt, 6)
            stop = pieces[2][-2:] + pieces[3][:3]
            spans = "".join(pieces).find(stop) == len("".join(pieces[:3])) - 2
            if len(pieces[2]) >= 3 and len(pieces[3]) >= 4 and spans:
                break
        else:
            raise AssertionError("no prompt gave a usable stop string")
        for number in range(40):
            other = f"a long other input {number}"
            other_pieces, other_ids = await _pieces(probe, other, 100)
            if stop not in "".join(other_pieces):
                break
        else:
            raise AssertionError("no other prompt's answer was free of the stop string")

    three = "".join(pieces[:3])
    delivered = len(three) - (len(stop) - 1)  # what vLLM had sent of those 3 tokens' text
    request = build_request("resumed", [
        GenerateInput(text=prompt, resume_token_ids=ids[:3], resume_delivered_chars=delivered),
        GenerateInput(text=other, resume_token_ids=other_ids[:50]),   # 50 tokens to go
    ], SamplingParams(max_tokens=100, stop=[stop]))
    text, finals, running_alone = "", {}, []
    async with WorkerClient(slow.address) as client:
        async def consume():
            nonlocal text
            async for chunk in client.generate(request, timeout=60):
                if chunk.index == 0:
                    text += chunk.text
                if chunk.finish_reason:
                    finals[chunk.index] = chunk

        task = asyncio.create_task(consume())
        await wait_until(lambda: 0 in finals or task.done(), timeout=30, message="input 0 to end")

        async def only_the_other_runs() -> bool:
            running = (await client.load()).running
            running_alone.append(running == 1 and 1 not in finals)
            return running_alone[-1] or 1 in finals

        # Without the stop, input 0's engine request would run 97 more tokens, past input 1's 50.
        await wait_until(only_the_other_runs, timeout=30, message="input 0's engine request to stop")
        await asyncio.wait_for(task, 60)
    assert running_alone[-1], "input 0's engine request ran on after its stop string"
    assert text == three[delivered:len(three) - 2]   # the held text, cut before the stop string
    assert (finals[0].finish_reason, finals[0].stop_reason) == ("stop", stop)
    assert finals[0].token_ids == ids[3:4] and finals[0].usage.completion_tokens == 1
    assert finals[1].finish_reason == "length"
