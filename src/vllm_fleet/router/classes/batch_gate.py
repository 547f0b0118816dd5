"""The batch gate: this router's batch attempts per worker, and the latency controller that caps them.

Which worker may take batch at all, and the service classes' other rules, are in classes/service_class.py;
this module keeps the count of batch attempts per worker, makes them step aside (withdraw or
pause, the two steps classes/service_class.py describes) for interactive work, wakes batch waiting for slack,
and holds the latency controller.

The latency controller: each worker has a cap on this router's batch requests there. With
`latency_control: auto` (the default) it steers only workers whose engine does not govern its own
steps (Info's `batch_slowdown_target` empty: stock or mock engines, or the class scheduler's
governor turned off); where the engine does, it holds every step with batch to that target itself
(worker/engines/step_governor.py), step by step, and a router cutting on 1-2 s windows of its
streams on top of it only took batch away: on a 2-core CPU run the engine alone held online ITL P99
to 1.10x with batch at 89% of the idle capacity, the router's controller to 1.19x at ~40%
(benchmarks/RESULTS.md, #52). The controller below is what stays for the other engines.

* **A miss** is a window (`MISS_WINDOW_S`: 2 s of that worker's interactive first tokens,
  which are fewer, or 1 s of the gaps between its interactive streams' tokens) whose P90 is over the target beyond
  sampling noise: significantly more than a tenth of them over it (latency_stats.py; one
  slow gap among thirty is the P97, which interactive traffic alone shows on a busy engine,
  and a relative target is 1.1x a P90 that a tenth of the samples pass by definition, so
  neither may halve batch). A lone sample over target on a quiet worker still is a miss.
  The worker's own report counts the same way: its Load carries the P90's lower confidence
  bound over its window, which is over target exactly when the samples show a miss.
* **The targets**, with `interactive_targets: absolute`, are `interactive_ttft_target_ms` and
  `interactive_itl_target_ms`. With `relative` (the default) they are
  `interactive_slowdown_target` times the worker's baseline: the P90 of that latency without
  batch there (latency_stats.py). The worker's own, learnt while no batch at all ran on it
  and sent in its Load, comes first: it also serves a router whose batch always runs there
  (a Spark job's). Else this router's, learnt from its own samples and the worker's reports
  in the spells without *its* batch (a cut to cap 0 among them); such samples only teach
  the baseline and never cut: batch is not there to blame. Until a
  worker has a baseline, the absolute targets stand in for it. A null absolute target turns
  that signal off in both modes. Why: an absolute target below what the engine does without
  batch (a slow machine, a big model) holds batch near 0 for slowness it did not cause (the
  GPU run with 60/20 ms targets: batch at 10% of the idle capacity), and one above it lets
  batch slow interactive work up to the target; "with batch no more than 1.1x slower than
  without" is the promise a user can check.
* **Decrease** (at most once per `CUT_EVERY_S`: one slow step must not count many times): the
  cap becomes half of what batch holds there (the cap, or the running count when fewer run:
  halving a cap above what runs would change nothing, as TCP halves its flight size, not an
  unused window). Only the excess over the new cap steps aside, and only the attempts without a
  first token (nothing to redo); running ones end as they would, and no new batch starts there
  until fewer than the cap run. With `pause_batch_on_cut` the newest running ones over the cap
  also pause (they resume later after the tokens they have). That was the default until a CPU
  run of 2026-12-04: a paused request prefills again when it resumes, which on a compute-bound
  engine is more of the interference that caused the cut; the controller cut 501 times and
  paused 439 requests in one Batch API phase (job at 33% of idle capacity), and without
  pausing cut 221 times (62%, online ITL P99 0.82x of alone's). A miss never takes batch
  below its cap.
* **Increase**: each quiet window of `batch_raise_every_s` with no miss doubles the cap
  (from 0: one) up to half the level that missed (TCP's slow-start threshold; the level is
  where the episode of cuts began: cuts in a row, with no quiet window between, keep the
  first one's), then adds one per window up to the worker's batch share. So paused work
  comes back within a few windows once the signals are clean, and the level that
  interfered is approached one request at a time. Doubling straight back to the level that
  missed (the controller before) returned to it within ~2 s, to be cut again: 27 cuts and
  58 pauses in 45 s on the CPU run of 2026-12-03. (Adding a sixteenth of the batch share per
  window instead, for engines with many slots, was measured on the H200 and showed no effect of
  its own: the job's share followed how often the controller cut, 3 to 173 times a phase.)

Why this one: interference between co-running requests is mostly step time (every sequence
in the engine's batch slows every step), which slot counts do not show and which differs by
engine, model and hardware; the interactive streams' own latency measures it directly. The
first version (halve on any single slow sample, withdraw every unstarted request, grow by one
a second) churned on a CPU engine: 54 pauses in 45 s, each resume prefilling again, and 23 s
to come back up after a step. Halving what runs backs off within one observation; stepping
aside only the excess and recovering multiplicatively (as TCP's slow start returns to its
threshold, then probes additively) keeps batch near the level that meets the targets.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
from collections.abc import Callable, Mapping

from vllm_fleet.latency_stats import LatencyBaseline, significant_over
from vllm_fleet.router.classes.service_class import ServiceClassConfig, batch_share, busy, has_room, slots
from vllm_fleet.router.pool.snapshot import WorkerView
from vllm_fleet.router.pool.worker import WorkerState


class BatchGate:
    """This router's batch bookkeeping: how many batch attempts run per worker, which of them
    have no first token yet (and can be withdrawn), a wake-up for batch waiting for slack, and
    the latency controller: a per-worker cap on this router's batch requests, halved on a
    significant interactive latency miss and grown back in quiet windows (the module docstring
    says how and why).

    It follows the pool as a PoolListener (pool/listener.py): each worker's Load brings its own
    latency report (`reported`) and may show slack (`notify`); each snapshot's views get
    `batch_in_flight` from it. `view_of(address)` is the pool's view of a worker now (its batch
    share is judged on it).
    """

    CUT_EVERY_S = 0.5
    BASELINE_TTFTS = 10     # a baseline window: this many first tokens without batch...
    BASELINE_GAPS = 30      # ...or token gaps (about one interactive answer's)
    REPORTED_EVERY_S = 2.0  # the worker's latency window (worker/latency_window.py)
    MISS_WINDOW_S = {"ttft": 2.0, "itl": 1.0}  # the router's own samples are judged over these windows

    def __init__(self, config: ServiceClassConfig | None = None, clock: Callable[[], float] | None = None,
                 *, on_cut: Callable[[str, str, str], None] | None = None,
                 view_of: Callable[[str], WorkerView | None] = lambda address: None) -> None:
        import time

        self.config = config or ServiceClassConfig()
        self._clock = clock or time.monotonic
        # told at each cut: the worker's address, which signal missed ("ttft", "itl" or "both") and
        # whose samples showed it ("router": this router's own, "worker": the worker's report)
        self._on_cut = on_cut
        self._view_of = view_of
        self.running: dict[str, int] = {}
        # Per worker, token → the callable that makes that attempt step aside: before its first
        # token (withdraw) and after it (pause; only attempts that can resume are listed).
        self._withdrawable: dict[str, dict[int, Callable[[], None]]] = {}
        self._pausable: dict[str, dict[int, Callable[[], None]]] = {}
        self._changed = asyncio.Event()
        self.withdrawn = 0
        self.paused = 0
        self.arrival_pauses = 0  # of `paused`, those for an interactive arrival (the rest: the controller's cuts)
        self.cuts = 0
        # address -> (cap, when it was set, where doubling stops); absent: the full share
        self._caps: dict[str, tuple[float, float, float]] = {}
        self._reported_at: dict[str, float] = {}         # address -> when a worker's report last cut
        # (address, "ttft" | "itl") -> the last window's (when, seconds) of the router's own samples
        self._recent: dict[tuple[str, str], collections.deque[tuple[float, float]]] = {}
        # address -> since when no batch of this router runs there (absent: none ever ran)
        self._batch_free_since: dict[str, float] = {}
        # address -> the worker's own (TTFT, ITL) baselines, seconds, from its last Load (None: none)
        self._reported_baselines: dict[str, tuple[float | None, float | None]] = {}
        # address -> baselines of (TTFT, ITL) without this router's batch there (relative targets)
        self._baselines: dict[str, tuple[LatencyBaseline, LatencyBaseline]] = {}
        # workers whose engine holds each step with batch to a slowdown target itself (Info)
        self._engine_governed: set[str] = set()

    def cap(self, address: str, share: int) -> float:
        """The controller's cap on batch requests at `address` now (at most `share`)."""
        state = self._caps.get(address)
        if state is None:
            return float(share)
        cap, since, ceiling = state
        windows = int((self._clock() - since) // self.config.batch_raise_every_s)
        while windows > 0 and cap < share:
            cap = max(1.0, min(cap * 2, ceiling)) if cap < ceiling else cap + 1
            windows -= 1
        return min(float(share), cap)

    def targets(self, address: str) -> tuple[float | None, float | None]:
        """The (TTFT, ITL) targets on `address` now, in seconds; None: that signal is off."""
        config = self.config
        ttft = config.interactive_ttft_target_ms / 1000 if config.interactive_ttft_target_ms is not None else None
        itl = config.interactive_itl_target_ms / 1000 if config.interactive_itl_target_ms is not None else None
        if config.interactive_targets == "relative":
            factor = config.interactive_slowdown_target
            ttft_base, itl_base = self.baseline(address)
            if ttft is not None and ttft_base is not None:
                ttft = factor * ttft_base
            if itl is not None and itl_base is not None:
                itl = factor * itl_base
        return ttft, itl

    def baseline(self, address: str) -> tuple[float | None, float | None]:
        """The (TTFT, ITL) P90s on `address` without batch, in seconds, each the worker's own
        (learnt without any batch there) where it reports one, else this router's (learnt
        without its own batch there); None: neither is known."""
        reported = self._reported_baselines.get(address, (None, None))
        own = self._baselines.get(address)
        learnt = (None, None) if own is None else (own[0].value, own[1].value)
        return reported[0] or learnt[0], reported[1] or learnt[1]

    def _batch_free_for(self, address: str) -> float:
        """How long no batch of this router has run on `address` (0: some runs now)."""
        if self.running.get(address):
            return 0.0
        since = self._batch_free_since.get(address)
        return math.inf if since is None else self._clock() - since

    def _learn(self, address: str, ttft_s: float | None, itl_s: float | None, judged: bool) -> None:
        baselines = self._baselines.get(address)
        if baselines is None:
            baselines = self._baselines[address] = (LatencyBaseline(self.BASELINE_TTFTS),
                                                    LatencyBaseline(self.BASELINE_GAPS))
        for baseline, sample in zip(baselines, (ttft_s, itl_s)):
            if sample is not None:
                (baseline.fold if judged else baseline.add)(sample)

    def _window_miss(self, address: str, signal: str, sample_s: float, target_s: float) -> bool:
        """Whether the router's samples of `signal` on `address` over the last window, this one
        among them, show the P90 over target (latency_stats.py)."""
        now = self._clock()
        recent = self._recent.setdefault((address, signal), collections.deque())
        recent.append((now, sample_s))
        while recent and recent[0][0] < now - self.MISS_WINDOW_S[signal]:
            recent.popleft()
        over = sum(1 for _, value in recent if value > target_s)
        return over >= significant_over(len(recent))

    def observe(self, address: str, *, ttft_s: float | None = None, itl_s: float | None = None,
                share: Callable[[], int], judged: bool = False) -> bool:
        """An interactive request's latency on `address` (`judged`: `ttft_s` and `itl_s` are
        already a window's P90s, as a worker's report is): a miss cuts its batch cap. Whether it
        did. With relative targets, a sample taken while no batch of this router ran there (for
        as long as it covers) teaches that worker's baseline instead."""
        config = self.config
        if self.engine_schedules(address):
            return False   # the engine holds its steps to the target, step by step: nothing to cut here
        if config.interactive_targets == "relative":
            covers = self.REPORTED_EVERY_S if judged else max(ttft_s or 0.0, itl_s or 0.0)
            if self._batch_free_for(address) >= covers:
                self._learn(address, ttft_s, itl_s, judged)
                return False
        ttft_target, itl_target = self.targets(address)
        ttft_miss = itl_miss = False
        if ttft_s is not None and ttft_target is not None:
            ttft_miss = ttft_s > ttft_target if judged else self._window_miss(address, "ttft", ttft_s, ttft_target)
        if itl_s is not None and itl_target is not None:
            itl_miss = itl_s > itl_target if judged else self._window_miss(address, "itl", itl_s, itl_target)
        if not (ttft_miss or itl_miss):
            return False
        now = self._clock()
        previous = self._caps.get(address)
        if previous is not None and now - previous[1] < self.CUT_EVERY_S:
            return False
        running = self.running.get(address, 0)
        level = self.cap(address, share())
        if running:
            level = min(level, running)
        cap = math.floor(level / 2)
        # Doubling stops at half the level that missed, the one the episode started from: a cut
        # before any quiet window (the last cut has not reached the engine's steps yet) keeps
        # the earlier one's.
        ceiling = previous[2] if previous is not None and now - previous[1] < self.config.batch_raise_every_s \
            else max(cap, 1)
        self._caps[address] = (cap, now, ceiling)
        self.cuts += 1
        if self._on_cut is not None:
            signal = "both" if ttft_miss and itl_miss else "ttft" if ttft_miss else "itl"
            self._on_cut(address, signal, "worker" if judged else "router")
        if running > cap:
            # The excess over the new cap steps aside now, so the interactive streams feel the cut
            # at their next step, not when batch answers end; the rest keeps running.
            self.step_aside(address, running - cap, pause=config.preempt_batch and config.pause_batch_on_cut)
        return True

    def reported(self, address: str, *, ttft_ms: float, itl_ms: float, share: Callable[[], int],
                 ttft_floor_ms: float = 0.0, itl_floor_ms: float = 0.0,
                 ttft_baseline_ms: float = 0.0, itl_baseline_ms: float = 0.0) -> None:
        """The worker's own view of its interactive requests' latency (its Load; 0 = none): the
        P90s of its last few seconds, their lower confidence bounds, and its baselines (P90s
        while no batch at all ran there). They steer this router's batch there even when it
        carries no interactive traffic itself, as a Spark executor's router does not. The
        bounds are judged (a bound over target is a miss beyond noise; a worker that sends none
        is judged by its P90s); the P90s teach this router's own baseline. A report covers the
        worker's last few seconds, so one miss is taken at most once per `REPORTED_EVERY_S`:
        the same slow seconds must not cut the cap again with every Load."""
        # The worker's baselines replace what it said before: a restarted worker starts over.
        self._reported_baselines[address] = (ttft_baseline_ms / 1000 or None, itl_baseline_ms / 1000 or None)
        if not (ttft_ms or itl_ms):
            return
        last = self._reported_at.get(address)
        if last is not None and self._clock() - last < self.REPORTED_EVERY_S:
            return
        if self.config.interactive_targets == "relative" and self._batch_free_for(address) >= self.REPORTED_EVERY_S:
            # No batch of this router there for the report's whole window: it teaches, once per window.
            self._learn(address, ttft_ms / 1000 or None, itl_ms / 1000 or None, judged=True)
            self._reported_at[address] = self._clock()
            return
        ttft_judged, itl_judged = ttft_floor_ms or ttft_ms, itl_floor_ms or itl_ms
        if self.observe(address, ttft_s=ttft_judged / 1000 or None, itl_s=itl_judged / 1000 or None,
                        share=share, judged=True):
            self._reported_at[address] = self._clock()

    # --- following the pool (pool/listener.py) -------------------------------------------------

    def joined(self, worker: WorkerState) -> None:
        pass

    def left(self, address: str) -> None:
        self._engine_governed.discard(address)

    def info(self, worker: WorkerState) -> None:
        """An Info came: whether the worker's engine governs its steps (a restarted worker may not)."""
        settings = worker.info.settings if worker.info is not None else {}
        if settings.get("batch_slowdown_target"):
            self._engine_governed.add(worker.address)
        else:
            self._engine_governed.discard(worker.address)

    def loaded(self, worker: WorkerState) -> None:
        """A Load came: the worker's latency report steers its cap, and it may show slack."""
        load, address = worker.load, worker.address
        self.reported(address, ttft_ms=load.interactive_ttft_p90_ms, itl_ms=load.interactive_itl_p90_ms,
                      ttft_floor_ms=load.interactive_ttft_p90_floor_ms, itl_floor_ms=load.interactive_itl_p90_floor_ms,
                      ttft_baseline_ms=load.interactive_ttft_baseline_ms,
                      itl_baseline_ms=load.interactive_itl_baseline_ms, share=lambda: self._share(address))
        self.notify()  # a fresh Load may show slack

    def view_fields(self, address: str) -> Mapping[str, object]:
        return {"batch_in_flight": self.running.get(address, 0)}

    def _share(self, address: str) -> int:
        view = self._view_of(address)
        return batch_share(view, self.config) if view is not None else 0

    @property
    def listening(self) -> bool:
        """Whether interactive latency is worth observing: batch of this router runs somewhere,
        or relative targets learn what latency is without it."""
        return bool(self.running) or self.config.interactive_targets == "relative"

    def engine_schedules(self, address: str) -> bool:
        """Whether `address`'s engine decides batch against interactive work itself, step by step
        (its Info reports a step governor: the class scheduler, worker/engines/class_scheduler.py)
        and this router leaves that to it (`latency_control: auto`)."""
        return self.config.latency_control == "auto" and address in self._engine_governed

    def interactive_arrives(self, view: WorkerView) -> int:
        """An interactive request is going to `view`'s worker: make room if it would wait. With
        requests waiting in the engine, one batch attempt there without a first token is withdrawn
        (cheap: nothing to redo; with free slots, the engine's priority order already puts the
        interactive request first). A running one is paused only when every slot is taken, so the
        interactive request would wait for a batch answer to end. How many stepped aside. None
        where the engine schedules by class: it does both itself, keeping the batch request's place
        and tokens (on one H100 this withdrew 94 of 197 batch requests in 20 s; RESULTS.md, #52)."""
        if (not self.config.withdraw_batch or not view.batch_in_flight or has_room(view)
                or self.engine_schedules(view.address)):
            return 0
        full = busy(view) >= slots(view)
        paused = self.paused
        done = self.step_aside(view.address, 1, pause=full and self.config.preempt_batch)
        self.arrival_pauses += self.paused - paused
        return done

    @property
    def total(self) -> int:
        return sum(self.running.values())

    def notify(self) -> None:
        """Capacity may have freed (a fresh Load, a finished attempt): batch waiting looks again."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, timeout: float | None) -> None:
        """Until `notify()` (or `timeout` seconds)."""
        changed = self._changed
        # asyncio.timeout, not wait_for: on 3.11 wait_for can drop a cancel that lands as the
        # event fires, and a batch request whose caller left would then go on to a worker.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await changed.wait()

    def started(self, address: str, token: int, withdraw: Callable[[], None]) -> None:
        self.running[address] = self.running.get(address, 0) + 1
        self._batch_free_since.pop(address, None)
        self._withdrawable.setdefault(address, {})[token] = withdraw

    def first_token(self, address: str, token: int, pause: Callable[[], None] | None = None) -> None:
        """The attempt has its first token: no longer withdrawable; pausable with `pause` (None:
        it cannot resume elsewhere, e.g. grammar-constrained)."""
        self._withdrawable.get(address, {}).pop(token, None)
        if pause is not None:
            self._pausable.setdefault(address, {})[token] = pause

    def ended(self, address: str, token: int) -> None:
        self._withdrawable.get(address, {}).pop(token, None)
        self._pausable.get(address, {}).pop(token, None)
        left = self.running.get(address, 0) - 1
        if left > 0:
            self.running[address] = left
        else:
            self.running.pop(address, None)
            self._batch_free_since[address] = self._clock()
        self.notify()

    def step_aside(self, address: str, count: int, *, pause: bool) -> int:
        """Make up to `count` batch attempts on `address` step aside: those without a first token
        first, then (`pause`) running ones, which pause; how many."""
        done = self._step_aside(self._withdrawable, address, count)
        self.withdrawn += done
        if done < count and pause:
            paused = self._step_aside(self._pausable, address, count - done)
            self.paused += paused
            done += paused
        return done

    @staticmethod
    def _step_aside(attempts: dict[str, dict[int, Callable[[], None]]], address: str, count: int) -> int:
        listed = attempts.get(address)
        done = 0
        while listed and done < count:
            _, step_aside = listed.popitem()  # the newest: least work done, least to redo
            step_aside()
            done += 1
        return done
