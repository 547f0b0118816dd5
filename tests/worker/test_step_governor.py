"""The step governor's rules (worker/engines/step_governor.py): how many batch tokens an engine step
may carry beside interactive work, from the durations of the steps with and without batch."""

from __future__ import annotations

import pytest

from vllm_fleet.worker.engines.step_governor import (
    BASELINE_STEPS,
    PROBE_EVERY,
    WINDOW,
    StepGovernor,
    slowdown_basis,
)


def _with_baseline(seconds: float = 0.010, **kwargs) -> StepGovernor:
    governor = StepGovernor(1.1, ceiling=320, **kwargs)
    for _ in range(BASELINE_STEPS):
        assert governor.next_allowance() == 0      # learning what a step without batch takes
        governor.step_done(seconds, interactive_tokens=3, batch_tokens=0)
    return governor


def _window(governor: StepGovernor, seconds: float) -> None:
    for _ in range(WINDOW):
        governor.step_done(seconds, interactive_tokens=3, batch_tokens=governor.allowance)


def test_batch_waits_beside_interactive_work_until_a_step_without_it_has_been_timed():
    governor = StepGovernor(1.1, ceiling=320)
    assert governor.next_allowance() == 0
    governor.step_done(0.5, interactive_tokens=0, batch_tokens=300)    # batch alone: nothing to protect
    assert governor.baseline_s is None and governor.next_allowance() == 0
    assert _with_baseline().next_allowance() == 160


def test_slow_mixed_steps_halve_the_allowance_and_steps_within_the_target_grow_it():
    governor = _with_baseline()
    _window(governor, 0.0125)        # 1.25x a clean step: over 1.1x
    assert governor.allowance == 80 and governor.halvings == 1
    _window(governor, 0.0105)        # within
    assert governor.allowance == 80 + 320 // 16
    for _ in range(20):
        _window(governor, 0.0105)
    assert governor.allowance == 320  # never above the ceiling


def test_the_allowance_never_falls_below_the_floor_so_it_can_be_judged_again():
    governor = _with_baseline(floor=1)
    for _ in range(20):
        _window(governor, 0.1)
    assert governor.allowance == 1


def test_every_few_steps_with_interactive_work_stay_clean_so_the_baseline_follows_the_load():
    governor = _with_baseline()
    allowances = [governor.next_allowance() for _ in range(2 * PROBE_EVERY)]
    assert allowances.count(0) == 2
    governor.step_done(0.020, interactive_tokens=9, batch_tokens=0)    # the interactive load grew
    assert governor.baseline_s > 0.010
    _window(governor, 0.0125)        # 1.25x the old baseline, within 1.1x of the new one
    assert governor.halvings == 0


def test_a_window_is_judged_only_when_full():
    governor = _with_baseline()
    for _ in range(WINDOW - 1):
        governor.step_done(0.1, interactive_tokens=3, batch_tokens=5)
    assert governor.allowance == 160


def _online_steps(governor: StepGovernor) -> None:
    """Clean steps as online traffic makes them: decodes (10 ms), and one in eight prefilling a new
    prompt (40 ms); their mean is 13.75 ms, their 90th percentile 40 ms."""
    for step in range(64):
        governor.step_done(0.040 if step % 8 == 0 else 0.010, interactive_tokens=3, batch_tokens=0)


def test_the_tail_basis_lets_batch_lengthen_typical_steps_while_they_stay_under_the_clean_steps_tail():
    # Mixed steps of 25 ms, with one of 30 in each window: 1.9x the mean clean step (the mean basis
    # halves) but under 1.1x the 40-ms prefill steps that set online's ITL P99 (the tail basis grows).
    mixed = [0.025] * (WINDOW - 1) + [0.030]
    by_mean, by_tail = StepGovernor(1.1, ceiling=320), StepGovernor(1.1, ceiling=320, basis="tail")
    for governor in (by_mean, by_tail):
        _online_steps(governor)
        for _ in range(4):
            for seconds in mixed:
                governor.step_done(seconds, interactive_tokens=3, batch_tokens=governor.allowance)
    assert by_mean.allowance == 10 and by_mean.halvings == 4
    assert by_tail.allowance == 160 + 4 * 320 // 16 and by_tail.halvings == 0


def test_the_tail_basis_halves_when_a_windows_longest_step_passes_the_clean_steps_tail():
    governor = StepGovernor(1.1, ceiling=320, basis="tail")
    _online_steps(governor)
    for seconds in [0.012] * (WINDOW - 1) + [0.045]:   # one step past 1.1 x 40 ms
        governor.step_done(seconds, interactive_tokens=3, batch_tokens=governor.allowance)
    assert governor.allowance == 80 and governor.halvings == 1


def test_the_basis_is_the_mean_unless_the_settings_say_tail():
    assert slowdown_basis({}) == "mean" and slowdown_basis({"batch_slowdown_basis": "tail"}) == "tail"
    with pytest.raises(ValueError, match="slowdown basis"):
        StepGovernor(1.1, ceiling=64, basis="p99")


@pytest.mark.parametrize("slowdown, ceiling, floor", [(1.0, 64, 1), (0.5, 64, 1), (1.1, 0, 0), (1.1, 64, 65)])
def test_a_target_that_cannot_be_held_is_refused(slowdown, ceiling, floor):
    with pytest.raises(ValueError):
        StepGovernor(slowdown, ceiling=ceiling, floor=floor)
