"""Issue #52's targets against one run of shared_pool.py: each phase's figures in, the lines that
say what was met out. Ratios are within the run (online alone is its own baseline)."""

from __future__ import annotations

import argparse

from vllm_fleet.router.classes.service_class import ServiceClassConfig

# Issue #52's targets, against online alone in the same run.
TARGET_SLOWDOWN = 1.05  # online TTFT P99 and ITL P99 with batch / alone
TARGET_BATCH_SHARE = 0.80  # batch output tokens/s with classes / what the idle capacity allows
TARGET_RECOVERY_S = 1.0  # online TTFT back within target after its rate doubles

# The phase --alone-again adds: online alone measured again right after the phase with batch.
ALONE_AGAIN = "online alone, again"


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def alone_spread(first: dict, again: dict, mixed: dict) -> str:
    """Online alone measured twice, around the phase with batch: how far one P99 moves with nothing
    changed, and the ratios with batch against the second measurement too. A single 20-s phase's
    P99 is its second-largest sample or so; a ratio inside this spread is not a reading."""
    def cell(key: str) -> str:
        return (f"{key.removesuffix('_ms').replace('_', ' ').upper()} {first[key]:.0f} then {again[key]:.0f} ms "
                f"(x{again[key] / first[key]:.2f}); with batch / the second: x{mixed[key] / again[key]:.2f}")
    return "online alone twice: " + "; ".join(cell(key) for key in ("ttft_p99_ms", "itl_p99_ms"))


def verdict(by: dict[str, dict], args: argparse.Namespace) -> list[str]:
    """#52's targets against this run's figures (`by`: each phase's result by name), and what the
    classes-off phase costs."""
    alone, mixed, old = by["online alone"], by["online + batch, classes"], by["online + batch, no classes"]
    capacity = by["batch alone"]["batch_output_tok_s"]
    used = alone["online_output_tok_s"] / capacity if capacity else 0.0
    allowed = capacity * max(0.0, 1 - used)
    step = by["step-up, classes"]
    ratio = {key: (mixed[key] / alone[key] if alone[key] else float("inf"),
                   old[key] / alone[key] if alone[key] else float("inf")) for key in ("ttft_p99_ms", "itl_p99_ms")}
    share = mixed["batch_output_tok_s"] / allowed if allowed else 0.0
    old_share = old["batch_output_tok_s"] / allowed if allowed else 0.0
    latency_ok = max(ratio["ttft_p99_ms"][0], ratio["itl_p99_ms"][0]) <= TARGET_SLOWDOWN
    relative_s = step.get("recovery_relative_s")
    lines = [f"online TTFT P99 with batch / alone: classes {ratio['ttft_p99_ms'][0]:.2f}x, "
             f"no classes {ratio['ttft_p99_ms'][1]:.2f}x (target <= {TARGET_SLOWDOWN}x)",
             f"online ITL P99 with batch / alone: classes {ratio['itl_p99_ms'][0]:.2f}x, "
             f"no classes {ratio['itl_p99_ms'][1]:.2f}x (target <= {TARGET_SLOWDOWN}x)",
             f"batch capacity C = {capacity:.1f} tok/s (batch alone as class batch: the router keeps "
             f"{ServiceClassConfig().interactive_reserve:.0%} of the slots free); online used U = {used:.1%}; "
             f"idle capacity allows "
             f"C x (1 - U) = {allowed:.1f} tok/s; batch reached {mixed['batch_output_tok_s']:.1f} = {share:.0%} with "
             f"classes, {old['batch_output_tok_s']:.1f} = {old_share:.0%} without (target >= {TARGET_BATCH_SHARE:.0%})",
             f"what classes remove, classes off -> on: online TTFT P99 {old['ttft_p99_ms']:.0f} -> "
             f"{mixed['ttft_p99_ms']:.0f} ms, ITL P99 {old['itl_p99_ms']:.0f} -> {mixed['itl_p99_ms']:.0f} ms, "
             f"E2E P99 {old['e2e_p99_ms']:.0f} -> {mixed['e2e_p99_ms']:.0f} ms",
             f"step-up ({args.rate:g} -> {2 * args.rate:g}/s): online TTFT P99 back within {TARGET_SLOWDOWN}x online "
             f"alone's ({TARGET_SLOWDOWN * alone['ttft_p99_ms']:.0f} ms) {relative_s} s after the step, within "
             f"{args.ttft_target_ms:.0f} ms {step.get('recovery_s')} s (target <= {TARGET_RECOVERY_S:g} s)",
             f"#52 targets: latency with batch <= {TARGET_SLOWDOWN}x alone: {met(latency_ok)}; batch >= "
             f"{TARGET_BATCH_SHARE:.0%} of the idle capacity: {met(share >= TARGET_BATCH_SHARE)}; both at once: "
             f"{met(latency_ok and share >= TARGET_BATCH_SHARE)}; back within target <= {TARGET_RECOVERY_S:g} s "
             f"after the step: {met(relative_s is not None and relative_s <= TARGET_RECOVERY_S)}"]
    if ALONE_AGAIN in by:
        lines.insert(2, alone_spread(alone, by[ALONE_AGAIN], mixed))
    errors = sum(r.get("online_errors", 0) + r.get("batch_errors", 0) for r in by.values())
    if errors:
        lines.append(f"errors: {errors} requests failed in all (see each phase's JSON line)")
    return lines
