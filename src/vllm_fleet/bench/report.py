"""Reports: a JSON file with every request's timeline, a markdown summary, and PNG plots.

The JSON is the source of truth (`vllm-fleet bench compare` and the plots read it back);
the markdown is for people and for RESULTS.md.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path

from vllm_fleet.bench.config import BenchConfig
from vllm_fleet.bench.runner import LoadRun

FORMAT = "vllm-fleet-bench/1"


def build_report(config: BenchConfig, runs: list[LoadRun], *, target: str, workload: str) -> dict:
    return {
        "format": FORMAT,
        "label": config.display_name,
        "target": target,
        "workload": workload,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["vllm-fleet", *sys.argv[1:]]) if sys.argv and "bench" in sys.argv else "",
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "config": config.model_dump(),
        "runs": [
            {
                "mode": run.mode,
                "value": _encode_value(run.value),
                "burstiness": run.burstiness,
                "started_at": run.started_at,
                "load_average": list(run.load_average),
                "summary": run.summary,
                "requests": [record.to_dict() for record in run.records],
            }
            for run in runs
        ],
    }


def _encode_value(value: float) -> float | str:
    return "inf" if math.isinf(value) else value


def load_value(run: dict) -> float:
    return float(run["value"])


def load_label(run: dict) -> str:
    value = load_value(run)
    if run["mode"] == "concurrency":
        return f"conc {value:g}"
    return "inf" if math.isinf(value) else f"{value:g}/s"


def write_json(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n", encoding="utf-8")


def read_report(path: str | Path) -> dict:
    from vllm_fleet.errors import ConfigError

    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read bench report {path}: {exc}") from None
    if not isinstance(report, dict) or report.get("format") != FORMAT:
        raise ConfigError(f"{path} is not a vllm-fleet bench report (format {FORMAT})")
    return report


def fmt_ms(dist: dict, key: str) -> str:
    value = dist.get(key)
    if value is None:
        return "–"
    value = round(value, 1)
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def summary_row(run: dict) -> list[str]:
    s = run["summary"]
    goodput = s.get("goodput")
    return [
        load_label(run),
        f"{s['requests']['completed']}/{s['requests']['sent']}",
        short_cell(s),
        f"{s['request_throughput']:.2f}",
        f"{s['output_throughput']:.1f}",
        f"{fmt_ms(s['ttft_ms'], 'p50')} / {fmt_ms(s['ttft_ms'], 'p99')}",
        f"{fmt_ms(s['tpot_ms'], 'p50')} / {fmt_ms(s['tpot_ms'], 'p99')}",
        f"{fmt_ms(s['itl_ms'], 'p50')} / {fmt_ms(s['itl_ms'], 'p99')}",
        f"{fmt_ms(s['e2e_ms'], 'p50')} / {fmt_ms(s['e2e_ms'], 'p99')}",
        "–" if goodput is None else f"{goodput['requests_per_s']:.2f} ({goodput['fraction']:.0%})",
        ", ".join(f"{k}: {v}" for k, v in s["errors"].items()) or "none",
    ]


def short_cell(summary: dict) -> str:
    """Short answers (ignore_eos set, fewer tokens than asked); reports from before the count: '–'."""
    short = summary["requests"].get("short_answers")
    return "–" if short is None else str(short)


SUMMARY_HEADER = ["load", "ok/sent", "short", "req/s", "out tok/s", "TTFT P50/P99 ms", "TPOT P50/P99 ms",
                  "ITL P50/P99 ms", "E2E P50/P99 ms", "goodput req/s (share)", "errors"]


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(report: dict) -> str:
    runs = report["runs"]
    slo = next((r["summary"]["goodput"]["slo"] for r in runs if "goodput" in r["summary"]), None)
    parts = [
        f"## Bench: {report['label']}",
        "",
        f"- target: {report['target']}",
        f"- workload: {report['workload']}",
        f"- machine: {report['machine']['host']} ({report['machine']['cpus']} CPUs), date: {report['date']}",
    ]
    if report.get("command"):
        parts.append(f"- command: `{report['command']}`")
    loads = [run.get("load_average") for run in runs if run.get("load_average")]
    if loads:
        parts.append("- machine load average (1 min) before → after each run: "
                     + ", ".join(f"{a:.1f} → {b:.1f}" for a, b in loads))
    if slo:
        parts.append("- SLO: " + ", ".join(f"{k} ≤ {v:g}" for k, v in slo.items()))
    parts += ["", table(SUMMARY_HEADER, [summary_row(run) for run in runs]), ""]
    return "\n".join(parts)


def write_all(report: dict, output: str) -> list[Path]:
    """PATH (JSON), PATH.md, and PATH-latency.png / PATH-throughput.png; returns what was written."""
    from vllm_fleet.bench.plots import plot_reports

    json_path = Path(output)
    write_json(report, json_path)
    md_path = json_path.with_name(json_path.name + ".md") if json_path.suffix != ".json" else json_path.with_suffix(".md")
    md_path.write_text(markdown(report), encoding="utf-8")
    stem = str(md_path.with_suffix(""))
    return [json_path, md_path, *plot_reports([report], stem)]
