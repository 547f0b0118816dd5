"""Relative latency targets: batch backs off a worker where interactive latency passes a factor
times what it is there without this router's batch, a baseline learnt per worker; the absolute
targets stand in until it is known. Pure (a fake clock), then one Router over a mock worker."""

from __future__ import annotations

import pytest
from fakes import started_router
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.router import RouterConfig
from vllm_fleet.router.classes.batch_gate import BatchGate
from vllm_fleet.router.classes.service_class import ServiceClassConfig
from vllm_fleet.latency_stats import LatencyBaseline, p90

SHARE = lambda: 8  # noqa: E731


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def gate_with(clock: Clock, **config) -> BatchGate:
    return BatchGate(ServiceClassConfig(**{"interactive_ttft_target_ms": None, "interactive_itl_target_ms": 200.0,
                                           **config}), clock)


def learn_gaps(gate: BatchGate, clock: Clock, gap_s: float, count: int = BatchGate.BASELINE_GAPS) -> None:
    for _ in range(count):
        clock.now += gap_s
        gate.observe("w", itl_s=gap_s, share=SHARE)


def run_batch(gate: BatchGate, count: int) -> None:
    for token in range(count):
        gate.started("w", token, lambda: None)


def slow_second(gate: BatchGate, clock: Clock, gap_s: float) -> bool:
    """A second of token gaps of `gap_s` on "w"; whether any of them cut."""
    cut = False
    for _ in range(int(1 / gap_s)):
        clock.now += gap_s
        cut = gate.observe("w", itl_s=gap_s, share=SHARE) or cut
    return cut


def test_on_a_slow_machine_latency_batch_did_not_cause_does_not_cut_it():
    # Without batch, token gaps are 500 ms here: over the 200 ms absolute target. Absolute
    # targets cut batch for it; relative ones learn 500 ms and cut only past 1.1 x 500 ms.
    for mode, cuts in (("absolute", True), ("relative", False)):
        clock = Clock()
        gate = gate_with(clock, interactive_targets=mode)
        learn_gaps(gate, clock, 0.5)          # no batch runs: with relative targets, these teach the baseline
        assert gate.cuts == 0 or mode == "absolute"
        run_batch(gate, 4)
        clock.now += 5                        # past the absolute cuts' windows
        before = gate.cuts
        assert slow_second(gate, clock, 0.5) is cuts and (gate.cuts > before) is cuts, mode
    assert gate.baseline("w") == (None, 0.5) and gate.targets("w") == (None, 0.55)
    # 0.6 s > 1.1 x 0.5 s, two gaps in a row (one could be noise): batch's doing
    assert (slow_second(gate, clock, 0.6) | slow_second(gate, clock, 0.6)) and gate.cap("w", 8) == 2


def test_on_a_fast_machine_a_slowdown_under_the_absolute_target_cuts():
    # Without batch, gaps are 20 ms; with it 40 ms: twice as slow, yet far under 200 ms.
    clock = Clock()
    gate = gate_with(clock, interactive_slowdown_target=1.5)
    learn_gaps(gate, clock, 0.02)
    run_batch(gate, 4)
    assert slow_second(gate, clock, 0.04) and gate.cuts >= 1
    absolute = gate_with(clock := Clock(), interactive_targets="absolute")
    learn_gaps(absolute, clock, 0.02)
    run_batch(absolute, 4)
    assert not slow_second(absolute, clock, 0.04) and absolute.cuts == 0


def test_until_a_baseline_is_learnt_the_absolute_targets_stand_in():
    clock = Clock()
    gate = gate_with(clock, interactive_ttft_target_ms=1000.0)
    run_batch(gate, 4)  # batch from the start: nothing to learn from
    assert gate.targets("w") == (1.0, 0.2)
    assert not gate.observe("w", ttft_s=0.9, share=SHARE)
    clock.now += gate.MISS_WINDOW_S["ttft"] + 0.1  # alone in its window: one first token over 1 s is a miss
    assert gate.observe("w", ttft_s=1.2, share=SHARE) and gate.cap("w", 8) == 2


def test_a_first_token_teaches_the_baseline_only_if_no_batch_ran_while_it_waited():
    clock = Clock()
    gate = gate_with(clock, interactive_ttft_target_ms=1000.0)
    run_batch(gate, 1)
    clock.now += 5
    gate.ended("w", 0)          # batch leaves "w" ...
    clock.now += 0.3
    for _ in range(BatchGate.BASELINE_TTFTS):  # ... 0.3 s ago: a first token of 0.5 s saw it
        assert not gate.observe("w", ttft_s=0.5, share=SHARE)
    assert gate.baseline("w") == (None, None)
    for i in range(BatchGate.BASELINE_TTFTS):  # later ones did not
        clock.now += 1
        gate.observe("w", ttft_s=0.4 + i / 100, share=SHARE)
    assert gate.baseline("w")[0] == p90([0.4 + i / 100 for i in range(10)]) == pytest.approx(0.4 + 8.9 / 100)


def test_the_baseline_follows_a_change_of_load_slowly():
    baseline = LatencyBaseline(window=10, weight=0.25)
    for _ in range(10):
        baseline.add(0.1)
    assert baseline.value == 0.1
    for _ in range(10):  # online load rose: one window moves the baseline a quarter of the way
        baseline.add(0.3)
    assert abs(baseline.value - 0.15) < 1e-9
    for _ in range(8):
        baseline.fold(0.3)
    assert 0.28 < baseline.value < 0.3


def test_a_workers_report_teaches_the_baseline_after_two_seconds_without_batch_and_once_per_window():
    clock = Clock()
    gate = gate_with(clock)
    run_batch(gate, 1)
    gate.ended("w", 0)
    clock.now += 1.0   # the report's 2 s window still held batch: judged against the target
    gate.reported("w", ttft_ms=0, itl_ms=300, share=SHARE)
    assert gate.cuts == 1 and gate.baseline("w") == (None, None)
    clock.now += 2.0
    gate.reported("w", ttft_ms=400, itl_ms=300, share=SHARE)
    gate.reported("w", ttft_ms=900, itl_ms=900, share=SHARE)   # the next Load, same window: once
    assert gate.baseline("w") == (0.4, 0.3) and gate.cuts == 1


def routed(address: str, **classes):
    config = RouterConfig(load_poll_interval_s=0.1, health_poll_interval_s=0.2, classes=ServiceClassConfig(**classes))
    return started_router([address], config)


async def test_a_router_learns_a_workers_latency_from_interactive_streams_without_batch(mock_worker_factory):
    # No batch anywhere: interactive streams were not watched at all before relative targets.
    worker = await mock_worker_factory.start(max_num_seqs=8, mock_tokens_per_s=100, mock_ttft_ms=1)
    async with routed(worker.address) as router:
        # One 40-token answer's gaps fill a window (30 gaps); on a loaded machine the client may
        # fold tokens that wait into one chunk, leaving fewer gaps: then another answer adds more.
        for number in range(10):
            request = build_request(f"chat-{number}", [GenerateInput(text="question")], SamplingParams(max_tokens=40))
            async with router.stream(request) as stream:
                async for _ in stream:
                    pass
            _, itl = router._batch.baseline(worker.address)
            if itl is not None:
                break
        assert itl is not None and 0 < itl < 1.0
