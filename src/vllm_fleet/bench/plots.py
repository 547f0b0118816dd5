"""PNG plots of one or several reports: latency percentiles vs load, throughput vs load.

matplotlib runs with the Agg backend (no display needed). Each report is one colour; in the
latency plot the percentile is the line style. Loads of 'inf' have no place on the x axis
and are left out of the plots (they stay in the tables).
"""

from __future__ import annotations

import math
from pathlib import Path

from vllm_fleet.bench.report import load_value

_LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E latency"))
_STYLES = {"p50": "-", "p90": ":", "p99": "--"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _points(report: dict) -> list[tuple[float, dict]]:
    points = [(load_value(run), run["summary"]) for run in report["runs"]]
    return sorted((x, s) for x, s in points if not math.isinf(x))


def _x_label(reports: list[dict]) -> str:
    modes = {run["mode"] for report in reports for run in report["runs"]}
    return "concurrency (users)" if modes == {"concurrency"} else "offered load (requests/s)"


def plot_latency(reports: list[dict], path: Path) -> Path:
    plt = _pyplot()
    percentiles = ("p50", "p90", "p99") if len(reports) == 1 else ("p50", "p99")
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (key, title) in zip(axes.flat, _LATENCIES):
        plotted: list[float] = []
        for color, report in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4, reports):
            points = _points(report)
            for p in percentiles:
                ys = [s[key].get(p) for _, s in points]
                xs = [x for (x, _), y in zip(points, ys) if y is not None]
                ys = [y for y in ys if y is not None]
                if xs:
                    ax.plot(xs, ys, _STYLES[p], marker="o", color=color, label=f"{report['label']} {p.upper()}")
                    plotted += ys
        _scale(ax, plotted)
        ax.set_title(title)
        ax.set_xlabel(_x_label(reports))
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize="small")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _scale(ax, values: list[float]) -> None:
    """Linear from 0, unless systems differ by orders of magnitude (a naive baseline beside vLLM)."""
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 50:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)


def plot_throughput(reports: list[dict], path: Path) -> Path:
    plt = _pyplot()
    fig, (ax_req, ax_tok) = plt.subplots(1, 2, figsize=(11, 4.5))
    for report in reports:
        points = _points(report)
        xs = [x for x, _ in points]
        line = ax_req.plot(xs, [s["request_throughput"] for _, s in points], "-o", label=f"{report['label']} completed")[0]
        if all("goodput" in s for _, s in points) and points:
            ax_req.plot(xs, [s["goodput"]["requests_per_s"] for _, s in points], ":o", color=line.get_color(),
                        label=f"{report['label']} goodput")
        ax_tok.plot(xs, [s["output_throughput"] for _, s in points], "-o", color=line.get_color(), label=report["label"])
    ax_req.set_title("request throughput")
    ax_req.set_ylabel("requests/s")
    ax_tok.set_title("output token throughput")
    ax_tok.set_ylabel("tokens/s")
    for ax in (ax_req, ax_tok):
        ax.set_xlabel(_x_label(reports))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_reports(reports: list[dict], stem: str) -> list[Path]:
    """`{stem}-latency.png` and `{stem}-throughput.png`."""
    Path(stem).parent.mkdir(parents=True, exist_ok=True)
    return [plot_latency(reports, Path(f"{stem}-latency.png")), plot_throughput(reports, Path(f"{stem}-throughput.png"))]
