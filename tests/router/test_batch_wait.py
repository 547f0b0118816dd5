"""Why batch waits (router/classes/batch_wait.py): the account of batch requests waiting for slack, the
reason per worker a person can act on, the gauge and the log line. Reasons first (pure), then a
Router over a real mock worker process whose only batch slot an interactive request holds."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from support import wait_until
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol.types import WorkerInfo, WorkerLoad
from vllm_fleet.registry import StaticRegistry, WorkerRecord
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.classes.batch_gate import BatchGate
from vllm_fleet.router.classes.batch_wait import why_no_slack
from vllm_fleet.router.classes.service_class import ServiceClassConfig
from vllm_fleet.router.pool.snapshot import DOWN, PoolSnapshot, WorkerView

CONFIG = ServiceClassConfig(interactive_reserve=0.2, batch_max_kv_usage=0.9, batch_min_share=0.0,
                            interactive_targets="absolute", interactive_ttft_target_ms=500,
                            interactive_itl_target_ms=100, batch_raise_every_s=1.0)


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def view(address, *, running=0, waiting=0, kv=0.0, batch=0, model="m", **extra):
    return WorkerView(address, model=model, max_num_seqs=16, batch_in_flight=batch, in_flight=batch,
                      load=WorkerLoad(running=running, waiting=waiting, kv_cache_usage=kv), **extra)


def test_the_reason_names_what_keeps_batch_off_each_worker():
    gate = BatchGate(CONFIG, Clock())
    gate.observe("w3", ttft_s=2.0, share=lambda: 12)  # an interactive miss: w3's cap halves to 6
    snapshot = PoolSnapshot((
        view("w1", running=4, waiting=3),
        view("w2", running=4, kv=0.97),
        view("w3", running=6, batch=6),
        view("w4", running=14),
        view("w5", state=DOWN, health="NOT_SERVING"),
        view("x1", model="other"),
    ))
    reason = why_no_slack(snapshot, gate, "m", None)
    assert reason.startswith("no worker of model 'm' has batch slack: ")
    assert "w1 has 3 request(s) waiting in its engine" in reason
    assert "w2 KV-cache usage 0.97 >= batch_max_kv_usage 0.9" in reason
    assert "w3: the latency controller cut batch to 6 (of 12) after interactive requests missed their " \
           "latency targets (TTFT 500 ms, ITL 100 ms); it lets batch back 1 s after the misses stop" in reason
    assert "w4 running 14 >= batch cap 12 (interactive_reserve 0.2 of max_num_seqs 16)" in reason
    assert "and 1 more workers" in reason and "x1" not in reason  # four named; other models' workers not at all
    assert why_no_slack(PoolSnapshot((view("w5", state=DOWN, health="UNREACHABLE"),)), gate, "m", None) == \
        "no worker of model 'm' has batch slack: w5 is down (health UNREACHABLE)"
    assert why_no_slack(snapshot, gate, "gone", None) == "no worker serves model 'gone'"


def test_requests_waiting_in_an_engine_that_schedules_by_class_are_no_reason():
    gate = BatchGate(CONFIG, Clock())
    gate.info(SimpleNamespace(address="w1", info=WorkerInfo(model="m", max_model_len=2048, engine="vllm",
                                                            settings={"batch_slowdown_target": "1.1"})))
    reason = why_no_slack(PoolSnapshot((view("w1", running=14, waiting=3),)), gate, "m", None)
    assert "waiting in its engine" not in reason and "w1 running 17 >= batch cap 12" in reason  # 14 + 3 waiting


FAST = dict(load_poll_interval_s=0.1, health_poll_interval_s=0.2, stall_timeout_s=30.0, first_chunk_timeout_s=30.0)


def request(rid: str, service_class: str, max_tokens: int):
    return build_request(rid, [GenerateInput(text=f"question {rid}")], SamplingParams(max_tokens=max_tokens),
                         service_class=service_class)


async def answer(router: Router, rid: str, service_class: str, max_tokens: int) -> str:
    async with router.stream(request(rid, service_class, max_tokens)) as stream:
        return "".join([chunk.text async for chunk in stream])


async def test_a_batch_request_without_slack_waits_says_why_and_completes_when_slack_returns(
        mock_worker_factory, caplog):
    caplog.set_level(logging.INFO, logger="vllm_fleet.router.classes.batch_wait")
    # Four slots, three kept for interactive: batch may hold one.
    worker = await mock_worker_factory.start(max_num_seqs=4, mock_tokens_per_s=50, mock_ttft_ms=1)
    metrics = CollectorRegistry()
    classes = ServiceClassConfig(interactive_reserve=0.75, batch_min_share=0.0, withdraw_batch=False,
                                 interactive_ttft_target_ms=None, interactive_itl_target_ms=None)
    router = Router(StaticRegistry([WorkerRecord(address=worker.address)]), RouterConfig(**FAST, classes=classes),
                    metrics_registry=metrics)
    await router.start()
    tasks: list[asyncio.Task] = []
    try:
        await router.wait_ready(timeout=60)
        assert router.batch_wait_status().waiting == 0 and router.batch_wait_status().reason == ""
        live = asyncio.create_task(answer(router, "live", "interactive", max_tokens=2000))  # 40 s of tokens
        tasks.append(live)
        await wait_until(lambda: router.snapshot().get(worker.address).in_flight == 1, timeout=30,
                         message="interactive holds the slot")
        # The starvation guard lets one batch request through whatever the slack: this one.
        guarded = asyncio.create_task(answer(router, "guarded", "batch", max_tokens=2000))
        tasks.append(guarded)
        await wait_until(lambda: router.snapshot().get(worker.address).batch_in_flight == 1, timeout=30,
                         message="the guard's batch request running")
        batch = asyncio.create_task(answer(router, "row", "batch", max_tokens=4))
        tasks.append(batch)
        await wait_until(lambda: router.batch_wait_status().waiting == 1, timeout=30, message="batch waiting")
        await wait_until(lambda: router.snapshot().get(worker.address).load.running == 2, timeout=30,
                         message="the worker's Load shows both")
        status = router.batch_wait_status()
        assert status.since is not None and status.waited_s >= 0
        assert status.reason == (f"no worker of model {router.models()[0]!r} has batch slack: {worker.address} "
                                 f"running 2 >= batch cap 1 (interactive_reserve 0.75 of max_num_seqs 4) (the "
                                 f"starvation guard's 1 request(s), batch_min_share 0.0, are running)")
        assert router.batch_wait_status(request_ids={"row"}).waiting == 1
        assert router.batch_wait_status(request_ids={"another"}).waiting == 0
        assert metrics.get_sample_value("vllm_fleet_router_batch_waiting") == 1.0
        logged = [r.getMessage() for r in caplog.records if "waiting for slack" in r.getMessage()]
        assert logged and "batch cap 1" in logged[0]
        assert not batch.done()  # it waits; it is not failed for it
        for task in (live, guarded):  # their callers leave: the slots are slack again
            task.cancel()
        assert await batch
        assert router.batch_wait_status().waiting == 0 and router.batch_wait_status().reason == ""
        assert metrics.get_sample_value("vllm_fleet_router_batch_waiting") == 0.0
        assert any("no longer wait" in r.getMessage() for r in caplog.records)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await router.close()
