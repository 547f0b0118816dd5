"""The GPU comparison's tables from the bench reports in a results folder.

Prints (markdown) the side-by-side table of every system at every load, the throughput ratios
the issue asks for — (c) our worker over gRPC / (a) AsyncLLM in-process, (d) our gateway + worker
/ (b) stock vLLM OpenAI server; in pair runs, our fleet / nginx and / tensor parallel 2 — with
their P99 latencies, the peak GPU memory each GPU reached (from gpu-memory.csv), the CPU each
process used during each bench (run.sh's cpu-*.md) and the placement check's output.

    python benchmarks/gpu/summarize.py RESULTS_DIR [--pack ARCHIVE.tar.xz]

--pack also writes the folder as one archive small enough to bring back from the GPU machine:
the reports without their per-chunk timelines (each request keeps TTFT, TPOT, E2E and token
counts), the markdown and plots, the GPU memory samples, and the last lines of every log.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import tarfile
from pathlib import Path

from vllm_fleet.bench.compare import compare_table
from vllm_fleet.bench.report import fmt_ms, load_label, load_value, read_report

RATIOS = [("c-worker-grpc", "a-inprocess"), ("c-worker-grpc-percall", "a-inprocess"),
          ("c-worker-grpc", "c-worker-grpc-percall"), ("d-gateway-worker", "b-vllm-serve"),
          ("pair-fleet", "pair-nginx"), ("pair-fleet", "pair-vllm-tp2")]


def runs_by_label(reports: list[dict]) -> dict[str, dict[str, dict]]:
    """label -> load label -> run (a system's finite-rate and inf reports merged)."""
    merged: dict[str, dict[str, dict]] = {}
    for report in reports:
        for run in report["runs"]:
            merged.setdefault(report["label"], {})[load_label(run)] = run
    return merged


def ratio_table(merged: dict[str, dict[str, dict]]) -> str:
    rows = ["| ours / baseline | load | out tok/s (ours, base) | ratio | TTFT P99 ms (ours, base) | TPOT P99 ms (ours, base) |",
            "|---|---|---|---|---|---|"]
    for ours, base in RATIOS:
        if ours not in merged or base not in merged:
            continue
        loads = sorted(set(merged[ours]) & set(merged[base]), key=lambda k: load_value(merged[ours][k]))
        for load in loads:
            a, b = merged[ours][load]["summary"], merged[base][load]["summary"]
            ratio = a["output_throughput"] / b["output_throughput"] if b["output_throughput"] else float("nan")
            rows.append(f"| {ours} / {base} | {load} | {a['output_throughput']:.0f}, {b['output_throughput']:.0f} | "
                        f"**{ratio:.3f}** | {fmt_ms(a['ttft_ms'], 'p99')}, {fmt_ms(b['ttft_ms'], 'p99')} | "
                        f"{fmt_ms(a['tpot_ms'], 'p99')}, {fmt_ms(b['tpot_ms'], 'p99')} |")
    return "\n".join(rows)


def gpu_memory(path: Path) -> str:
    if not path.exists():
        return "(no gpu-memory.csv)"
    peak: dict[str, tuple[float, float]] = {}
    with path.open() as f:
        for row in csv.reader(f):
            if len(row) < 4:
                continue
            index, used, total = row[1].strip(), row[2].strip().split()[0], row[3].strip().split()[0]
            try:
                used_mib, total_mib = float(used), float(total)
            except ValueError:
                continue
            if used_mib > peak.get(index, (0.0, 0.0))[0]:
                peak[index] = (used_mib, total_mib)
    return "\n".join(f"- GPU {i}: peak {u / 1024:.1f} GiB of {t / 1024:.1f} GiB ({u / t:.1%})"
                     for i, (u, t) in sorted(peak.items()))


def pack(folder: Path, dest: Path, log_lines: int = 300) -> None:
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}")
    with tarfile.open(tmp, "w:xz") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for path in sorted(folder.rglob("*")):
            if not path.is_file():
                continue
            name = str(path.relative_to(folder))
            if path.suffix == ".json":
                report = json.loads(path.read_text())
                report.pop("generated_texts", None)  # vLLM's bench client: random ids' text, a quarter of its bytes
                for run in report.get("runs", []):
                    for request in run.get("requests", []):
                        request.pop("chunk_times", None)
                        request.pop("chunk_tokens", None)
                add(name, json.dumps(report).encode())
            elif path.suffix == ".log":
                add(name, b"".join(path.read_bytes().splitlines(keepends=True)[-log_lines:]))
            elif path.suffix in (".md", ".png", ".csv", ".conf", ".txt"):
                tar.add(path, arcname=name)
    tmp.replace(dest)


def main(folder: Path) -> None:
    reports = [read_report(p) for p in sorted(folder.glob("*.json"))]
    print("## All systems\n")
    print(compare_table(reports))
    print("\n## Ratios\n")
    print(ratio_table(runs_by_label(reports)))
    print("\n## GPU memory\n")
    print(gpu_memory(folder / "gpu-memory.csv"))
    print("\n## CPU during each bench (processes that used >= 1 CPU-second; 100% = one core)\n")
    print("| bench | pid | CPU s | CPU | command |\n|---|---|---|---|---|")
    for path in sorted(folder.glob("cpu-*.md")):
        print(path.read_text().rstrip())
    for path in sorted((folder / "logs").glob("client-cpu-*.txt")):
        print(f"\n{path.stem} (from bash `times` around each bench command):\n"
              + path.read_text().rstrip())
    for name in ("nvidia-smi-L.txt", "gpus.txt", "node-dry-run.txt"):
        if (folder / name).exists():
            print(f"\n## {name}\n\n```\n{(folder / name).read_text().rstrip()[:4000]}\n```")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--pack"):
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
    if len(sys.argv) == 4:
        pack(Path(sys.argv[1]), Path(sys.argv[3]))
