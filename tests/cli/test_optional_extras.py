"""A node without an optional extra (e.g. a GPU node with no pyspark) still runs every other command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")

# Runs the CLI in a fresh interpreter where `import pyspark` fails, as on a node without the extra.
WITHOUT_PYSPARK = """
import sys
sys.modules["pyspark"] = None
from vllm_fleet.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-c", WITHOUT_PYSPARK, *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_other_commands_work_without_pyspark():
    result = run_cli("worker", "--help")
    assert result.returncode == 0, result.stderr
    assert "--model" in result.stdout


def test_the_command_that_needs_it_says_what_to_install():
    result = run_cli("spark-run", "--input", "prompts.jsonl", "--output", "out.parquet")
    assert result.returncode == 2
    assert "pyspark" in result.stderr and "vllm-fleet[spark]" in result.stderr
