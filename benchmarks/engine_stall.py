"""Figures for #15, an engine that stalls while its worker process stays healthy, with real vLLM.

Runs the chaos scenario (tests/chaos/test_engine_stall.py: two supervised workers on one core
each, 16 streams of 400 tokens, SIGSTOP of one worker's EngineCore process) and prints its
figures: stall detection time, failed streams, slowest stream, restart and back-in-rotation
times. The test asserts the invariants; this script only reports, and with --save keeps the raw
output under benchmarks/results/engine-stall-<date>.txt with the command and commit on top.

    flock /tmp/vllm-engine.lock python benchmarks/engine_stall.py --save    # real vLLM (~5 min)
    python benchmarks/engine_stall.py --mock                                # the mock's stall double
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/chaos/test_engine_stall.py"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mock", action="store_true", help="run the mock-engine scenario instead of real vLLM")
    parser.add_argument("--save", action="store_true", help="write the raw output to benchmarks/results/")
    args = parser.parse_args()
    test = f"{TEST}::test_engine_stall_mock" if args.mock else f"{TEST}::test_engine_stall_vllm"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s", test, "-m", "slow or not slow"]  # the vLLM case is marked slow
    # This checkout's package, even where the venv's editable install points at another clone.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    print("$", shlex.join(command), flush=True)
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    figures = [line.strip() for line in run.stdout.splitlines() if line.strip().startswith("[figure]")]
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    for line in figures:
        print(line)
    print(f"pytest: {summary} (exit {run.returncode})")
    if run.returncode != 0:
        print(run.stdout[-6000:], run.stderr[-3000:], sep="\n")
    if args.save:
        _save(command, run)
    return run.returncode


def _save(command: list[str], run: subprocess.CompletedProcess) -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "tests"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    today = datetime.date.today().isoformat()
    path = ROOT / "benchmarks" / "results" / f"engine-stall-{today}.txt"
    header = [f"# command: {shlex.join(command)}", f"# via: python benchmarks/engine_stall.py",
              f"# commit: {commit}{' (tree has uncommitted changes in src/ or tests/)' if dirty else ''}",
              f"# date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}",
              f"# exit: {run.returncode}", ""]
    path.write_text("\n".join(header) + run.stdout + ("\n# stderr\n" + run.stderr if run.stderr else ""))
    print(f"saved {path.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
