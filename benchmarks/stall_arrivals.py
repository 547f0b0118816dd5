"""Stall detection time against the arrival rate of new requests during the stall (#28).

For each case, a fresh real vLLM worker (default model, one core) runs four long streams; its
EngineCore is SIGSTOPped and new requests arrive at the case's rate with the case's prompt
length; the figure is the time from the SIGSTOP to the worker saying NOT_SERVING. The scenario
is tests/chaos/stall_arrivals.py (the CI test runs one case of it).

    PYTHONPATH=src flock /tmp/vllm-fleet-heavy.lock python benchmarks/stall_arrivals.py [--save]  # ~4 min
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The scenario from the tests; the worker runs the package PYTHONPATH names (pass an older
# checkout's src to measure it before a change).
sys.path[:0] = [str(ROOT / "tests" / "chaos"), str(ROOT / "tests")]

from stall_arrivals import stall_with_arrivals  # noqa: E402

CASES = [("none", 0, 10), ("3/s short", 3, 10), ("30/s short", 30, 10), ("10/s long (1,500 words)", 10, 1500)]


async def main(save: bool, label: str, cases: list[int]) -> None:
    lines = []
    for name, rate, words in [CASES[i] for i in cases]:
        try:
            outcome = await stall_with_arrivals(rate, words)
            line = f"{name:>26}: detected after {outcome.detection_s:5.1f} s ({outcome.arrivals} arrivals)"
        except AssertionError as error:   # wait_until's deadline: not detected within 120 s
            line = f"{name:>26}: NOT detected ({error})"
        print(line, flush=True)
        lines.append(line)
    if save:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
        out = ROOT / "benchmarks" / "results" / f"stall-arrivals-{datetime.date.today()}.txt"
        out = out.with_name(f"{out.stem}-{label}.txt")
        out.write_text(f"$ PYTHONPATH={os.environ.get('PYTHONPATH', '')} python benchmarks/stall_arrivals.py --save"
                       f" --label {label}  (this checkout at {commit.strip()}, 2-core CPU VM)\n"
                       + "\n".join(lines) + "\n")
        print(f"saved {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", action="store_true", help="write the figures under benchmarks/results/")
    parser.add_argument("--label", default="run", help="names the saved file (e.g. before / after a change)")
    parser.add_argument("--cases", default="0,1,2,3", help=f"which cases, by index: {[c[0] for c in CASES]}")
    options = parser.parse_args()
    asyncio.run(main(options.save, options.label, [int(i) for i in options.cases.split(",")]))
