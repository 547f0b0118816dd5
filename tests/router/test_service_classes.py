"""Interactive and batch on the same workers: batch only where there is slack, a reserve kept
for interactive, batch withdrawn before its first token when interactive work finds no room,
and a starvation guard. Rules first (pure), then a Router over a real mock worker process."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from fakes import started_router
from support import wait_until
from vllm_fleet.client import WorkerClient
from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol.types import WorkerInfo, WorkerLoad
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.classes.batch_gate import BatchGate
from vllm_fleet.router.classes.service_class import ServiceClassConfig, guaranteed_batch, has_room, has_slack
from vllm_fleet.router.pool.snapshot import WorkerView

CONFIG = ServiceClassConfig(interactive_reserve=0.25, batch_max_kv_usage=0.8, batch_min_share=0.1)


def worker(running=0, waiting=0, kv=0.0, in_flight=0, slots=8):
    return WorkerView("w", in_flight=in_flight, max_num_seqs=slots,
                      load=WorkerLoad(running=running, waiting=waiting, kv_cache_usage=kv))


def test_batch_needs_slack_and_leaves_the_interactive_reserve():
    assert has_slack(worker(running=5), CONFIG)            # 5 < 8 × 0.75
    assert not has_slack(worker(running=6), CONFIG)        # the last two slots are interactive's
    assert not has_slack(worker(running=1, waiting=1), CONFIG)  # the engine queues already
    assert not has_slack(worker(running=1, kv=0.9), CONFIG)     # KV nearly full
    assert not has_slack(worker(running=0, in_flight=6), CONFIG)  # a stale Load: our own count wins
    assert not has_slack(WorkerView("w", load=None, max_num_seqs=8), CONFIG)  # nothing known yet


def test_requests_waiting_in_an_engine_that_schedules_by_class_do_not_hold_batch_back():
    # Its queue hands interactive work the next slot whatever batch waits there; the reserve and
    # the KV bound still hold.
    assert has_slack(worker(running=1, waiting=3), CONFIG, engine_schedules=True)
    assert not has_slack(worker(running=6, waiting=3), CONFIG, engine_schedules=True)
    assert not has_slack(worker(running=1, waiting=3, kv=0.9), CONFIG, engine_schedules=True)


def test_room_for_interactive_and_the_guard():
    assert has_room(worker(running=7)) and not has_room(worker(running=8))
    assert not has_room(worker(running=2, waiting=1))
    assert guaranteed_batch([worker(slots=8), worker(slots=8)], CONFIG) == 1   # 10% of 16, at least one
    assert guaranteed_batch([worker(slots=64), worker(slots=64)], CONFIG) == 12


FAST = dict(load_poll_interval_s=0.1, health_poll_interval_s=0.2, stall_timeout_s=30.0, first_chunk_timeout_s=30.0)


def routed(address: str, **classes):
    # Slots and withdrawal alone: the latency controller (tested above) stays out of these.
    classes = {"interactive_ttft_target_ms": None, "interactive_itl_target_ms": None, **classes}
    return started_router([address], RouterConfig(**FAST, classes=ServiceClassConfig(**classes)))


async def answer(router: Router, rid: str, service_class: str, max_tokens: int = 4) -> tuple[str, object]:
    request = build_request(rid, [GenerateInput(text=f"question {rid}")], SamplingParams(max_tokens=max_tokens),
                            service_class=service_class)
    text = []
    async with router.stream(request) as stream:
        async for chunk in stream:
            text.append(chunk.text)
        return "".join(text), stream


def batch_running(router: Router) -> int:
    return sum(w.batch_in_flight for w in router.snapshot())


async def test_batch_fills_only_the_slack_and_interactive_starts_at_once(mock_worker_factory):
    # 4 slots, reserve 25%: batch holds at most 3; the fourth slot is there for interactive.
    worker = await mock_worker_factory.start(max_num_seqs=4, mock_tokens_per_s=20, mock_ttft_ms=1)
    async with routed(worker.address, interactive_reserve=0.25, batch_min_share=0.0) as router:
        batch = [asyncio.create_task(answer(router, f"b{i}", "batch", max_tokens=40)) for i in range(6)]
        await wait_until(lambda: batch_running(router) == 3, timeout=30, message="batch at its share")
        assert batch_running(router) == 3  # three wait for slack, none fails
        text, stream = await answer(router, "live", "interactive")
        assert text and stream.withdrawals == 0
        assert batch_running(router) <= 3
        results = await asyncio.gather(*batch)
    assert all(text for text, _ in results) and len(results) == 6


async def test_interactive_work_withdraws_batch_that_has_not_started(mock_worker_factory):
    # Two slots, no reserve: batch takes both; its first token is a long way off (TTFT 3 s).
    worker = await mock_worker_factory.start(max_num_seqs=2, mock_tokens_per_s=200, mock_ttft_ms=3000)
    async with routed(worker.address, interactive_reserve=0.0, batch_min_share=0.0) as router:
        batch = [asyncio.create_task(answer(router, f"b{i}", "batch")) for i in range(2)]
        await wait_until(lambda: batch_running(router) == 2, timeout=30, message="batch holds every slot")
        await wait_until(lambda: router.snapshot().get(worker.address).load.running == 2, timeout=30,
                         message="the worker runs both")
        text, _ = await answer(router, "live", "interactive")
        assert text
        results = await asyncio.gather(*batch)
    withdrawn = [s for _, s in results if s.withdrawals]
    assert len(withdrawn) == 1                        # one made room, and was requeued...
    assert all(text for text, _ in results)            # ...and still answered: nothing lost
    assert all(s.attempts == 1 for _, s in results)    # a withdrawal is not a failed attempt


async def test_the_starvation_guard_lets_batch_through_a_busy_fleet(mock_worker_factory):
    worker = await mock_worker_factory.start(max_num_seqs=2, mock_tokens_per_s=50, mock_ttft_ms=1)
    # Reserve 0.5 of 2 slots leaves batch one; interactive holds it, so batch has no slack at all.
    async with routed(worker.address, interactive_reserve=0.5, batch_min_share=0.5, withdraw_batch=False) as router:
        live = asyncio.create_task(answer(router, "live", "interactive", max_tokens=400))
        await wait_until(lambda: router.snapshot().get(worker.address).in_flight == 1, timeout=30,
                         message="interactive running")
        text, _ = await answer(router, "b", "batch")  # the guard's one slot (50% of 2)
        assert text and not live.done()  # it did not wait for interactive work to end
        await live


async def test_an_unknown_service_class_is_refused(mock_worker_factory):
    worker = await mock_worker_factory.start(mock_ttft_ms=1)
    async with routed(worker.address) as router:
        request = build_request("x", [GenerateInput(text="hi")], SamplingParams(max_tokens=2), service_class="bulk")
        with pytest.raises(InvalidRequestError) as refused:
            router.stream(request)
        assert refused.value.param == "service_class"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_interactive_latency_halves_a_workers_batch_cap_and_quiet_windows_double_it_back():
    clock = Clock()
    gate = BatchGate(ServiceClassConfig(interactive_targets="absolute", interactive_ttft_target_ms=500,
                                        interactive_itl_target_ms=100, batch_raise_every_s=1.0), clock)
    share = lambda: 12  # noqa: E731
    assert gate.cap("w", 12) == 12                             # no miss yet: the whole batch share
    gate.observe("w", ttft_s=0.4, share=share)                 # on target: nothing
    gate.observe("w", itl_s=0.05, share=share)
    assert gate.cap("w", 12) == 12
    gate.observe("w", itl_s=0.3, share=share)                  # one slow gap of two: could be noise
    assert gate.cap("w", 12) == 12
    gate.observe("w", itl_s=0.3, share=share)                  # two of the last second's three: a miss
    assert gate.cap("w", 12) == 6
    gate.observe("w", ttft_s=2.0, share=share)                 # the same slow step, seen again at once
    assert gate.cap("w", 12) == 6
    clock.now += 0.6
    gate.observe("w", ttft_s=2.0, share=share)                 # still slow later: halve again
    assert gate.cap("w", 12) == 3
    assert gate.cap("other", 12) == 12                         # other workers keep theirs
    clock.now += 1.0
    assert gate.cap("w", 12) == 6       # one quiet window: doubled, to half the level where the misses began
    clock.now += 1.0
    assert gate.cap("w", 12) == 7       # from there one a window (doubling again would return to 12, which missed)
    clock.now += 1.0
    assert gate.cap("w", 12) == 8 and gate.cap("w", 7) == 7    # up to the share


def test_after_a_step_down_the_cap_doubles_back_to_half_the_level_that_missed_then_adds_one():
    clock = Clock()
    gate = BatchGate(ServiceClassConfig(interactive_targets="absolute", interactive_ttft_target_ms=500,
                                        batch_raise_every_s=1.0), clock)
    share = lambda: 16  # noqa: E731
    for _ in range(4):  # online steps up: four misses in a row take the cap to 1
        gate.observe("w", ttft_s=2.0, share=share)
        clock.now += gate.CUT_EVERY_S
    assert gate.cap("w", 16) == 1 and gate.cuts == 4
    clock.now -= gate.CUT_EVERY_S
    caps = []
    for _ in range(5):  # then latency is back on target: one decision per quiet window
        clock.now += 1.0
        caps.append(gate.cap("w", 16))
    # Doubling to 8, half of the 16 that missed, in 3 windows (adding one a second took 7), then
    # one a window: doubling on to 16 returned to the level that missed, to be cut again.
    assert caps == [2, 4, 8, 9, 10]


def test_each_cut_of_a_workers_batch_cap_is_counted_by_worker_signal_and_source():
    from prometheus_client import CollectorRegistry

    from vllm_fleet.router.metrics import RouterMetrics

    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    config = ServiceClassConfig(interactive_targets="absolute", interactive_ttft_target_ms=500)
    gate = BatchGate(config, on_cut=metrics.count_cut)  # wired as the Router wires it
    assert gate.observe("10.0.0.1:50051", ttft_s=2.0, share=lambda: 12)       # the router's own sample
    assert not gate.observe("10.0.0.2:50051", ttft_s=0.1, share=lambda: 12)
    gate.reported("10.0.0.2:50051", ttft_ms=0, itl_ms=900, share=lambda: 12)  # the worker's report
    cuts = "vllm_fleet_router_batch_cap_cuts_total"
    assert registry.get_sample_value(cuts, {"worker": "10.0.0.1:50051", "signal": "ttft", "source": "router"}) == 1
    assert registry.get_sample_value(cuts, {"worker": "10.0.0.2:50051", "signal": "itl", "source": "worker"}) == 1
    assert registry.get_sample_value(cuts, {"worker": "10.0.0.2:50051", "signal": "ttft", "source": "router"}) is None
    metrics.forget_worker("10.0.0.1:50051")                                     # a worker that left
    assert registry.get_sample_value(cuts, {"worker": "10.0.0.1:50051", "signal": "ttft", "source": "router"}) is None
    assert registry.get_sample_value(cuts, {"worker": "10.0.0.2:50051", "signal": "itl", "source": "worker"}) == 1


def test_one_slow_gap_among_many_is_not_a_miss_but_a_slow_second_is():
    clock = Clock()
    gate = BatchGate(ServiceClassConfig(interactive_targets="absolute", interactive_itl_target_ms=100), clock)
    share = lambda: 8  # noqa: E731
    for _ in range(20):  # a second of gaps on target, then one slow: the P97, not the P90
        clock.now += 0.05
        gate.observe("w", itl_s=0.05, share=share)
    assert not gate.observe("w", itl_s=0.5, share=share) and gate.cuts == 0
    for _ in range(2):   # 3 of 23 in the last second: over a tenth, but as often as noise does it
        gate.observe("w", itl_s=0.5, share=share)
    assert gate.cuts == 0
    for _ in range(3):   # 6 of 26: the P90 is over target beyond doubt
        gate.observe("w", itl_s=0.5, share=share)
    assert gate.cuts == 1 and gate.cap("w", 8) == 4
    clock.now += 5.0     # old gaps leave the window: the worker's report is a P90 already
    gate.reported("w", ttft_ms=0, itl_ms=150, share=share)
    assert gate.cuts == 2


def test_interactive_work_pauses_running_batch_only_when_every_slot_is_taken():
    gate = BatchGate(ServiceClassConfig())
    paused: list[int] = []
    for token in range(3):  # three batch attempts streaming on "w"
        gate.started("w", token, lambda: None)
        gate.first_token("w", token, pause=lambda t=token: paused.append(t))
    # A request waits in the engine but slots are free: vLLM's priority order runs the
    # interactive request first anyway; a pause would only cost the batch request a prefill.
    view = WorkerView("w", in_flight=3, max_num_seqs=8, batch_in_flight=3, load=WorkerLoad(running=3, waiting=1))
    assert gate.interactive_arrives(view) == 0 and not paused
    full = WorkerView("w", in_flight=3, max_num_seqs=8, batch_in_flight=3, load=WorkerLoad(running=8))
    assert gate.interactive_arrives(full) == 1 and len(paused) == 1 and gate.paused == gate.arrival_pauses == 1


def test_a_cap_of_zero_leaves_no_slack_on_that_worker():
    view = WorkerView("w", in_flight=1, max_num_seqs=8, batch_in_flight=1, load=WorkerLoad(running=1))
    assert has_slack(view, CONFIG, cap=2) and not has_slack(view, CONFIG, cap=1)
    assert not has_slack(view, CONFIG, cap=0)


async def test_batch_withdrawn_by_the_latency_controller_is_answered_not_refused(mock_worker_factory):
    # Every interactive first token misses a 50 ms target (the mock's TTFT is 300 ms): each one
    # halves the batch cap and withdraws the batch requests not started, which go again at once.
    worker = await mock_worker_factory.start(max_num_seqs=8, mock_tokens_per_s=50, mock_ttft_ms=300)
    async with routed(worker.address, interactive_ttft_target_ms=50, batch_min_share=0.0) as router:
        batch = [asyncio.create_task(answer(router, f"b{i}", "batch", max_tokens=6)) for i in range(6)]
        for i in range(4):
            text, _ = await answer(router, f"live{i}", "interactive", max_tokens=2)
            assert text
        results = await asyncio.gather(*batch)  # a DuplicateRequestError would raise here
    assert all(text for text, _ in results)
    assert router._batch.cuts >= 1 and sum(s.withdrawals for _, s in results) >= 1


def _six_batch_attempts_two_waiting_four_streaming_one_constrained(gate: BatchGate, stepped: list[str]) -> None:
    for token in range(6):  # six batch attempts on "w"
        gate.started("w", token, lambda t=token: stepped.append(f"withdraw {t}"))
        if token >= 2:
            gate.first_token("w", token, pause=lambda t=token: stepped.append(f"pause {t}"))
    gate.first_token("w", 6)  # a constrained one (no pause callable) is never paused


def test_a_latency_miss_withdraws_only_batch_without_a_first_token_and_lets_the_rest_end():
    # A paused request prefills again when it resumes: on a compute-bound engine that is more of the
    # interference the cut is for. So by default a cut takes back only what has not started.
    clock = Clock()
    gate = BatchGate(ServiceClassConfig(interactive_itl_target_ms=100), clock)
    stepped: list[str] = []
    _six_batch_attempts_two_waiting_four_streaming_one_constrained(gate, stepped)
    gate.observe("w", itl_s=0.5, share=lambda: 8)  # 6 run: cap 3; only the two waiting ones step aside
    assert sorted(stepped) == ["withdraw 0", "withdraw 1"] and gate.paused == 0 and gate.withdrawn == 2
    for token in (0, 1):
        gate.ended("w", token)
    assert gate.cap("w", 8) == 3 and gate.running["w"] == 4  # the streaming ones end as they would
    clock.now += 0.6
    gate.observe("w", itl_s=0.5, share=lambda: 8)  # a second miss: cap 1, still nothing paused
    assert gate.paused == 0 and gate.cap("w", 8) == 1 and len(stepped) == 2


def test_with_pause_on_cut_a_latency_miss_pauses_running_batch_down_to_the_new_cap():
    clock = Clock()
    gate = BatchGate(ServiceClassConfig(interactive_itl_target_ms=100, pause_batch_on_cut=True), clock)
    stepped: list[str] = []
    _six_batch_attempts_two_waiting_four_streaming_one_constrained(gate, stepped)
    gate.observe("w", itl_s=0.5, share=lambda: 8)  # 6 run: cap 3; the excess of 3 steps aside
    assert sorted(stepped) == ["pause 5", "withdraw 0", "withdraw 1"] and gate.paused == 1
    for token in (0, 1, 5):
        gate.ended("w", token)
    clock.now += 0.6
    gate.observe("w", itl_s=0.5, share=lambda: 8)  # 3 run: cap 1, 2 over → the newest 2 pause
    assert gate.paused == 3 and sorted(s for s in stepped if s.startswith("pause")) == ["pause 3", "pause 4", "pause 5"]
    assert ServiceClassConfig(preempt_batch=False).preempt_batch is False


def test_a_miss_withdraws_only_the_excess_over_the_cap():
    gate = BatchGate(ServiceClassConfig(interactive_ttft_target_ms=500))
    stepped: list[int] = []
    for token in range(4):  # four on "w", none with a first token yet
        gate.started("w", token, lambda t=token: stepped.append(t))
    gate.observe("w", ttft_s=2.0, share=lambda: 12)  # 4 run: cap 2; two step aside, two keep going
    assert len(stepped) == 2 and gate.withdrawn == 2 and gate.paused == 0
    assert gate.cap("w", 12) == 2


async def test_a_running_batch_request_pauses_for_interactive_work_and_resumes_exactly(mock_worker_factory):
    # Two slots, both streaming long batch answers (4 s each): an interactive request would wait
    # in the engine for one to end. Instead one pauses, and later resumes after its tokens.
    worker = await mock_worker_factory.start(max_num_seqs=2, mock_tokens_per_s=50, mock_ttft_ms=1)
    async with routed(worker.address, interactive_reserve=0.0, batch_min_share=0.0) as router:
        streams = {}

        async def batch_answer(rid: str) -> list[int]:
            request = build_request(rid, [GenerateInput(text=f"question {rid}")], SamplingParams(max_tokens=200),
                                    service_class="batch")
            tokens = []
            async with router.stream(request) as stream:
                streams[rid] = stream
                async for chunk in stream:
                    tokens.extend(chunk.token_ids)
            return tokens

        batch = {rid: asyncio.create_task(batch_answer(rid)) for rid in ("b0", "b1")}
        await wait_until(lambda: router.snapshot().get(worker.address).load.running == 2, timeout=30,
                         message="the worker streams both")
        text, live = await answer(router, "live", "interactive", max_tokens=4)
        assert text and live.attempts == 1
        assert not any(task.done() for task in batch.values())  # it did not wait for a batch answer to end
        got = {rid: await task for rid, task in batch.items()}
    paused = [rid for rid, stream in streams.items() if stream.pauses]
    assert len(paused) == 1 and streams[paused[0]].attempts == 1 and streams[paused[0]].migrations == 0
    for rid, tokens in got.items():  # the mock's tokens depend only on what came before: an exact resume
        reference = build_request(f"{rid}-ref", [GenerateInput(text=f"question {rid}")], SamplingParams(max_tokens=200))
        async with WorkerClient(worker.address) as client:
            want = [t async for chunk in client.generate(reference, timeout=60) for t in chunk.token_ids]
        assert tokens == want, f"{rid}: tokens lost or repeated across the pause"


async def test_a_router_with_only_batch_backs_off_when_the_worker_reports_slow_interactive_streams(
        mock_worker_factory):
    # A Spark executor's router carries no interactive traffic of its own. The gateway's chat
    # stream on the same worker gets a token every 50 ms (the mock's 20 tokens/s) against a 10 ms
    # target: the worker's Load says so, and the executor's router halves its batch cap there.
    worker = await mock_worker_factory.start(max_num_seqs=8, mock_tokens_per_s=20, mock_ttft_ms=1)
    # Absolute targets: with relative ones, the seconds after "row" without batch would teach the
    # executor's router the worker's latency instead (tests/router/test_relative_targets.py).
    async with routed(worker.address, interactive_targets="absolute", interactive_itl_target_ms=10) as executor, \
            routed(worker.address) as gateway:
        text, _ = await answer(executor, "row", "batch", max_tokens=20)  # batch alone is not reported
        async with WorkerClient(worker.address) as client:
            load = await client.load()
        assert text and load.interactive_itl_p90_ms == 0 and load.interactive_ttft_p90_ms == 0
        assert executor._batch.cuts == 0
        live = asyncio.create_task(answer(gateway, "chat", "interactive", max_tokens=40))
        await wait_until(lambda: executor._batch.cuts >= 1, timeout=30,
                         message="the executor's router cut its batch cap on the worker's report")
        share = 6  # 8 slots less the 25% interactive reserve
        assert executor._batch.cap(worker.address, share) < share
        assert executor.snapshot().get(worker.address).load.interactive_itl_p90_ms > 10
        await live


def _governed_worker(target: str) -> SimpleNamespace:
    """A worker as the pool tracks it, its Info saying whether its engine governs its steps."""
    return SimpleNamespace(address="w", info=WorkerInfo(model="m", max_model_len=2048, engine="vllm",
                                                        settings={"batch_slowdown_target": target}))


@pytest.mark.parametrize("control, target, router_acts", [
    ("auto", "1.1", False),   # the engine holds its steps, admits interactive first, preempts batch itself
    ("auto", "", True),       # a stock or mock engine: the router's rules are all there is
    ("router", "1.1", True),  # asked to steer everywhere, as before the engine could
])
def test_the_router_cuts_and_moves_batch_aside_only_where_the_engine_does_not_schedule_by_class(
        control, target, router_acts):
    gate = BatchGate(ServiceClassConfig(latency_control=control, interactive_targets="absolute",
                                        interactive_itl_target_ms=100), Clock())
    gate.info(_governed_worker(target))
    withdrawn = []
    gate.started("w", 1, lambda: withdrawn.append(1))    # a batch attempt without a first token
    full = WorkerView("w", in_flight=1, batch_in_flight=1, max_num_seqs=8,
                      load=WorkerLoad(running=1, waiting=2, kv_cache_usage=0.1))   # requests wait there
    assert gate.interactive_arrives(full) == int(router_acts) == len(withdrawn) == gate.withdrawn
    gate.reported("w", ttft_ms=0, itl_ms=500, share=lambda: 8)   # the worker's own P90: five times the target
    assert gate.cuts == int(router_acts)
    gate.info(_governed_worker(""))    # restarted without a governor: the router steers again
    gate.left("w")
    assert "w" not in gate._engine_governed
