"""vLLM's v1 scheduler with room kept for interactive requests (#52). The worker passes it to
vLLM as `scheduler_cls` (a dotted path: vLLM's EngineCore builds it in its own process), beside
`scheduling_policy=priority`; no fork, no patch.

Why vLLM's priority policy alone is not enough:
- with `max_num_seqs` requests running, a waiting request is not admitted whatever its priority,
  and vLLM preempts only when KV blocks run out (vLLM issue #40004), so an interactive request
  waits behind a full batch until a batch request ends;
- running requests take the step's tokens in list order, so batch prefills ahead of an
  interactive request can take the budget its decode or prefill needed.

So before each of vLLM's own steps this scheduler (1) preempts running batch requests for waiting
interactive ones (class_policy.py decides which) through vLLM's own `_preempt_request`: each goes
back to the waiting queue with its tokens, keeps its place by (priority, arrival), and resumes
where it stopped, its computed blocks found again in the prefix cache where they survive;
(2) puts interactive requests first in the running list, then batch decodes, then batch
prefills, so tokens are taken in that order; (3) while interactive requests run or wait, caps the
step's batch prefill at `batch_step_tokens` (a step lasts as long as its prefill, and each
interactive decode waits for the whole step), and a step of batch alone at `batch_solo_step_tokens`
of prefill (an interactive prompt arriving mid-step waits for it); (4) while only batch waits, admits it only while
`interactive_slots` slots stay free; (5) unless `batch_slowdown_target` is null, holds each step's batch
tokens beside running interactive work to what keeps the step within that many times a step without
batch, learnt from the steps' own durations (step_governor.py). Interactive requests are never
preempted by it.

Settings come from vLLM's `additional_config` (it travels to the EngineCore process with the
config): `{"vllm_fleet_classes": {"batch_priority": 100, "interactive_slots": 8,
"batch_step_tokens": 256, "batch_solo_step_tokens": 2048, "batch_slowdown_target": 1.1,
"batch_slowdown_basis": "mean"}}` (null for the target: no step governor; "tail" for the basis: the
governor holds the tail of the steps, not their mean, step_governor.py).

vLLM 0.26 and 0.32 differ where this touches them, and both are handled: 0.32 admits up to
`max_num_active_reqs` and 0.26 up to `max_num_running_reqs`; 0.32's `_preempt_request` takes
`drop_stale_output` (given as 0.32's own KV-pressure path gives it) and 0.26's does not; 0.32
frees some blocks late (`_request_blocks_can_be_freed`), 0.26 has no such check. With async
scheduling on (vLLM's default on GPU) vLLM uses its AsyncScheduler, so this class builds its
async twin then, as vLLM's DiffusionAsyncScheduler does.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from vllm_fleet.worker.engines.class_policy import (
    BATCH_PRIORITY,
    Running,
    Step,
    batch_admission_cap,
    batch_to_preempt,
    default_solo_step_tokens,
    is_batch,
    may_need_preemption,
    step_token_budget,
)
from vllm_fleet.worker.engines.step_governor import StepGovernor, slowdown_basis, slowdown_target
from vllm_fleet.worker.engines.vllm_args import on_cpu

logger = logging.getLogger(__name__)

SETTINGS_KEY = "vllm_fleet_classes"
BATCH_CHECK_STEPS = 256   # steps between looks for whether any batch request is left
# Where vLLM keeps requests that wait but cannot be admitted yet (0.26: skipped_waiting; 0.32:
# kv_holding_waiting, deferred_waiting): a batch request there is still batch to come.
_OTHER_WAITING = ("skipped_waiting", "kv_holding_waiting", "deferred_waiting")
_READY = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class ClassScheduler(Scheduler):
    def __new__(cls, *args: Any, **kwargs: Any) -> ClassScheduler:
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        if cls is ClassScheduler and vllm_config.scheduler_config.async_scheduling:
            cls = AsyncClassScheduler  # Python then runs its __init__ with the same arguments
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = (self.vllm_config.additional_config or {}).get(SETTINGS_KEY, {})
        self.batch_priority = int(settings.get("batch_priority", BATCH_PRIORITY))
        # One slot in 16 by default: none below 16 sequences, 64 of vLLM's 1,024 on a GPU.
        self.interactive_slots = int(settings.get("interactive_slots", self.max_num_running_reqs // 16))
        # 1/32 of the step by default: 256 of an 8,192-token GPU step. On an 8B H100 engine a full
        # step of batch prefill made online's ITL P99 7.6x its own (benchmarks/RESULTS.md, #52).
        self.batch_step_tokens = int(settings.get("batch_step_tokens", max(16, self.max_num_scheduled_tokens // 32)))
        # By default a quarter of a GPU step (2,048 of 8,192), twice batch_step_tokens on CPU
        # (class_policy.default_solo_step_tokens says why).
        self.batch_solo_step_tokens = int(settings.get("batch_solo_step_tokens", default_solo_step_tokens(
            self.max_num_scheduled_tokens, self.batch_step_tokens, on_cpu())))
        target = slowdown_target(settings)
        basis = slowdown_basis(settings)
        self._governor = None if target is None else StepGovernor(
            float(target), ceiling=self.max_num_running_reqs + self.batch_step_tokens, basis=basis)
        self._step_interactive_ids: tuple[str, ...] = ()
        self._steps_timed: dict[int, tuple[float, tuple[str, ...]]] = {}  # id(scheduler output) -> (start, interactive ids)
        self._last_step_end = 0.0
        self._decode_turn = 0   # where the batch decodes' turns start when not all of them fit a step
        self._admission_limit = (
            "max_num_active_reqs" if hasattr(self, "max_num_active_reqs") else "max_num_running_reqs")  # 0.32 | 0.26
        self._by_class = self.policy == SchedulingPolicy.PRIORITY
        self._batch_arrived = False   # until then no running list needs reordering
        self._steps_since_check = 0
        if not self._by_class:
            logger.warning("class scheduler: scheduling policy is %s, not priority: it schedules as vLLM does",
                           self.policy.value)
        held = "no limit of" if target is None else f"{float(target):g}x"
        logger.info("class scheduler (%s): batch is priority >= %d, %d interactive slot(s) of %d, batch prefill "
                    "<= %d tokens a step beside interactive and %d alone, steps with batch held to %s a step "
                    "without (by their %s)", type(self).__name__, self.batch_priority, self.interactive_slots,
                    self.max_num_running_reqs, self.batch_step_tokens, self.batch_solo_step_tokens, held, basis)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if not self._by_class:
            return super().schedule(*args, **kwargs)
        self._forget_batch_once_gone()
        if not self._batch_arrived:  # a worker never sent batch: vLLM's own step, nothing added to it
            return super().schedule(*args, **kwargs)
        limit, budget = getattr(self, self._admission_limit), self.max_num_scheduled_tokens
        step_budget = self._prepare_step(limit, budget)
        setattr(self, self._admission_limit, self._admission_cap(limit))
        self.max_num_scheduled_tokens = step_budget
        started = time.monotonic()
        try:
            output = super().schedule(*args, **kwargs)
        finally:
            setattr(self, self._admission_limit, limit)
            self.max_num_scheduled_tokens = budget
        if self._governor is not None:
            self._steps_timed[id(output)] = (started, self._step_interactive_ids)
            while len(self._steps_timed) > 16:   # an output never given back (none seen; kept bounded)
                del self._steps_timed[next(iter(self._steps_timed))]
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        if self._governor is not None:
            self._time_step(scheduler_output)
        return super().update_from_output(scheduler_output, model_runner_output)

    def _time_step(self, scheduler_output: Any) -> None:
        """Tell the governor how long the step ran and what it carried. A step runs from when it
        was scheduled or the previous one ended, whichever is later: with async scheduling the next
        step is scheduled while this one runs."""
        now = time.monotonic()
        started, interactive_ids = self._steps_timed.pop(id(scheduler_output), (None, ()))
        previous_end, self._last_step_end = self._last_step_end, now
        if started is None:
            return
        scheduled = scheduler_output.num_scheduled_tokens
        interactive = sum(scheduled.get(request_id, 0) for request_id in interactive_ids)
        self._governor.step_done(now - max(started, previous_end), interactive,
                                 scheduler_output.total_num_scheduled_tokens - interactive)

    def add_request(self, request: Request, *args: Any, **kwargs: Any) -> None:
        self._note_arrival(request)
        super().add_request(request, *args, **kwargs)

    def _note_arrival(self, request: Request) -> None:
        self._batch_arrived = self._batch_arrived or is_batch(request.priority, self.batch_priority)

    def _forget_batch_once_gone(self) -> None:
        """Every BATCH_CHECK_STEPS steps while batch has come: if none is left in any queue, the
        steps go back to costing nothing (a nightly job must not tax the day's online traffic)."""
        if not self._batch_arrived:
            return
        self._steps_since_check += 1
        if self._steps_since_check < BATCH_CHECK_STEPS:
            return
        self._steps_since_check = 0
        queues = [self.running, self.waiting, *(getattr(self, name) for name in _OTHER_WAITING if hasattr(self, name))]
        self._batch_arrived = any(is_batch(r.priority, self.batch_priority) for queue in queues for r in queue)

    def _prepare_step(self, limit: int, budget: int) -> int:
        """Before vLLM's step, in one pass over the running requests: the step's token budget
        (batch prefill capped beside interactive work), batch preempted for waiting interactive
        requests, and the running list ordered interactive, batch decodes, batch prefills (vLLM's
        running loop gives tokens in list order, so a batch prefill ahead of a decode would take
        the budget it needs). Returns the step's budget. A worker never sent batch pays nothing:
        this runs on every step of the engine's hot path."""
        if not self._batch_arrived:
            return budget
        ranked: list[tuple[int, Request, int]] = []  # (0 interactive | 1 batch decode | 2 batch prefill, request, tokens due)
        interactive_due = batch_decodes = running_due = 0
        batch_priority = self.batch_priority
        for request in self.running:
            due = _tokens_due(request)
            running_due += due
            if request.priority < batch_priority:  # is_batch, inlined: ~1 µs a request counts here
                rank, interactive_due = 0, interactive_due + due
            elif due == 1:
                rank, batch_decodes = 1, batch_decodes + 1
            else:
                rank = 2
            ranked.append((rank, request, due))
        waiting = self._waiting_interactive()
        waiting_tokens = [r.num_tokens - r.num_computed_tokens for r in waiting]
        step_budget = step_token_budget(budget, interactive_due + sum(waiting_tokens), batch_decodes,
                                        self.batch_step_tokens, self.batch_solo_step_tokens)
        if self._governor is not None:
            self._step_interactive_ids = ()
            if interactive_due or waiting:   # else nothing to protect: no extra pass over the running list
                self._step_interactive_ids = tuple(
                    [r.request_id for rank, r, _ in ranked if rank == 0] + [r.request_id for r in waiting])
                ranked, batch_tokens = self._hold_back_batch(ranked, self._governor.next_allowance(), bool(waiting))
                step_budget = min(step_budget, interactive_due + sum(waiting_tokens) + batch_tokens)
                running_due = interactive_due + batch_tokens
        free_slots = max(0, limit - len(self.running) - self.num_waiting_for_streaming_input)
        if may_need_preemption(free_slots, waiting_tokens, step_budget, running_due, interactive_due):
            preempted = self._give_way_to_interactive(ranked, waiting_tokens, free_slots, step_budget)
            ranked = [item for item in ranked if item[1].request_id not in preempted]
        ranked.sort(key=lambda item: item[0])  # stable: vLLM's own order within each rank
        self.running[:] = [request for _, request, _ in ranked]
        return step_budget

    def _hold_back_batch(self, ranked: list[tuple[int, Request, int]], allowance: int,
                         prompt_waits: bool) -> tuple[list[tuple[int, Request, int]], int]:
        """Let `allowance` batch tokens into the step (the governor's, step_governor.py): batch
        decodes first, taking turns when not all fit, then batch prefill up to the step cap, none
        of it while an interactive prompt waits (vLLM gives running requests their tokens before it
        admits a waiting one). The rest sit this step out, as vLLM's own schedulers hold a request
        back (`next_decode_eligible_step`; vLLM counts the step up as it begins), keeping their
        slots and blocks. Returns the ranking with 0 tokens due for those, and the batch tokens let in."""
        decodes = [request for rank, request, _ in ranked if rank == 1]
        turn = self._decode_turn % len(decodes) if decodes else 0
        running_decodes = (decodes[turn:] + decodes[:turn])[:allowance]
        self._decode_turn = turn + len(running_decodes)
        let_in = {request.request_id for request in running_decodes}
        batch_tokens = len(running_decodes)
        room = 0 if prompt_waits else min(allowance - batch_tokens, self.batch_step_tokens)
        for rank, request, due in ranked:
            if rank == 2 and room > 0:
                let_in.add(request.request_id)
                batch_tokens += min(due, room)
                room -= min(due, room)
        held = []
        for rank, request, due in ranked:
            if rank and request.request_id not in let_in:
                request.next_decode_eligible_step = max(request.next_decode_eligible_step, self.current_step + 2)
                due = 0
            held.append((rank, request, due))
        return held, batch_tokens

    def _waiting_interactive(self) -> list[Request]:
        """The ready interactive requests vLLM will admit first (the priority queue yields them in
        order, before any batch), as many as there are slots. The common case, nothing interactive
        waiting, costs one look at the queue's head."""
        if not self.waiting or is_batch(self.waiting.peek_request().priority, self.batch_priority):
            return []
        head = itertools.takewhile(lambda r: not is_batch(r.priority, self.batch_priority), self.waiting)
        return [r for r in itertools.islice(head, self.max_num_running_reqs) if r.status in _READY]

    def _give_way_to_interactive(self, ranked: list[tuple[int, Request, int]], waiting_tokens: list[int],
                                 free_slots: int, step_budget: int) -> set[str]:
        """Preempt the running batch requests class_policy picks for the waiting interactive ones,
        judged against this step's (capped) budget: a batch prefill that would take the tokens a
        waiting prompt needs gives way, else the prompt would wait behind it step after step.
        Returns the ids preempted."""
        step = Step(
            running=tuple(Running(r.request_id, r.priority, r.arrival_time, due) for _, r, due in ranked),
            waiting_interactive_tokens=tuple(waiting_tokens),
            free_slots=free_slots,
            token_budget=step_budget)
        victims = set(batch_to_preempt(step, self.batch_priority))
        if not victims:
            return set()
        now = time.monotonic()
        # As vLLM's own KV-pressure path preempts (0.32 passes whether stale output is dropped).
        extra = {"drop_stale_output": self.requires_kv_delivery} if hasattr(self, "requires_kv_delivery") else {}
        preempted = set()
        for request in [r for _, r, _ in ranked if r.request_id in victims]:
            can_free = getattr(self, "_request_blocks_can_be_freed", None)
            if can_free is not None and not can_free(request):
                continue
            self.running.remove(request)
            self._preempt_request(request, now, **extra)
            preempted.add(request.request_id)
            logger.debug("class scheduler: batch %s preempted for %d waiting interactive request(s)",
                         request.request_id, len(waiting_tokens))
        return preempted

    def _admission_cap(self, limit: int) -> int:
        if not self._batch_arrived:
            return limit   # no batch has come: nothing to hold slots back from
        if self.waiting and not is_batch(self.waiting.peek_request().priority, self.batch_priority):
            return limit   # interactive is next in the queue: every slot is open to it
        occupied = len(self.running) + self.num_waiting_for_streaming_input
        return batch_admission_cap(limit, self.interactive_slots, occupied)


class AsyncClassScheduler(ClassScheduler, AsyncScheduler):
    """The same, for async scheduling (vLLM's default on GPU)."""


def _tokens_due(request: Request) -> int:
    """The tokens vLLM's running loop would give the request this step, before its caps."""
    return max(1, request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens)
