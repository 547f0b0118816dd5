"""generate() in local Spark against mock worker processes: the row contract and its failures.

The mock engine is deterministic (each token depends on the two before it), so Spark's answer
for a row can be compared with what the client gets for the same prompt, even after a
migration. Tests about the real engine's answers are in test_generate_vllm.py.
"""

from __future__ import annotations

import asyncio

import pytest

from spark_support import client_answers, run_in_thread
from support import wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol.types import GenerateInput
from vllm_fleet.spark import generate

PARAMS = {"max_tokens": 8, "temperature": 0}


def prompts_df(spark, count: int, partitions: int = 4):
    rows = [(i, f"question {i} about the river and the {i % 7} mountains") for i in range(count)]
    return spark.createDataFrame(rows, "id long, prompt string").repartition(partitions)


async def test_every_row_comes_out_once_with_the_clients_answer(spark, mock_pair):
    addresses = [w.address for w in mock_pair]
    out = generate(prompts_df(spark, 1000), prompt_col="prompt", params=PARAMS, workers=addresses)
    rows = await asyncio.to_thread(out.collect)

    assert sorted(r.id for r in rows) == list(range(1000))
    assert [r for r in rows if r.error is not None or r.output is None] == []
    assert {r.worker for r in rows} == set(addresses), "rows are spread over both workers"
    assert all(r.finish_reason == "length" and r.completion_tokens == 8 and r.prompt_tokens > 0 for r in rows)
    expected = await client_answers(addresses[0], [GenerateInput(text=r.prompt) for r in rows], PARAMS)
    assert [r.output for r in rows] == expected


@pytest.mark.parametrize("send_as", ["per_row", "one_request"])
async def test_bad_rows_get_an_error_and_the_job_completes(spark, mock_pair, send_as):
    too_long = "word " * 5000  # the mock's context is 4,096 tokens (one per word)
    rows = [(0, "a fine prompt"), (1, None), (2, ""), (3, too_long), (4, "another fine prompt")]
    df = spark.createDataFrame(rows, "id long, prompt string").coalesce(1)
    out = generate(df, prompt_col="prompt", params=PARAMS, workers=[w.address for w in mock_pair],
                   send_as=send_as, batch_size=8)
    by_id = {r.id: r for r in await asyncio.to_thread(out.collect)}

    assert sorted(by_id) == [0, 1, 2, 3, 4]
    assert by_id[0].error is None and by_id[0].output and by_id[4].error is None and by_id[4].output
    assert "null" in by_id[1].error
    assert "empty" in by_id[2].error
    # vLLM's words now (its get_max_tokens on the worker): the prompt's length against the context.
    assert "context" in by_id[3].error and "5000" in by_id[3].error
    assert all(by_id[i].output is None for i in (1, 2, 3))


async def test_a_worker_killed_mid_job_loses_and_duplicates_no_row(spark, mock_worker_factory):
    # Slow workers (~160 ms a row) so the job is still running when one of them dies.
    victim, survivor = await mock_worker_factory.start_many(2, mock_tokens_per_s=100, mock_ttft_ms=5)
    out = generate(prompts_df(spark, 800, partitions=2), prompt_col="prompt", params={"max_tokens": 16},
                   workers=[victim.address, survivor.address], max_in_flight=8, batch_size=8,
                   router={"breaker_failures": 1})
    job = run_in_thread(out.collect)
    probe = WorkerClient(victim.address)
    try:
        await wait_until(lambda: _running(probe), timeout=60, message="rows running on the victim")
    finally:
        await probe.close()
    victim.kill()
    rows = await asyncio.wrap_future(job)

    assert sorted(r.id for r in rows) == list(range(800)), "no row lost, none duplicated"
    assert [r.error for r in rows if r.error is not None] == []
    assert any(r.attempts > 1 and r.worker == survivor.address for r in rows), "rows in flight on the victim moved"
    expected = await client_answers(survivor.address, [GenerateInput(text=r.prompt) for r in rows],
                                    {"max_tokens": 16})
    assert [r.output for r in rows] == expected, "failed-over and migrated rows answer as if nothing happened"


async def _running(client: WorkerClient) -> bool:
    return (await client.load()).running > 0


@pytest.fixture(scope="module")
async def two_slots_each(module_mock_workers):
    """Two slow mock workers of two engine slots each: a few rows fill them."""
    return await module_mock_workers.start_many(2, mock_tokens_per_s=50, mock_ttft_ms=5, max_num_seqs=2)


@pytest.mark.parametrize("service_class", ["interactive", "batch"])
async def test_rows_far_beyond_the_workers_slots_wait_and_none_is_retried(spark, two_slots_each, service_class):
    """Overload (issue #50): 4 engine slots, 32 rows in flight, rows waiting many stall limits (up
    to ~4 s against 0.5 s). A worker whose engine steps is busy, not stuck: every row is answered at
    its first attempt. Interactive rows queue in the engines (a router that took a long wait for a
    hang retried them); batch rows wait in the router for slack."""
    out = generate(prompts_df(spark, 48, partitions=2), prompt_col="prompt", params={"max_tokens": 32},
                   workers=[w.address for w in two_slots_each], max_in_flight=16, batch_size=8, service_class=service_class,
                   router={"stall_timeout_s": 0.5, "first_chunk_timeout_s": 0.5, "load_poll_interval_s": 0.1})
    rows = await asyncio.to_thread(out.collect)

    assert sorted(r.id for r in rows) == list(range(48))
    assert [r.error for r in rows if r.error is not None] == []
    assert all(r.completion_tokens == 32 for r in rows)
    assert [r.id for r in rows if r.attempts != 1] == [], "a queued row was taken for a stalled one and retried"
