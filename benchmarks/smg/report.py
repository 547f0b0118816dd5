"""The SMG comparison's tables: per round, per side, and the verdict on issue #17's target 1."""

from __future__ import annotations

import argparse

from vllm_fleet.bench import percentile


def _ms(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def side_summary(rounds: list[dict]) -> dict:
    served = sum(r["requests_served"] for r in rounds)
    ttfts = [t for r in rounds for t in r["ttfts_s"]]
    tpots = [t for r in rounds for t in r["tpots_s"]]
    engines = {k: sum(r["engine_cpu_s"][k] for r in rounds) for k in rounds[0]["engine_cpu_s"]}
    return {
        "rounds": len(rounds), "requests_served": served,
        "output_tokens": sum(r["output_tokens"] for r in rounds),
        "prompt_tokens": sum(r["prompt_tokens"] for r in rounds),
        "gateway_cpu_s_per_1k": sum(r["gateway_cpu_s"] for r in rounds) / served * 1000,
        "gateway_cpu_s_per_1k_less_idle": sum(r["gateway_cpu_s_per_1k_less_idle"] * r["requests_served"]
                                              for r in rounds) / served,
        "gateway_idle_cpu_per_s": sum(r["gateway_idle_cpu_per_s"] for r in rounds) / len(rounds),
        "ttft_p50_ms": percentile(ttfts, 50) * 1e3, "ttft_p99_ms": percentile(ttfts, 99) * 1e3,
        "tpot_p50_ms": percentile(tpots, 50) * 1e3, "tpot_p99_ms": percentile(tpots, 99) * 1e3,
        "output_tok_s": sum(r["output_tok_s"] for r in rounds) / len(rounds),
        "engine_cpu_s_per_1k": {k: v / served * 1000 for k, v in engines.items()},
        "bench_cpu_s": sum(r["bench_cpu_s"] for r in rounds),
        "full_work": all(r["full_work"] for r in rounds),
    }


def render(args: argparse.Namespace, rounds: list[dict], sides: dict, verdict: dict) -> str:
    lines = ["| round | side | ok/sent | output tokens | out tok/s | TTFT P50/P99 ms | TPOT P50/P99 ms | "
             "gateway CPU-s (per 1k req) | engines CPU-s: front / EngineCore / model worker | bench CPU-s | load 1m |",
             "|---|---|---|---:|---:|---|---|---|---|---:|---:|"]
    for r in rounds:
        e = r["engine_cpu_s"]
        lines.append(f"| {r['label']} | {r['side']} | {r['completed']}/{r['sent']} | {r['output_tokens']:,} | "
                     f"{r['output_tok_s']:.1f} | {_ms(r['ttft_ms']['p50'])} / {_ms(r['ttft_ms']['p99'])} | "
                     f"{_ms(r['tpot_ms']['p50'])} / {_ms(r['tpot_ms']['p99'])} | {r['gateway_cpu_s']:.2f} "
                     f"({r['gateway_cpu_s_per_1k']:.1f}) | {e['front']:.1f} / {e['engine_core']:.1f} / "
                     f"{e['model_worker']:.1f} | {r['bench_cpu_s']:.1f} | {r['loadavg_after'][0]:.2f} |")
    lines += ["", "| side | rounds | prompt / output tokens | gateway CPU-s per 1k req (less idle) | gateway idle CPU ms/s | "
              "TTFT P50 / P99 ms | TPOT P50 / P99 ms | out tok/s (mean of rounds) | "
              "engines CPU-s per 1k req: front / EngineCore / model worker |",
              "|---|---:|---:|---|---:|---|---|---:|---|"]
    for name, s in sides.items():
        e = s["engine_cpu_s_per_1k"]
        lines.append(f"| {name} | {s['rounds']} | {s['prompt_tokens']:,} / {s['output_tokens']:,} | "
                     f"{s['gateway_cpu_s_per_1k']:.2f} "
                     f"({s['gateway_cpu_s_per_1k_less_idle']:.2f}) | {s['gateway_idle_cpu_per_s'] * 1e3:.1f} | "
                     f"{s['ttft_p50_ms']:.1f} / {s['ttft_p99_ms']:.1f} | {s['tpot_p50_ms']:.1f} / "
                     f"{s['tpot_p99_ms']:.1f} | {s['output_tok_s']:.1f} | {e['front']:.1f} / "
                     f"{e['engine_core']:.1f} / {e['model_worker']:.1f} |")
    if verdict:
        lines += ["", "| target 1 (CPU machine) | ours | SMG | ratio / difference | met |", "|---|---:|---:|---:|---|"]
        for row in verdict["rows"]:
            lines.append(f"| {row['what']} | {row['ours']} | {row['smg']} | {row['vs']} | {'yes' if row['met'] else 'no'} |")
    return "\n".join(lines)


def judge(sides: dict) -> dict:
    if "ours" not in sides or "smg" not in sides:
        return {}
    o, s = sides["ours"], sides["smg"]
    if not (o["full_work"] and s["full_work"]):
        return {}
    cpu_ratio = o["gateway_cpu_s_per_1k"] / s["gateway_cpu_s_per_1k"]
    ttft_diff = o["ttft_p99_ms"] - s["ttft_p99_ms"]
    tput_ratio = o["output_tok_s"] / s["output_tok_s"]
    rows = [
        {"what": "gateway CPU-s per 1,000 streamed requests ≤ SMG's", "ours": f"{o['gateway_cpu_s_per_1k']:.2f}",
         "smg": f"{s['gateway_cpu_s_per_1k']:.2f}", "vs": f"{cpu_ratio:.2f}×", "met": cpu_ratio <= 1.0},
        {"what": "TTFT P99 within +1 ms of SMG", "ours": f"{o['ttft_p99_ms']:.1f} ms", "smg": f"{s['ttft_p99_ms']:.1f} ms",
         "vs": f"{ttft_diff:+.1f} ms", "met": ttft_diff <= 1.0},
        {"what": "output tokens/s ≥ 1.00× SMG", "ours": f"{o['output_tok_s']:.1f}", "smg": f"{s['output_tok_s']:.1f}",
         "vs": f"{tput_ratio:.3f}×", "met": tput_ratio >= 1.0},
    ]
    return {"rows": rows, "gateway_cpu_ratio": cpu_ratio, "ttft_p99_diff_ms": ttft_diff, "throughput_ratio": tput_ratio,
            "met": all(r["met"] for r in rows)}
