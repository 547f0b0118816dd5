"""A gateway running a batch is killed with SIGKILL mid-batch (#52: the dead-runner test stopped
its runner gracefully): it gives nothing back, not even its lease. Another gateway process on the
same batch state takes the batch over once the lease lapses, and every line is answered exactly
once: the lines the dead one committed are not run again, the ones it had in flight are."""

from __future__ import annotations

import json
import signal

import openai
from support import wait_until, worker_env

from vllm_fleet.processes import GatewayProcess

MODEL = "mock-model"
LINES = 12
CHAT = "/v1/chat/completions"


def _input() -> bytes:
    lines = [{"custom_id": f"k{i}", "method": "POST", "url": CHAT,
              "body": {"model": MODEL, "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": 12}}
             for i in range(LINES)]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _client(gateway: GatewayProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


async def _counts(client: openai.AsyncOpenAI, batch_id: str) -> dict:
    batch = await client.batches.retrieve(batch_id)
    return {"status": batch.status, "completed": batch.request_counts.completed, "output": batch.output_file_id}


async def test_a_runner_killed_mid_batch_is_taken_over_and_every_line_is_answered_once(mock_worker_factory, tmp_path):
    # ~0.25 s a line, two at a time: the batch is mid-way for seconds, long enough to kill it there.
    worker = await mock_worker_factory.start(served_model_name=MODEL, mock_tokens_per_s=50, mock_ttft_ms=1)
    args = ["--workers", worker.address, "--batch-dir", str(tmp_path / "batch"), "--batch-lease-s", "1",
            "--batch-concurrency", "2", "--no-access-log"]
    first = GatewayProcess(args, worker_env()).start()
    try:
        await first.wait_ready(timeout=60)
        client = _client(first)
        uploaded = await client.files.create(file=("in.jsonl", _input()), purpose="batch")
        batch = await client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")

        async def some_done() -> bool:
            return (await _counts(client, batch.id))["completed"] >= 2

        await wait_until(some_done, timeout=60, message="two lines answered by the first gateway")
        first.kill()
        assert first.returncode == -signal.SIGKILL
        done_before = await _counts_after_restart(args, batch.id)
    finally:
        first.kill()
    assert 2 <= done_before < LINES  # it died mid-batch


async def _counts_after_restart(args: list[str], batch_id: str) -> int:
    """Start a second gateway on the same state; wait for it to finish the batch; check each line
    once in the output; return how many lines the dead one had committed."""
    async with GatewayProcess(args, worker_env()) as second:
        await second.wait_ready(timeout=60)
        client = _client(second)
        committed_before = (await _counts(client, batch_id))["completed"]

        async def completed() -> bool:
            return (await _counts(client, batch_id))["status"] == "completed"

        await wait_until(completed, timeout=90, message="the batch completed by the second gateway")
        final = await _counts(client, batch_id)
        output = [json.loads(line) for line in (await client.files.content(final["output"])).text.splitlines()]
        assert sorted(line["custom_id"] for line in output) == sorted(f"k{i}" for i in range(LINES))
        assert all(line["response"]["status_code"] == 200 for line in output)
        assert final["completed"] == LINES
        return committed_before
