"""EngineWatch: an engine holding requests that stops producing is a stall, within a bound
derived from its own recent steps; an idle engine, a slow one, a long prefill and a starved
worker loop are not."""

from __future__ import annotations

import pytest

from vllm_fleet.config import WorkerConfig
from vllm_fleet.worker.watch.engine_cpu import EngineCpu
from vllm_fleet.worker.watch.engine_watch import EngineWatch, StallBounds

TICK = 0.5
BOUNDS = StallBounds.of(WorkerConfig())  # floor 4 s, 10 × step, cap 10 s, 10 s per 1k pending, cold 60 s


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watch_with(clock: Clock, bounds: StallBounds = BOUNDS) -> EngineWatch:
    return EngineWatch(bounds, clock=clock)


def run_steps(watch: EngineWatch, clock: Clock, ids: list[str], steps: int, step_s: float) -> None:
    """`steps` engine steps of `step_s`, each giving output to every request in `ids`."""
    for _ in range(steps):
        clock.now += step_s
        for engine_id in ids:
            watch.produced(engine_id)


def silent_for(watch: EngineWatch, clock: Clock, seconds: float):
    """Tick the watch every TICK for `seconds` of engine silence; the first verdict, if any, with
    the silence it came after."""
    waited = 0.0
    while waited < seconds:
        clock.now += TICK
        waited += TICK
        stall = watch.check(TICK)
        if stall is not None:
            return stall, waited
    return None, waited


def test_decoding_requests_with_no_output_past_the_bound_are_a_stall():
    clock = Clock()
    watch = watch_with(clock)
    ids = [f"r{i}-0" for i in range(16)]
    for engine_id in ids:
        watch.submitted(engine_id, 20)
    run_steps(watch, clock, ids, steps=50, step_s=0.05)
    stall, after = silent_for(watch, clock, 30)
    assert stall is not None
    assert set(stall.engine_ids) == set(ids)
    # Steps of 50 ms: 10 × 0.05 s is under the floor, so the floor (2 s) is the bound.
    assert stall.bound_s == BOUNDS.floor_s
    assert BOUNDS.floor_s < after <= BOUNDS.floor_s + TICK
    assert watch.check(TICK) is stall  # the verdict stays


def test_an_idle_engine_is_never_stalled():
    clock = Clock()
    watch = watch_with(clock)
    watch.submitted("a-0", 5)
    run_steps(watch, clock, ["a-0"], steps=5, step_s=0.05)
    watch.finished("a-0")
    assert silent_for(watch, clock, 120)[0] is None


def test_slow_steps_widen_the_bound_up_to_its_cap():
    clock = Clock()
    watch = watch_with(clock)
    watch.submitted("a-0", 5)
    run_steps(watch, clock, ["a-0"], steps=10, step_s=0.5)  # 10 × 0.5 s = 5 s: above the floor
    assert watch.bound_s() == pytest.approx(5.0)
    stall, after = silent_for(watch, clock, 30)
    assert stall is not None and after >= stall.bound_s > 4.9
    clock.now += 40  # the slow steps leave the window ...
    slow = watch_with(clock)
    slow.submitted("b-0", 5)
    run_steps(slow, clock, ["b-0"], steps=10, step_s=1.5)  # ... and 10 × 1.5 s is capped
    assert slow.bound_s() == BOUNDS.max_s


def test_a_pending_prompt_adds_its_prefill_allowance():
    clock = Clock()
    watch = watch_with(clock)
    watch.submitted("old-0", 10)
    run_steps(watch, clock, ["old-0"], steps=20, step_s=0.05)
    decode_bound = watch.bound_s()
    watch.submitted("long-0", 2000)  # its prefill is in the step "old" now waits on
    assert watch.bound_s() == pytest.approx(decode_bound + BOUNDS.prefill_s_per_1k * 2.0)
    assert silent_for(watch, clock, decode_bound + 5)[0] is None
    watch.produced("long-0")  # its first token: the allowance is gone, but that long step is
    assert watch.bound_s() == BOUNDS.max_s  # remembered (capped) while it is recent


def test_an_engine_that_never_produced_gets_the_cold_start_allowance():
    clock = Clock()
    watch = watch_with(clock)
    watch.submitted("first-0", 3)
    stall, after = silent_for(watch, clock, 120)
    assert stall is not None and after > BOUNDS.cold_start_s


def test_a_late_tick_is_not_judged():
    """The worker's own loop was blocked: outputs may be waiting to be noted."""
    clock = Clock()
    watch = watch_with(clock)
    watch.submitted("a-0", 5)
    run_steps(watch, clock, ["a-0"], steps=5, step_s=0.05)
    assert watch.check(TICK) is None
    clock.now += 10  # one tick, ten seconds late
    assert watch.check(TICK) is None
    clock.now += TICK
    assert watch.check(TICK) is not None  # still silent on the next, timely tick


def test_a_disabled_watch_never_judges():
    clock = Clock()
    watch = EngineWatch(BOUNDS, enabled=False, clock=clock)
    watch.submitted("a-0", 5)
    run_steps(watch, clock, ["a-0"], steps=5, step_s=0.05)
    assert silent_for(watch, clock, 120)[0] is None


def test_an_engine_using_cpu_gets_the_busy_bound_and_a_stopped_one_does_not():
    """A slow step burns CPU in the engine processes; a stopped EngineCore burns none."""
    clock = Clock()
    busy, stopped = watch_with(clock), watch_with(clock)
    for watch in (busy, stopped):
        watch.submitted("a-0", 5)
        run_steps(watch, clock, ["a-0"], steps=5, step_s=0.05)
    for _ in range(int((BOUNDS.floor_s + 2 * TICK) / TICK)):
        clock.now += TICK
        assert busy.check(TICK, engine_busy=True) is None
        stopped.check(TICK, engine_busy=False)
    assert stopped.stall is not None            # past the short bound with no CPU used
    assert busy.stall is None                   # the same silence, but the engine was working
    for _ in range(int(BOUNDS.busy_max_s / TICK)):  # a spinning hang still ends
        clock.now += TICK
        busy.check(TICK, engine_busy=True)
    assert busy.stall is not None and busy.stall.bound_s == BOUNDS.busy_max_s


def test_requests_arriving_during_a_stall_do_not_push_its_detection_back():
    """New requests at a hung engine, long prompts included, cannot be in the step it hangs in:
    they add no prefill allowance, so the verdict comes when it would with none arriving (#28)."""
    clock = Clock()
    quiet, crowded = watch_with(clock), watch_with(clock)
    for watch in (quiet, crowded):
        watch.submitted("a-0", 5)
    for _ in range(20):               # the same steps, at the same times, for both
        clock.now += 0.05
        quiet.produced("a-0")
        crowded.produced("a-0")
    verdicts = {}
    arrivals = 0
    while len(verdicts) < 2 and clock.now < 2000:
        for _ in range(10):           # 20 requests a second, 2,000-token prompts, from just after the last output
            clock.now += TICK / 10
            arrivals += 1
            crowded.submitted(f"new{arrivals}-0", 2000)
        for name, watch in (("quiet", quiet), ("crowded", crowded)):
            if name not in verdicts and watch.check(TICK) is not None:
                verdicts[name] = clock.now
    assert verdicts["crowded"] == verdicts["quiet"]
    assert crowded.stall.bound_s == quiet.stall.bound_s == BOUNDS.floor_s


def test_a_request_arriving_just_after_the_last_output_gets_no_prefill_allowance_but_its_prefill_is_not_cut():
    """A request submitted 10 ms after the last output may still be in the engine's next step:
    it adds nothing to the bound (else arrivals decide detection, #28), but if the engine does
    prefill it, the engine's CPU keeps the verdict away (the busy bound)."""
    clock = Clock()
    watch = watch_with(clock)
    watch.submitted("old-0", 10)
    run_steps(watch, clock, ["old-0"], steps=20, step_s=0.05)
    decode_bound = watch.bound_s()
    clock.now += 0.01
    watch.submitted("long-0", 4000)
    assert watch.bound_s() == decode_bound
    while clock.now < 1000 + 20 * 0.05 + BOUNDS.busy_max_s - 1:   # a long prefill, the engine's CPU busy
        clock.now += TICK
        assert watch.check(TICK, engine_busy=True) is None


class FakeCpu:
    """CPU seconds of the worker process and of its EngineCore child, advanced by hand."""

    def __init__(self) -> None:
        self.own, self.core = 10.0, 50.0

    def __call__(self) -> tuple[float, dict[int, float]]:
        return self.own, {4242: self.core}


def test_the_worker_process_alone_counts_as_engine_work_only_shortly_after_the_engine_worked():
    clock, cpu = Clock(), FakeCpu()
    engine_cpu = EngineCpu(own_counts_for_s=8.0, read=cpu, clock=clock)
    engine_cpu.advanced()
    clock.now += TICK
    cpu.core += 0.4                       # the engine steps
    assert engine_cpu.advanced()
    # Then the EngineCore stops; the worker process keeps rendering new requests.
    busy_ticks = 0
    for _ in range(60):
        clock.now += TICK
        cpu.own += 0.3
        busy_ticks += engine_cpu.advanced()
    assert busy_ticks == int(8.0 / TICK)  # output processing right after a step still counts ...
    clock.now += TICK
    cpu.own += 0.3
    assert not engine_cpu.advanced()      # ... but not for ever: the short bound applies again
    cpu.core += 0.4
    clock.now += TICK
    assert engine_cpu.advanced()          # a slow engine step is still work


def test_an_engine_without_child_processes_is_judged_by_the_worker_process_alone():
    clock, own = Clock(), [10.0]
    engine_cpu = EngineCpu(own_counts_for_s=8.0, read=lambda: (own[0], {}), clock=clock)
    engine_cpu.advanced()
    for _ in range(40):                   # the mock engine, working in the worker process
        clock.now += TICK
        own[0] += 0.3
        assert engine_cpu.advanced()
    clock.now += TICK
    assert not engine_cpu.advanced()      # and idle
