"""A miss is the P90 over target beyond sampling noise: latency batch does not change must not
cut batch, however often one sample in ten passes a target of 1.1x a P90; a real slowdown still
cuts within a second. Pure: a fake clock and seeded samples."""

from __future__ import annotations

import random

from fakes import FakeClock
from vllm_fleet.latency_stats import confident_p90, significant_over
from vllm_fleet.router.classes.batch_gate import BatchGate
from vllm_fleet.router.classes.service_class import ServiceClassConfig

SHARE = lambda: 32  # noqa: E731
GAPS_PER_S, TTFTS_PER_S = 120, 4



def one_second(gate: BatchGate, clock: FakeClock, rng: random.Random, slowdown: float = 1.0) -> bool:
    """A second of interactive traffic on "w": token gaps around 35 ms and first tokens around
    80 ms, log-normal (a tail, as engines have), times `slowdown`; whether any sample cut."""
    cut = False
    for i in range(GAPS_PER_S):
        clock.now += 1 / GAPS_PER_S
        first = i % (GAPS_PER_S // TTFTS_PER_S) == 0
        cut = gate.observe("w", itl_s=slowdown * rng.lognormvariate(-3.35, 0.15),
                           ttft_s=slowdown * rng.lognormvariate(-2.5, 0.3) if first else None, share=SHARE) or cut
    return cut


def learnt_gate(clock: FakeClock, rng: random.Random) -> BatchGate:
    gate = BatchGate(ServiceClassConfig(), clock)  # relative targets, 1.1x
    for _ in range(20):  # no batch yet: the baselines are learnt
        one_second(gate, clock, rng)
    assert None not in gate.baseline("w")
    for token in range(16):
        gate.started("w", token, lambda: None)
    return gate


def test_latency_that_batch_did_not_change_does_not_cut_it():
    clock, rng = FakeClock(), random.Random(7)
    gate = learnt_gate(clock, rng)
    for _ in range(60):  # a minute with batch running and latency exactly as without it
        one_second(gate, clock, rng)
    # A tenth of first tokens pass the P90 and some pass 1.1x it: cutting on single samples
    # (the rule before) cut here every few seconds.
    assert gate.cuts <= 1


def test_a_real_slowdown_still_cuts_within_a_second():
    clock, rng = FakeClock(), random.Random(11)
    gate = learnt_gate(clock, rng)
    assert one_second(gate, clock, rng, slowdown=1.3) and gate.cap("w", 32) < 16


def test_the_workers_lower_bound_gives_the_same_verdict_as_the_count():
    rng = random.Random(3)
    for n in (1, 2, 5, 10, 40, 240):
        samples = [rng.random() for _ in range(n)]
        for target in sorted(samples) + [-1.0, 2.0]:
            over = sum(1 for s in samples if s > target)
            assert (confident_p90(samples) > target) is (over >= significant_over(n)), (n, target)


def test_one_sample_over_target_is_a_miss_and_a_tenth_of_many_is_not():
    assert significant_over(1) == 1
    assert significant_over(100) > 10 and significant_over(100) < 20
