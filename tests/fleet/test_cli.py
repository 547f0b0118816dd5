"""`vllm-fleet plan` and `vllm-fleet gpus` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_fleet.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


def test_plan_prints_the_table_and_succeeds_when_it_fits(capsys):
    assert main(["plan", "--model", "Qwen/Qwen3.5-9B", "--device", "H200", "--max-model-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "KV per token          32.0 KiB" in out
    assert "state per seq         25.1 MiB" in out
    assert "32,768" in out and "does not fit" not in out


def test_plan_that_cannot_fit_exits_1_and_says_what_to_change(capsys):
    assert main(["plan", "--model", "Qwen/Qwen3-8B", "--device", "1g.18gb"]) == 1
    out = capsys.readouterr().out
    assert "does not fit" in out and "larger device" in out


def test_plan_refuses_tensor_parallel_on_a_mig_profile(capsys):
    assert main(["plan", "--model", "Qwen/Qwen3-8B", "--device", "3g.40gb", "--tensor-parallel-size", "2"]) == 2
    assert "across MIG slices" in capsys.readouterr().err


def test_gpus_plans_a_recorded_machine_as_json(capsys):
    argv = ["gpus", "--nvidia-smi-listing", str(FIXTURES / "a100_mig.L.txt"), "--nvidia-smi-query",
            str(FIXTURES / "a100_mig.query.csv"), "--model", "Qwen/Qwen3-8B", "--max-model-len", "8192",
            "--base-port", "6000", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [w["address"] for w in out["plan"]] == [f"127.0.0.1:{6000 + i}" for i in range(4)]
    first = out["plan"][0]
    assert first["env"] == {"CUDA_VISIBLE_DEVICES": "MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/1/0"}
    assert first["argv"][first["argv"].index("--max-model-len") + 1] == "8192"
    assert first["capacity"]["kv_tokens"] > 8192
    # no Qwen3-8B in the (empty) HF cache and no hub: the plan says its numbers come from a built-in copy
    assert any(note.startswith("model config from a built-in copy") for note in out["notes"])
