"""`vllm-fleet bench compare a.json b.json ...`: the reports side by side, load by load."""

from __future__ import annotations

from vllm_fleet.bench.report import fmt_ms, load_label, load_value, short_cell, table

COMPARE_HEADER = ["system", "load", "ok/sent", "short", "req/s", "out tok/s", "TTFT P50 ms", "TTFT P99 ms",
                  "TPOT P50 ms", "TPOT P99 ms", "E2E P99 ms", "goodput req/s", "errors"]


def compare_rows(reports: list[dict]) -> list[list[str]]:
    """One row per (load, report), grouped by load so each load's systems sit together."""
    loads = sorted({(run["mode"], load_value(run)) for report in reports for run in report["runs"]})
    rows = []
    for mode, value in loads:
        for report in reports:
            run = next((r for r in report["runs"] if r["mode"] == mode and load_value(r) == value), None)
            if run is None:
                continue
            s = run["summary"]
            goodput = s.get("goodput")
            rows.append([
                report["label"], load_label(run), f"{s['requests']['completed']}/{s['requests']['sent']}",
                short_cell(s), f"{s['request_throughput']:.2f}", f"{s['output_throughput']:.1f}",
                fmt_ms(s["ttft_ms"], "p50"), fmt_ms(s["ttft_ms"], "p99"), fmt_ms(s["tpot_ms"], "p50"),
                fmt_ms(s["tpot_ms"], "p99"), fmt_ms(s["e2e_ms"], "p99"),
                "–" if goodput is None else f"{goodput['requests_per_s']:.2f}",
                ", ".join(f"{k}: {v}" for k, v in s["errors"].items()) or "none",
            ])
    return rows


def compare_table(reports: list[dict]) -> str:
    return table(COMPARE_HEADER, compare_rows(reports))
