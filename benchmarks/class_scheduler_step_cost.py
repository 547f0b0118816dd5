"""What the class scheduler adds to each engine step before vLLM schedules it (#49, #52): its
preparation (`_forget_batch_once_gone`, `_prepare_step`: the step budget, preemption for waiting
interactive requests and the running list's order; the admission cap) timed on the installed vLLM's own Request and priority queue,
with RUNNING requests running (decoding) and WAITING interactive requests waiting, as under load, on a worker
that has never been sent batch and on one with batch running.

    python benchmarks/class_scheduler_step_cost.py --running 256 --waiting 32

The scheduler is built without vLLM's __init__ (which needs a model), as
tests/worker/test_class_scheduler_steps.py does; nothing is preempted (slots are free), so each
repetition measures the same step. 2026-12-06 on the 2-core VM, 256 running and 32 waiting:
67f8703 spent 357 µs a step on a worker never sent batch and 624 µs with half the running
requests batch; now 2.6 µs and ~ the figure this prints (benchmarks/RESULTS.md, #49).
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

from vllm import SamplingParams
from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue
from vllm.v1.request import Request, RequestStatus

from vllm_fleet.worker.engines.class_scheduler import ClassScheduler


def scheduler(max_seqs: int) -> ClassScheduler:
    built = object.__new__(ClassScheduler)
    built.__dict__.update(
        policy=SchedulingPolicy.PRIORITY, waiting=create_request_queue(SchedulingPolicy.PRIORITY), running=[],
        max_num_running_reqs=max_seqs, max_num_active_reqs=max_seqs, max_num_scheduled_tokens=16384,
        num_waiting_for_streaming_input=0, batch_priority=100, interactive_slots=max_seqs // 16,
        batch_step_tokens=512, _by_class=True, _batch_arrived=False, _steps_since_check=0,
        _admission_limit="max_num_running_reqs", encoder_cache_manager=SimpleNamespace(free=lambda r: None))
    return built


def request(request_id: str, priority: int, arrival: float, outputs: int) -> Request:
    made = Request(request_id, list(range(256)), SamplingParams(max_tokens=512), None, arrival_time=arrival,
                   priority=priority)
    for token in range(outputs):
        made.append_output_token_ids(1000 + token)
    made.num_computed_tokens = made.num_tokens - 1 if outputs else 0
    return made


def step_us(running: int, waiting: int, batch_share: float, repeat: int) -> float:
    made = scheduler(max_seqs=running + waiting + 64)
    batch_count = int(running * batch_share)
    for n in range(running):
        item = request(f"r{n}", 100 if n < batch_count else 0, float(n), outputs=3)
        item.status = RequestStatus.RUNNING
        made.running.append(item)
        made._note_arrival(item)
    for n in range(waiting):
        made.waiting.add_request(request(f"w{n}", 0, 1e6 + n, outputs=0))
    started = time.perf_counter()
    for _ in range(repeat):
        made._forget_batch_once_gone()
        made._prepare_step(made.max_num_running_reqs, made.max_num_scheduled_tokens)
        made._admission_cap(made.max_num_running_reqs)
    return (time.perf_counter() - started) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--running", type=int, default=256)
    parser.add_argument("--waiting", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    print(f"running {args.running}, waiting interactive {args.waiting}, {args.repeat} steps each")
    for label, share in (("never sent batch", 0.0), ("half the running requests batch", 0.5)):
        print(f"  {label}: {step_us(args.running, args.waiting, share, args.repeat):.1f} µs per step")


if __name__ == "__main__":
    main()
