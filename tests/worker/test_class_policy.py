"""The class scheduler's decisions (worker/engines/class_policy.py) as tables: which running batch
requests give way to waiting interactive ones, and how far batch is admitted; plus how the worker
asks vLLM for the scheduler (vllm_args.py) and which scheduler vLLM builds from it."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from vllm_fleet.config import EngineConfig
from vllm_fleet.errors import ConfigError
from vllm_fleet.worker.engines.class_policy import (
    Running,
    Step,
    batch_admission_cap,
    batch_to_preempt,
    default_solo_step_tokens,
    may_need_preemption,
    step_token_budget,
)
from vllm_fleet.worker.engines.step_governor import DEFAULT_SLOWDOWN_TARGET, slowdown_target
from vllm_fleet.worker.engines.vllm_args import CLASS_SCHEDULER, engine_kwargs


def _run(name: str, priority: int, arrival: float, due: int = 1) -> Running:
    return Running(name, priority, arrival, due)


B1, B2, B3 = _run("b1", 100, 1.0), _run("b2", 100, 2.0), _run("b3", 150, 0.5)
I1 = _run("i1", 0, 3.0)


@pytest.mark.parametrize("running, waiting, free, expected", [
    # vLLM issue #40004: every slot held by batch, one interactive waits -> one batch gives way,
    # the lowest priority first (b3), then the latest arrival (b2 before b1).
    ((B1, B2, B3), (10,), 0, ["b3"]),
    ((B1, B2), (10,), 0, ["b2"]),
    ((B1, B2), (10, 10), 0, ["b2", "b1"]),
    # a free slot: nobody preempted for it
    ((B1, B2), (10,), 1, []),
    ((B1,), (10, 10), 1, ["b1"]),
    # more interactive waiting than batch runs: all batch, and interactive is never chosen
    ((I1, B1), (10, 10, 10), 0, ["b1"]),
    ((I1,), (10,), 0, []),
    # nothing interactive waits: nothing happens
    ((B1, B2), (), 0, []),
])
def test_slots_go_from_batch_to_waiting_interactive(running, waiting, free, expected):
    step = Step(running=running, waiting_interactive_tokens=waiting, free_slots=free, token_budget=2048)
    assert batch_to_preempt(step) == expected


def test_a_batch_prefill_gives_up_the_tokens_a_waiting_interactive_prompt_needs():
    big, small = _run("big", 100, 1.0, due=1900), _run("small", 100, 2.0, due=100)
    step = Step(running=(big, small, I1), waiting_interactive_tokens=(300,), free_slots=1, token_budget=2048)
    assert batch_to_preempt(step) == ["big"]   # the largest prefill first; 2048 - 101 leaves room for 300


def test_decoding_batch_keeps_its_token_and_a_fitting_prompt_preempts_nothing():
    decoding = tuple(_run(f"d{i}", 100, float(i)) for i in range(10))
    step = Step(running=decoding, waiting_interactive_tokens=(300,), free_slots=2, token_budget=2048)
    assert batch_to_preempt(step) == []
    short = Step(running=decoding, waiting_interactive_tokens=(2045,), free_slots=2, token_budget=2048)
    assert batch_to_preempt(short) == []   # short of tokens, but decodes are never preempted for them


def test_no_tokens_are_freed_when_every_slot_is_interactive():
    big = _run("big", 100, 1.0, due=2000)
    step = Step(running=(I1, big), waiting_interactive_tokens=(300,), free_slots=0, token_budget=2048)
    assert batch_to_preempt(step) == ["big"]     # for its slot
    step = Step(running=(I1, _run("i2", 5, 4.0, due=2000)), waiting_interactive_tokens=(300,), free_slots=0,
                token_budget=2048)
    assert batch_to_preempt(step) == []


def test_the_batch_priority_threshold_is_a_setting():
    step = Step(running=(_run("p10", 10, 1.0),), waiting_interactive_tokens=(5,), free_slots=0, token_budget=64)
    assert batch_to_preempt(step) == []
    assert batch_to_preempt(step, batch_priority=10) == ["p10"]


@pytest.mark.parametrize("max_active, reserved, total, expected", [
    (16, 1, 0, 15),      # batch fills all but the interactive slot
    (16, 1, 15, 15),
    (16, 4, 16, 16),     # already fuller (interactive came first): never below what runs
    (2, 0, 1, 2),        # no slot kept below 16 sequences (the scheduler's default)
])
def test_batch_leaves_the_interactive_slots_free(max_active, reserved, total, expected):
    assert batch_admission_cap(max_active, reserved, total) == expected


def test_the_worker_asks_for_the_class_scheduler_with_priority_scheduling():
    kwargs = engine_kwargs(EngineConfig(), "/m", "m")
    assert kwargs["scheduling_policy"] == "priority" and kwargs["scheduler_cls"] == CLASS_SCHEDULER


@pytest.mark.parametrize("engine_arg", [["scheduler_cls="], ["scheduler_cls=null"], ["scheduling_policy=fcfs"]])
def test_the_class_scheduler_is_off_when_asked_or_without_priority(engine_arg):
    assert "scheduler_cls" not in engine_kwargs(EngineConfig(engine_arg=engine_arg), "/m", "m")


def test_an_operators_scheduler_is_kept():
    kwargs = engine_kwargs(EngineConfig(engine_arg=["scheduler_cls=my.Scheduler"]), "/m", "m")
    assert kwargs["scheduler_cls"] == "my.Scheduler"


@pytest.mark.parametrize("classes, message", [
    ('{"batch_slowdown_target": 0.9}', "batch_slowdown_target must be a number above 1"),
    ('{"batch_step_tokens": "many"}', "batch_step_tokens must be an integer >= 1"),
    ('{"batch_slowdown_basis": "p99"}', 'batch_slowdown_basis must be "mean" or "tail"'),
    ('{"batch_stepp_tokens": 64}', "unknown vllm_fleet_classes setting(s) batch_stepp_tokens"),
    ('[1, 2]', "must be an object"),
])
def test_class_settings_the_scheduler_would_not_honour_are_refused_by_name(classes, message):
    arg = f'additional_config={{"vllm_fleet_classes": {classes}}}'
    with pytest.raises(ConfigError, match=re.escape(message)):
        engine_kwargs(EngineConfig(engine_arg=[arg]), "/m", "m")


def test_the_step_governor_is_on_unless_its_target_is_null():
    assert slowdown_target({}) == DEFAULT_SLOWDOWN_TARGET
    assert slowdown_target({"batch_slowdown_target": 1.3}) == 1.3
    assert slowdown_target({"batch_slowdown_target": None}) is None
    kwargs = engine_kwargs(EngineConfig(engine_arg=['additional_config={"vllm_fleet_classes": '
                                                    '{"batch_slowdown_target": null, "batch_step_tokens": 64}}']), "/m", "m")
    assert kwargs["additional_config"] == {"vllm_fleet_classes": {"batch_slowdown_target": None, "batch_step_tokens": 64}}


@pytest.mark.parametrize("async_scheduling, expected", [(False, "ClassScheduler"), (True, "AsyncClassScheduler")])
def test_vllm_gets_the_async_twin_when_it_schedules_asynchronously(async_scheduling, expected):
    # vLLM builds the class it resolves with vllm_config=...; with async scheduling on (its GPU
    # default) it must be an AsyncScheduler, or the engine's async loop runs a sync scheduler.
    pytest.importorskip("vllm")
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from vllm_fleet.worker.engines import class_scheduler

    config = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=async_scheduling))
    made = class_scheduler.ClassScheduler.__new__(class_scheduler.ClassScheduler, vllm_config=config)
    assert type(made).__name__ == expected
    assert isinstance(made, AsyncScheduler) == async_scheduling
    assert isinstance(made, class_scheduler.ClassScheduler)


@pytest.mark.parametrize("interactive_due, batch_decodes, cap, solo, expected", [
    (0, 40, 256, None, 8192),    # no interactive request and no cap alone: batch has the whole step
    (0, 40, 256, 2048, 2088),    # alone: its decodes and 2,048 of prefill, so a prompt arriving waits less
    (0, 8000, 256, 2048, 8192),  # never above the engine's own budget
    (10, 40, 256, 2048, 306),    # ten interactive decodes, forty batch decodes, 256 of batch prefill
    (3000, 0, 256, 2048, 3256),  # an interactive prompt arriving is not cut
    (8000, 100, 256, 2048, 8192),
])
def test_batch_prefill_is_capped_beside_interactive_work_and_less_so_alone(interactive_due, batch_decodes, cap, solo,
                                                                           expected):
    assert step_token_budget(8192, interactive_due, batch_decodes, cap, solo) == expected


@pytest.mark.parametrize("budget, step_tokens, on_cpu, expected", [
    (8192, 256, False, 2048),   # a GPU: a quarter of the step, where an 8B prefill runs at full rate
    (2048, 64, False, 512),
    (512, 256, False, 256),     # never under what batch may prefill beside interactive work
    (2048, 64, True, 128),      # a CPU: a step's time grows with its tokens, so keep the arriving prompt's wait short
])
def test_a_batch_alone_step_is_capped_by_what_the_device_gains_from_a_big_step(budget, step_tokens, on_cpu, expected):
    assert default_solo_step_tokens(budget, step_tokens, on_cpu) == expected


@pytest.mark.parametrize("free, waiting, budget, running_due, interactive_due, expected", [
    (4, (), 2048, 2000, 0, False),          # nothing interactive waits
    (0, (50,), 2048, 10, 5, True),          # no slot for it
    (4, (300,), 400, 50, 10, False),        # the budget leaves it room
    (4, (300,), 400, 1550, 10, True),       # running prefills would take its room
])
def test_a_step_is_described_only_when_preemption_could_help(free, waiting, budget, running_due, interactive_due,
                                                            expected):
    assert may_need_preemption(free, waiting, budget, running_due, interactive_due) is expected
    if not expected and waiting:  # the quick answer agrees with the full decision
        running = (Running("r", 100, 1.0, running_due - interactive_due), Running("i", 0, 2.0, interactive_due))
        assert batch_to_preempt(Step(running, waiting, free, budget)) == []
