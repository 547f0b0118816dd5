"""Reports render: JSON that reads back, a markdown table, PNG plots, the compare table."""

from __future__ import annotations

import json
import subprocess
import sys

import matplotlib.image
import pytest

from vllm_fleet.bench.compare import compare_table
from vllm_fleet.bench.config import BenchConfig
from vllm_fleet.bench.metrics import Slo, summarize
from vllm_fleet.bench.record import RequestRecord
from vllm_fleet.bench.report import build_report, markdown, read_report, write_all
from vllm_fleet.bench.runner import LoadRun
from vllm_fleet.errors import ConfigError


def synthetic_run(rate: float, ttft: float) -> LoadRun:
    records = []
    for i in range(10):
        times = [i + ttft + k * 0.01 for k in range(8)]
        records.append(RequestRecord(f"r{i}", start=float(i), end=times[-1], chunk_times=times,
                                     chunk_tokens=[1] * 8, output_tokens=8))
    records.append(RequestRecord("x", start=3.0, end=3.2, error="http_503"))
    run = LoadRun("rate", rate, 1.0, "2026-11-30T00:00:00Z", records)
    run.summary = summarize(records, Slo.parse("ttft=150ms"))
    return run


def report_for(label: str, ttft: float) -> dict:
    config = BenchConfig(target="http://127.0.0.1:1", label=label, rate="1,2,inf", slo="ttft=150ms")
    runs = [synthetic_run(1.0, ttft), synthetic_run(2.0, ttft * 2), synthetic_run(float("inf"), ttft * 3)]
    return build_report(config, runs, target="test target", workload="test workload")


def test_json_markdown_and_plots_are_written(tmp_path):
    files = write_all(report_for("sys-a", 0.1), str(tmp_path / "out" / "a.json"))
    names = sorted(p.name for p in files)
    assert names == ["a-latency.png", "a-throughput.png", "a.json", "a.md"]
    data = read_report(tmp_path / "out" / "a.json")
    assert [r["value"] for r in data["runs"]] == [1.0, 2.0, "inf"]
    first = data["runs"][0]
    assert len(first["requests"]) == 11 and first["requests"][0]["ttft"] == pytest.approx(0.1)
    md = (tmp_path / "out" / "a.md").read_text()
    assert "| 1/s | 10/11 |" in md and "http_503: 1" in md and "ttft_ms ≤ 150" in md
    for png in ("a-latency.png", "a-throughput.png"):
        image = matplotlib.image.imread(tmp_path / "out" / png)
        assert image.shape[0] > 100 and image.shape[1] > 100


def test_markdown_shows_percentiles():
    md = markdown(report_for("sys-a", 0.1))
    # TTFT is exactly 100 ms for every request at rate 1
    assert "| 100 / 100 |" in md


def test_compare_puts_systems_side_by_side_per_load():
    table = compare_table([report_for("sys-a", 0.1), report_for("sys-b", 0.3)])
    lines = [line for line in table.splitlines() if line.startswith("| sys-")]
    assert [line.split("|")[1:3] for line in lines[:4]] == [
        [" sys-a ", " 1/s "], [" sys-b ", " 1/s "], [" sys-a ", " 2/s "], [" sys-b ", " 2/s "]]
    assert "| 300 |" in lines[1]  # sys-b's TTFT P50 at rate 1


def test_cli_compare_prints_the_table_and_writes_plots(tmp_path):
    for label, ttft in (("sys-a", 0.1), ("sys-b", 0.2)):
        (tmp_path / f"{label}.json").write_text(json.dumps(report_for(label, ttft)))
    result = subprocess.run(
        [sys.executable, "-m", "vllm_fleet.cli", "bench", "compare", str(tmp_path / "sys-a.json"),
         str(tmp_path / "sys-b.json"), "--plot", str(tmp_path / "cmp")],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "| sys-a | 1/s |" in result.stdout and "| sys-b | 1/s |" in result.stdout
    assert (tmp_path / "cmp-latency.png").exists() and (tmp_path / "cmp-throughput.png").exists()


def test_reading_something_else_is_a_clear_error(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(ConfigError, match="not a vllm-fleet bench report"):
        read_report(path)
