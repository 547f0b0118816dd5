"""The class scheduler's step preparation (worker/engines/class_scheduler.py) on the installed vLLM's
own Request, priority queue and `_preempt_request`, with no engine: the scheduler is made without
vLLM's __init__ (which needs a model's KV-cache config) and given the state a step reads, KV
blocks stood in by a recorder. The same file runs against vLLM 0.26's sources
(PYTHONPATH=<an unpacked 0.26 wheel>), where these privates differ from 0.32's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from vllm_fleet.worker.engines.class_scheduler import ClassScheduler  # noqa: E402
from vllm_fleet.worker.engines.step_governor import StepGovernor  # noqa: E402


class FreedBlocks:
    def __init__(self) -> None:
        self.freed: list[str] = []

    def free(self, request: Request) -> None:
        self.freed.append(request.request_id)


def _scheduler(max_seqs: int, budget: int = 2048, interactive_slots: int = 0) -> ClassScheduler:
    scheduler = object.__new__(ClassScheduler)
    scheduler.__dict__.update(
        policy=SchedulingPolicy.PRIORITY, waiting=create_request_queue(SchedulingPolicy.PRIORITY), running=[],
        max_num_running_reqs=max_seqs, max_num_scheduled_tokens=budget, num_waiting_for_streaming_input=0,
        batch_priority=100, interactive_slots=interactive_slots, batch_step_tokens=64, batch_solo_step_tokens=512, _by_class=True,
        _batch_arrived=False, _steps_since_check=0,
        _admission_limit="max_num_active_reqs" if _is_032() else "max_num_running_reqs",
        kv_cache_manager=FreedBlocks(), encoder_cache_manager=SimpleNamespace(free=lambda request: None),
        defer_block_free=False, _inflight_prefills=set(), log_stats=False, reset_preempted_req_ids=set(),
        aux_output_connector=None, requires_kv_delivery=False, _governor=None, _step_interactive_ids=(),
        _steps_timed={}, _last_step_end=0.0, _decode_turn=0, current_step=0)
    if _is_032():
        scheduler.max_num_active_reqs = max_seqs
        scheduler.requires_kv_delivery = False
    else:
        del scheduler.requires_kv_delivery
    return scheduler


def _is_032() -> bool:
    from vllm.v1.core.sched.scheduler import Scheduler

    return hasattr(Scheduler, "_request_blocks_can_be_freed")


def _request(request_id: str, priority: int, arrival: float, prompt: int = 20, outputs: int = 0) -> Request:
    request = Request(request_id, list(range(prompt)), SamplingParams(max_tokens=100), None,
                      arrival_time=arrival, priority=priority)
    for token in range(outputs):
        request.append_output_token_ids(1000 + token)
    return request


def _running(scheduler: ClassScheduler, request: Request, *, through_add_request: bool = True) -> Request:
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = request.num_tokens - 1 if request.num_output_tokens else 0
    scheduler.running.append(request)
    if through_add_request:  # as vLLM's add_request would have told the scheduler
        scheduler._note_arrival(request)
    return request


def test_a_full_batch_gives_a_slot_to_a_waiting_interactive_request_and_keeps_its_tokens():
    scheduler = _scheduler(max_seqs=2)
    early = _running(scheduler, _request("batch-early", 100, 1.0, outputs=30))
    late = _running(scheduler, _request("batch-late", 100, 2.0, outputs=30))
    scheduler.waiting.add_request(_request("chat", 0, 3.0))

    scheduler._prepare_step(2, 2048)

    assert scheduler.running == [early]                 # the latest batch gives way, as vLLM picks its victims
    assert late.status == RequestStatus.PREEMPTED and late.num_computed_tokens == 0
    assert list(late.output_token_ids) == [1000 + t for t in range(30)]   # resumes after its 30 tokens, none lost
    assert late.num_preemptions == 1 and "batch-late" in scheduler.reset_preempted_req_ids
    assert scheduler.kv_cache_manager.freed == ["batch-late"]
    assert [r.request_id for r in scheduler.waiting] == ["chat", "batch-late"]   # before later batch, after chat
    assert scheduler._admission_cap(2) == 2             # the interactive request may take the slot


def test_interactive_is_never_preempted_and_nothing_happens_while_only_batch_waits():
    scheduler = _scheduler(max_seqs=2)
    chat = _running(scheduler, _request("chat-1", 0, 1.0, outputs=3))
    batch = _running(scheduler, _request("batch", 100, 2.0, outputs=3))
    scheduler.waiting.add_request(_request("batch-2", 100, 3.0))
    scheduler._prepare_step(2, 2048)
    assert scheduler.running == [chat, batch]
    scheduler.waiting.add_request(_request("chat-2", 0, 4.0))
    scheduler.waiting.add_request(_request("chat-3", 0, 5.0))
    scheduler._prepare_step(2, 2048)
    assert scheduler.running == [chat]                  # batch went; chat-1 stays though chat-3 waits too


def test_running_interactive_requests_take_the_steps_tokens_first():
    scheduler = _scheduler(max_seqs=4)
    batch = _running(scheduler, _request("batch", 100, 1.0, prompt=1500), through_add_request=False)   # a long prefill
    chat = _running(scheduler, _request("chat", 0, 2.0, outputs=2))
    scheduler._prepare_step(4, 2048)
    assert scheduler.running == [batch, chat]   # no batch request has arrived through add_request yet
    scheduler._note_arrival(batch)
    scheduler._prepare_step(4, 2048)
    assert scheduler.running == [chat, batch]


def test_batch_is_admitted_only_while_the_interactive_slots_stay_free():
    scheduler = _scheduler(max_seqs=16, interactive_slots=2)
    for number in range(10):
        _running(scheduler, _request(f"batch-{number}", 100, float(number), outputs=1))
    scheduler.waiting.add_request(_request("batch-next", 100, 20.0))
    assert scheduler._admission_cap(16) == 14
    scheduler.waiting.add_request(_request("chat", 0, 21.0))
    assert scheduler._admission_cap(16) == 16


def test_beside_interactive_work_batch_decodes_go_before_batch_prefills_and_prefill_is_capped():
    scheduler = _scheduler(max_seqs=8, budget=2048)
    prefill = _running(scheduler, _request("batch-prefill", 100, 1.0, prompt=1500))
    decodes = [_running(scheduler, _request(f"batch-decode-{n}", 100, 2.0 + n, outputs=2)) for n in range(3)]
    scheduler._note_arrival(prefill)
    assert scheduler._prepare_step(8, 2048) == 3 + 512       # batch alone: its decodes and 512 of prefill
    chat = _running(scheduler, _request("chat", 0, 9.0, outputs=2))
    chat.num_computed_tokens = chat.num_tokens - 1
    assert scheduler._prepare_step(8, 2048) == 1 + 3 + 64    # chat's decode, three batch decodes, 64 of prefill
    assert scheduler.running == [chat, *decodes, prefill]


def test_a_waiting_prompt_is_not_left_behind_a_batch_prefill_by_the_cap():
    """The capped budget has room for the waiting prompt, but vLLM gives running requests their
    tokens before admitting waiting ones: a running batch prefill would take that room, step after
    step. It gives way (its computed blocks stay in the prefix cache) and resumes behind the prompt."""
    scheduler = _scheduler(max_seqs=8, budget=2048)
    prefill = _running(scheduler, _request("batch-prefill", 100, 1.0, prompt=1500))
    decodes = [_running(scheduler, _request(f"batch-decode-{n}", 100, 2.0 + n, outputs=2)) for n in range(3)]
    scheduler.waiting.add_request(_request("chat-new", 0, 10.0, prompt=300))
    assert scheduler._prepare_step(8, 2048) == 300 + 3 + 64  # the prompt, three batch decodes, 64 of prefill
    assert scheduler.running == decodes                      # the decodes keep their token
    assert prefill.status == RequestStatus.PREEMPTED
    assert [r.request_id for r in scheduler.waiting] == ["chat-new", "batch-prefill"]


def test_a_worker_never_sent_batch_does_not_describe_its_steps(monkeypatch):
    """Under load nearly every step starts with interactive requests waiting; on a worker that has
    never been sent batch the scheduler must not build a step description (one record per running
    request) only to find nothing to preempt: that cost lands on every step of the engine."""
    import vllm_fleet.worker.engines.class_scheduler as class_scheduler

    def described(*args, **kwargs):
        raise AssertionError("the step was described on a worker with no batch")

    monkeypatch.setattr(class_scheduler, "Step", described)
    scheduler = _scheduler(max_seqs=2)
    for number in range(2):
        _running(scheduler, _request(f"chat-{number}", 0, float(number), outputs=3))
    scheduler.waiting.add_request(_request("chat-next", 0, 5.0))
    assert scheduler._prepare_step(2, 2048) == 2048 and scheduler._admission_cap(2) == 2
    assert len(scheduler.running) == 2 and [r.request_id for r in scheduler.waiting] == ["chat-next"]


def test_once_every_batch_request_is_gone_the_steps_cost_nothing_again():
    from vllm_fleet.worker.engines.class_scheduler import BATCH_CHECK_STEPS

    scheduler = _scheduler(max_seqs=4)
    batch = _running(scheduler, _request("batch", 100, 1.0, outputs=2))
    for _ in range(BATCH_CHECK_STEPS):
        scheduler._forget_batch_once_gone()
    assert scheduler._batch_arrived                 # batch still runs
    scheduler.running.remove(batch)
    scheduler.waiting.add_request(batch)            # preempted: still to come
    for _ in range(BATCH_CHECK_STEPS):
        scheduler._forget_batch_once_gone()
    assert scheduler._batch_arrived
    scheduler.waiting.remove_request(batch)         # finished
    for _ in range(BATCH_CHECK_STEPS):
        scheduler._forget_batch_once_gone()
    assert not scheduler._batch_arrived


def _governed(scheduler: ClassScheduler, allowance: int) -> StepGovernor:
    governor = StepGovernor(1.1, ceiling=64)
    governor.clean_steps, governor.baseline_s, governor.allowance = 4, 0.01, allowance
    scheduler._governor = governor
    return governor


def _held(scheduler: ClassScheduler, requests: list[Request]) -> list[str]:
    """The requests vLLM's running loop skips in the step about to begin (it counts the step up first)."""
    return [r.request_id for r in requests if scheduler.current_step + 1 < r.next_decode_eligible_step]


def test_a_governed_step_carries_only_the_allowance_of_batch_and_the_decodes_take_turns():
    scheduler = _scheduler(max_seqs=8)
    decodes = [_running(scheduler, _request(f"batch-decode-{n}", 100, float(n), outputs=2)) for n in range(4)]
    prefill = _running(scheduler, _request("batch-prefill", 100, 5.0, prompt=1500))
    chat = _running(scheduler, _request("chat", 0, 9.0, outputs=2))
    governor = _governed(scheduler, allowance=2)
    assert scheduler._prepare_step(8, 2048) == 1 + 2        # chat's decode and two batch decodes
    assert scheduler.running == [chat, *decodes, prefill]
    assert _held(scheduler, decodes + [prefill]) == ["batch-decode-2", "batch-decode-3", "batch-prefill"]
    scheduler.current_step += 1                            # vLLM's step ran
    assert scheduler._prepare_step(8, 2048) == 1 + 2
    assert _held(scheduler, decodes + [prefill]) == ["batch-decode-0", "batch-decode-1", "batch-prefill"]
    scheduler.current_step += 1
    governor.allowance = 4 + 20
    assert scheduler._prepare_step(8, 2048) == 1 + 4 + 20   # every decode, and 20 tokens of the prefill
    assert _held(scheduler, decodes + [prefill]) == [] and scheduler._step_interactive_ids == ("chat",)


def test_a_governed_step_admitting_an_interactive_prompt_lets_in_no_batch_prefill():
    scheduler = _scheduler(max_seqs=8)
    decodes = [_running(scheduler, _request(f"batch-decode-{n}", 100, float(n), outputs=2)) for n in range(2)]
    prefill = _running(scheduler, _request("batch-prefill", 100, 5.0, prompt=1500))
    _running(scheduler, _request("chat", 0, 9.0, outputs=2))
    scheduler.waiting.add_request(_request("chat-new", 0, 10.0, prompt=30))
    _governed(scheduler, allowance=40)
    assert scheduler._prepare_step(8, 2048) == 1 + 30 + 2   # chat, the prompt, both batch decodes
    assert _held(scheduler, decodes + [prefill]) == ["batch-prefill"]
    assert prefill.status == RequestStatus.RUNNING         # sits the step out: nothing to preempt for
    assert set(scheduler._step_interactive_ids) == {"chat", "chat-new"}


def test_the_governor_is_told_each_steps_duration_and_its_interactive_and_batch_tokens(monkeypatch):
    import vllm_fleet.worker.engines.class_scheduler as class_scheduler

    scheduler = _scheduler(max_seqs=8)
    told = []
    scheduler._governor = SimpleNamespace(step_done=lambda *args: told.append(args))
    clock = iter([10.0, 10.5])
    monkeypatch.setattr(class_scheduler.time, "monotonic", lambda: next(clock))
    output = SimpleNamespace(num_scheduled_tokens={"chat": 1, "batch": 7}, total_num_scheduled_tokens=8)
    scheduler._steps_timed[id(output)] = (9.9, ("chat",))
    scheduler._last_step_end = 9.8
    scheduler._time_step(output)        # scheduled at 9.9, after the previous step ended: ran 0.1 s
    assert told == [(pytest.approx(0.1), 1, 7)]
    later = SimpleNamespace(num_scheduled_tokens={"chat": 1}, total_num_scheduled_tokens=1)
    scheduler._steps_timed[id(later)] = (9.95, ("chat",))
    scheduler._time_step(later)         # scheduled while the first ran (async): runs from its end
    assert told[1] == (pytest.approx(0.5), 1, 0) and not scheduler._steps_timed
