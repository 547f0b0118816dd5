"""Paired ratios from saved `vllm_client_grid.py` results: each system against a baseline, round by round.

    python benchmarks/gpu/grid_ratios.py DIR [DIR ...] [--base stock] [--systems ours,variant] [--rate 100]

DIR holds `{system}-rate{rate}-r{round}.json` (vLLM's bench results). Each round's ratio compares
two systems benched back to back on the same engines and GPU, so a slow spell of the machine
moves both; the median over every round of every DIR is printed last. Checks that each pair
delivered the same output tokens.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

KEYS = [f"{p}_{m}_ms" for m in ("ttft", "tpot", "e2el") for p in ("p50", "p99")]


def rounds(folder: Path, system: str, rate: str) -> dict[int, dict]:
    found = {}
    for path in folder.glob(f"{system}-rate{rate}-r*.json"):
        found[int(re.search(r"-r(\d+)\.json$", path.name).group(1))] = json.loads(path.read_text())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--base", default="stock")
    parser.add_argument("--systems", default="ours,variant", help="compared with --base, and each later one with the first")
    parser.add_argument("--rate", default="100")
    args = parser.parse_args()
    systems = args.systems.split(",")
    pairs = [(s, args.base) for s in systems] + [(s, systems[0]) for s in systems[1:]]
    for top, bottom in pairs:
        table: dict[str, list[float]] = {k: [] for k in [*KEYS, "output_throughput"]}
        print(f"{top} / {bottom}, rate {args.rate}:")
        for folder in args.dirs:
            tops, bottoms = rounds(folder, top, args.rate), rounds(folder, bottom, args.rate)
            for r in sorted(set(tops) & set(bottoms)):
                a, b = tops[r], bottoms[r]
                assert a["total_output_tokens"] == b["total_output_tokens"], (folder, r, "different work")
                cells = []
                for key in table:
                    table[key].append(a[key] / b[key])
                    cells.append(f"{key.replace('_ms', '')} {a[key] / b[key]:.3f}")
                print(f"  {folder.parent.name}/r{r} ({a['total_output_tokens']} tokens each): " + ", ".join(cells))
        if not table["output_throughput"]:
            print("  (no rounds with both)")
            continue
        print("  median: " + ", ".join(f"{k.replace('_ms', '')} {statistics.median(v):.3f}" for k, v in table.items()))


if __name__ == "__main__":
    main()
