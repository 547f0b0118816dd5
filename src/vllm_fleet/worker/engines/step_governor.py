"""How many batch tokens an engine step may carry beside interactive work, learnt from the engine's
own step times (#52). The class scheduler (class_scheduler.py) asks it before each step and tells it
how long each step took; it is pure (no vLLM, no clock), so its rules are tables in tests.

Why in the engine: every interactive stream waits for the whole step, so a step's duration *is* the
inter-token latency batch adds. The router's latency controller sees that only through its streams,
judged over 1-2 s windows, and can only change how many batch requests it sends; the engine times
every step and decides every step's tokens, so it can hold steps with batch to a slowdown target and
move within a few steps (tens of milliseconds on a GPU) when the interactive load moves.

How: a step is *clean* when it carried interactive tokens and no batch token, *mixed* when it carried
both; a step without interactive tokens is not judged (nothing to protect). Every `probe_every`-th
step with interactive work is kept clean (allowance 0), so the baseline follows the interactive load
as it changes. After each `window` mixed steps their mean duration is compared with the clean steps'
running mean: over `slowdown` times it, the allowance halves; within it, the allowance grows by a
sixteenth of `ceiling`. Halving backs off within one window; growing by small steps approaches the
level that interfered one step at a time (as TCP's congestion avoidance does). The allowance never
falls below `floor` (one batch decode a step by default): mixed steps must keep coming for the
allowance to be judged again, and batch keeps moving, however slowly.

What a step is judged by (`basis`): "mean" (the default) holds the mixed steps' mean to `slowdown`
times the clean steps' running mean, so the typical online token slows by at most that much.
"tail" holds each window's longest mixed step (of 8: about its 90th percentile) to `slowdown` times
the 90th percentile of the last 64 clean steps. On an 8B engine with an H100 to itself the mean
basis let batch take only 22-37% of the idle capacity while online's ITL P99 stayed under its own
(benchmarks/RESULTS.md, #52): online's P99 is set by the clean steps that prefill a new prompt,
which batch never enters, so steps with batch decodes may be far longer than the mean clean step
and still not reach it. The tail basis trades online's typical token time for batch throughput,
holding only the tail that #52's targets name. Measured, it does that on CPU engines; on the H100
it was stricter than the mean (batch ~15%): there a window's longest mixed step is one that also
prefills, while the clean steps' 90th percentile is mostly decodes (RESULTS.md, 2026-12-07).

What it cannot do: with two engines on one GPU each one's clean steps run beside the other's batch,
so its baseline already carries the other's load.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet.latency_stats import p90

PROBE_EVERY = 8       # one step in eight with interactive work is clean: batch keeps 7/8 of them
WINDOW = 8            # mixed steps per judgement: a few tens of milliseconds on a GPU
BASELINE_STEPS = 4    # clean steps seen before batch is let in beside interactive work
SMOOTHING = 0.2       # weight of the newest clean step in the baseline's running mean
# The router's own default slowdown target (interactive_slowdown_target): batch may make
# interactive work at most 10% slower. On a 2-core CPU run the engine held ITL P99 to 1.10x with
# batch at 89% of the idle capacity where the router's cut gave 1.19x at ~40% (benchmarks/RESULTS.md).
DEFAULT_SLOWDOWN_TARGET = 1.1
SETTING = "batch_slowdown_target"
BASIS_SETTING = "batch_slowdown_basis"
BASES = ("mean", "tail")
CLEAN_TAIL_STEPS = 64  # clean steps the tail basis takes its 90th percentile over


def slowdown_target(settings: Mapping[str, Any]) -> float | None:
    """The governor's target from the engine's class settings: the default when not given, None
    (no governor) when given as null."""
    if SETTING not in settings:
        return DEFAULT_SLOWDOWN_TARGET
    value = settings[SETTING]
    return None if value is None else float(value)


def slowdown_basis(settings: Mapping[str, Any]) -> str:
    """What the governor judges a step by ("mean" or "tail", see the module doc)."""
    return str(settings.get(BASIS_SETTING, BASES[0]))


@dataclass
class StepGovernor:
    """The allowance of batch tokens (decodes and prefill together) in a step with interactive work."""

    slowdown: float   # a mixed step may take at most this times a clean one
    ceiling: int      # what the allowance grows to: the step's batch decodes plus its batch prefill cap
    floor: int = 1
    basis: str = BASES[0]
    allowance: int = field(init=False)
    baseline_s: float | None = field(default=None, init=False)
    clean_steps: int = field(default=0, init=False)
    halvings: int = field(default=0, init=False)
    _mixed: list[float] = field(default_factory=list, init=False)
    _clean: deque[float] = field(default_factory=lambda: deque(maxlen=CLEAN_TAIL_STEPS), init=False)
    _steps_with_interactive: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not self.slowdown > 1.0:
            raise ValueError(f"a slowdown target must be above 1.0, got {self.slowdown}")
        if self.ceiling < 1 or not 0 <= self.floor <= self.ceiling:
            raise ValueError(f"need 0 <= floor <= ceiling and ceiling >= 1, got floor {self.floor}, ceiling {self.ceiling}")
        if self.basis not in BASES:
            raise ValueError(f"a slowdown basis must be one of {', '.join(BASES)}, got {self.basis!r}")
        self.allowance = max(self.floor, self.ceiling // 2)

    def next_allowance(self) -> int:
        """Batch tokens the next step with interactive work may carry: 0 while the baseline is being
        learnt and on every probe step."""
        self._steps_with_interactive += 1
        if self.clean_steps < BASELINE_STEPS or self._steps_with_interactive % PROBE_EVERY == 0:
            return 0
        return self.allowance

    def step_done(self, seconds: float, interactive_tokens: int, batch_tokens: int) -> None:
        """A step ended: how long it ran and what it carried."""
        if interactive_tokens <= 0 or seconds <= 0 or not math.isfinite(seconds):
            return
        if batch_tokens <= 0:
            self.clean_steps += 1
            self._clean.append(seconds)
            self.baseline_s = seconds if self.baseline_s is None else (
                (1 - SMOOTHING) * self.baseline_s + SMOOTHING * seconds)
            return
        if self.baseline_s is None:
            return   # nothing to judge against yet
        self._mixed.append(seconds)
        if len(self._mixed) < WINDOW:
            return
        if self.basis == "tail":
            measured, reference = max(self._mixed), p90(list(self._clean))
        else:
            measured, reference = sum(self._mixed) / len(self._mixed), self.baseline_s
        self._mixed.clear()
        if measured > self.slowdown * reference:
            self.allowance = max(self.floor, self.allowance // 2)
            self.halvings += 1
        else:
            self.allowance = min(self.ceiling, self.allowance + max(1, self.ceiling // 16))
