"""Scenario 10: a Spark job while its workers are killed (-9) and restarted, one at a time.

A supervisor in the test kills a worker that has rows running, keeps it down for a moment,
restarts it on the same port, waits until the job's routers send it rows again, then moves on
to the next worker, for as long as the job runs. One of three workers is down at most, so every
row must be answered: output rows == input rows, each row id exactly once, no error row, and
each row's answer equal to the same job's answer without faults (the mock engine is
deterministic: a migrated row has lost or repeated no token). The answers without faults come
from the workers directly, many at a time: the same job through Spark without faults took ~40 s
of a 121 s test and checks nothing the Spark tests do not. Figures: lost and duplicated rows,
kills, rows that needed more than one attempt, runtime with faults.

CI runs 4,000 rows; the 20,000-row version is `-m slow` (benchmarks/reliability.py runs it).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from support import WorkerProcess, wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import GenerateInput
from vllm_fleet.spark import generate

PARAMS = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}
DOWN_S = 1.0  # how long a killed worker stays down (the fault's length, not a wait for anything)


def _prompt(i: int) -> str:
    return f"row {i}: tell me about the {i % 11} rivers"


def _job(spark, rows: int, addresses: list[str]):
    df = spark.createDataFrame([(i, _prompt(i)) for i in range(rows)], "id long, prompt string").repartition(2)
    return generate(df, prompt_col="prompt", params=PARAMS, workers=addresses, id_col="id",
                    max_in_flight=32, batch_size=16, router={"health_poll_interval_s": 0.5})


async def _answers_without_faults(addresses: list[str], rows: int, per_worker: int = 128) -> dict[int, str]:
    """Each row's answer from one worker on its own (rows spread over the workers), by row id."""
    clients = [WorkerClient(address) for address in addresses]
    slots = [asyncio.Semaphore(per_worker) for _ in addresses]

    async def one(i: int) -> str:
        request = build_request(request_id=f"alone-{i}", inputs=[GenerateInput(text=_prompt(i))],
                                params=SamplingParams(**PARAMS))
        async with slots[i % len(clients)]:
            return "".join([chunk.text async for chunk in clients[i % len(clients)].generate(request, timeout=120)])

    try:
        return dict(enumerate(await asyncio.gather(*(one(i) for i in range(rows)))))
    finally:
        for client in clients:
            await client.close()


async def _running(address: str) -> bool:
    client = WorkerClient(address)
    try:
        return (await client.load()).running > 0
    except Exception:
        return False
    finally:
        await client.close()


async def _kill_and_restart_while(job: asyncio.Future, pool: list[WorkerProcess], kills: list[float]) -> None:
    """Until the job ends: kill -9 the next worker once it has rows running, restart it on its port,
    and wait until rows run on it again (the executors' routers took it back) before the next kill."""
    victim = 0
    while not job.done():
        worker = pool[victim]
        await wait_until(lambda: job.done() or _running(worker.address), timeout=60, interval=0.05,
                         message=f"rows running on {worker.address}")
        if job.done():
            return
        worker.kill()
        kills.append(time.monotonic())
        await asyncio.sleep(DOWN_S)
        pool[victim] = WorkerProcess(args=worker.args, env=worker.env, port=worker.port).start()
        await pool[victim].wait_serving(120)
        await wait_until(lambda: job.done() or _running(pool[victim].address), timeout=60, interval=0.05,
                         message=f"the restarted {worker.address} to take rows again")
        victim = (victim + 1) % len(pool)


@pytest.mark.parametrize("rows", [pytest.param(4000, marks=pytest.mark.timeout(300), id="4k"),
                                  pytest.param(20_000, marks=[pytest.mark.slow, pytest.mark.timeout(900)], id="20k")])
async def test_spark_job_survives_workers_killed_and_restarted(spark, workers, rows):
    # ~640 ms a row, 2 partitions x 32 in flight: a ~40 s job, long enough for several kill cycles
    # now that a restarted mock worker takes ~10 s to serve (it imports vLLM, ~9 s of CPU).
    pool = await workers(3, mock_tokens_per_s=25, mock_ttft_ms=5)
    addresses = [w.address for w in pool]
    await asyncio.to_thread(_job(spark, 200, addresses).collect)  # warm-up: executors' routers exist

    expected = await _answers_without_faults(addresses, rows)
    assert all(expected.values())

    kills: list[float] = []
    started = time.monotonic()
    job = asyncio.ensure_future(asyncio.to_thread(_job(spark, rows, addresses).collect))
    try:
        await _kill_and_restart_while(job, pool, kills)
        out = await job
    finally:
        for worker in pool:  # the restarted ones are not the fixture's: stop them here
            worker.kill()
    faulted_s = time.monotonic() - started

    counts = Counter(r.id for r in out)
    lost = rows - len(counts)
    duplicated = len(out) - len(counts)
    assert len(kills) >= 2, f"only {len(kills)} kills during the job: make it longer"
    assert lost == 0 and duplicated == 0 and len(out) == rows, f"lost {lost}, duplicated {duplicated}"
    assert sorted(counts) == list(range(rows))
    errors = [(r.id, r.error) for r in out if r.error is not None]
    assert errors == [], f"{len(errors)} error rows, e.g. {errors[:3]}"
    retried = sum(1 for r in out if r.attempts > 1)
    assert retried > 0, "no row was in flight on a killed worker"
    wrong = [r.id for r in out if r.output != expected[r.id]]
    assert wrong == [], f"{len(wrong)} rows answer differently than without faults (lost or repeated tokens)"
    print(f"\n[figure] Spark {rows} rows, {len(kills)} kill -9 + restart cycles of 1 of {len(pool)} workers: "
          f"lost rows {lost}, duplicated rows {duplicated}, error rows {len(errors)}, {retried} rows needed >1 attempt; "
          f"runtime {faulted_s:.1f} s")
