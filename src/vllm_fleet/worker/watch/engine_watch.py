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
  Only prompts held when the silence began (or within `JOIN_STEP_S` after it: the step under way
  may have been scheduled just after the output the worker last noted) count: a request that
  arrives later cannot be in that step, so a stream of new requests arriving at a hung engine
  does not push its detection back (#28; tests/chaos/test_stall_arrivals.py checks it on the real
  engine, benchmarks/stall_arrivals.py measures it against the arrival rate).
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
  uses CPU too, so such a hang is caught at `busy_max_s`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from vllm_fleet.config import WorkerConfig

STEP_WINDOW_S = 30.0   # how far back step times count
SAME_STEP_S = 0.002    # outputs closer than this belong to one engine step
JOIN_STEP_S = 0.25     # a request submitted this soon after the silence began may be in its step
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
        joined_by = self._since + JOIN_STEP_S   # later arrivals cannot be in the step under way
        pending = sum(h.prompt_tokens for h in self._held.values() if not h.produced and h.submitted_at <= joined_by)
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
        late = self._checked_at is not None and now - self._checked_at > interval_s + LATE_TICK_S
        self._checked_at = now
        if not self.enabled or not self._held or late:
            return None
        silent = now - self._since
        bound = self.bound_s()
        if engine_busy:
            bound = max(bound, self.bounds.busy_max_s)
        if silent <= bound:
            return None
        self.stall = Stall(silent_s=silent, bound_s=bound, step_s=self.step_s(), engine_ids=tuple(self._held))
        return self.stall
