"""Placement: which workers this node runs, on which devices, with which settings.

- one worker per MIG instance (CUDA gives a process one MIG instance and no peer access
  between instances, so tensor parallelism across slices is impossible);
- tensor-parallel groups of consecutive whole GPUs;
- both at once on a node where some GPUs are in MIG mode (a mixed layout);
- on a CPU machine, N workers each bound to its own cores (workers sharing cores slow each
  other below one worker's speed: MACHINE-NOTES) with a fixed KV-cache space.

Every worker is checked against the capacity model before anything starts; a plan that
cannot run raises ConfigError saying what to change.
"""

from __future__ import annotations

import math
import socket
import sys
from dataclasses import dataclass, field

from vllm_fleet.config import EngineConfig, WorkerConfig
from vllm_fleet.errors import ConfigError
from vllm_fleet.fleet import capacity as cap
from vllm_fleet.fleet.config import PlanConfig
from vllm_fleet.fleet.gpus import Device, Inventory, format_cores
from vllm_fleet.fleet.model_shape import ModelShape, load_shape
from vllm_fleet.fleet.worker_process import worker_argv


@dataclass
class WorkerSpec:
    """One planned worker: where it runs and how it is started."""

    worker_id: str
    device: str                          # label, e.g. "GPU 0-1", "MIG 1g.18gb #2 on GPU 0", "cpu 1"
    port: int
    host: str
    engine: EngineConfig
    env: dict[str, str] = field(default_factory=dict)
    mig_profile: str = ""
    capacity: cap.Capacity | None = None
    pool: str = ""                       # workload pool (fleet files); "" = any

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def argv(self, python: str = sys.executable) -> list[str]:
        """The worker's command line."""
        worker = WorkerConfig(host=self.host, port=self.port, device=self.device, worker_id=self.worker_id)
        if self.pool:  # "" (any pool) is the worker's own default: no `--pool ''` on the command line
            worker.pool = self.pool
        return worker_argv(worker, self.engine, python=python)

    def capacity_summary(self) -> dict[str, float]:
        """What the registry advertises (WorkerRecord.capacity)."""
        if self.capacity is None:
            return {}
        return {"max_num_seqs": float(self.capacity.max_num_seqs), "kv_tokens": float(self.capacity.kv_tokens),
                "max_model_len": float(self.capacity.max_model_len)}


@dataclass
class Plan:
    workers: list[WorkerSpec]
    source: str                          # how devices were found
    model: str
    notes: list[str] = field(default_factory=list)


def build_plan(inventory: Inventory, config: PlanConfig, shape: ModelShape | None = None) -> Plan:
    """Place workers on what `inventory` found; raises ConfigError when the plan cannot run."""
    if config.engine == "vllm" and shape is None:
        shape = load_shape(config.model)
    use_cpu = config.devices == "cpu" or not inventory.has_gpu
    plan = Plan(workers=[], source=inventory.source, model=shape.name if shape else f"mock ({config.model or 'default'})")
    if use_cpu:
        _place_cpu(plan, inventory, config, shape)
    else:
        _place_gpus(plan, inventory, config, shape)
    if not plan.workers:
        raise ConfigError("the plan has no worker: " + ("; ".join(plan.notes) or "no usable device found"))
    for offset, worker in enumerate(plan.workers):
        worker.port = config.base_port + offset
    return plan


# ---------------------------------------------------------------------------------------------
# GPUs


def _selected(inventory: Inventory, selector: str) -> tuple[list[Device], list[Device]]:
    whole, migs = inventory.whole_gpus, inventory.mig_instances
    if selector == "all":
        return whole, migs
    if selector == "gpu":
        return whole, []
    if selector == "mig":
        return [], migs
    wanted = {item.strip() for item in selector.split(",") if item.strip()}
    pick = [d for d in whole if str(d.index) in wanted or d.uuid in wanted]
    # A GPU index selects all its MIG instances; a MIG UUID selects one.
    pick_migs = [d for d in migs if d.uuid in wanted or str(d.parent_index) in wanted]
    unknown = wanted - {str(d.index) for d in pick} - {d.uuid for d in pick_migs} - {str(d.parent_index) for d in pick_migs}
    if unknown:
        raise ConfigError(f"--devices names {sorted(unknown)}, which this node does not have; see `vllm-fleet gpus`")
    return pick, pick_migs


def _place_gpus(plan: Plan, inventory: Inventory, config: PlanConfig, shape: ModelShape | None) -> None:
    whole, migs = _selected(inventory, config.devices)
    tp = config.tensor_parallel_size
    if tp > 1 and not whole:
        raise ConfigError(
            f"--tensor-parallel-size {tp} needs whole GPUs, and the selected devices are MIG instances: CUDA gives "
            f"a process one MIG instance and no peer access between them. Use --tensor-parallel-size 1 "
            f"(one worker per MIG instance) or disable MIG mode on {tp} GPUs"
        )
    if tp > 1 and len(whole) < tp:
        raise ConfigError(f"--tensor-parallel-size {tp} needs {tp} whole GPUs; this node has {len(whole)}")
    groups = [whole[i:i + tp] for i in range(0, len(whole) - len(whole) % tp, tp)]
    if len(whole) % tp:
        idle = ", ".join(d.label for d in whole[len(groups) * tp:])
        plan.notes.append(f"{idle} left idle: {len(whole)} whole GPUs do not split into groups of {tp}")
    if migs and tp > 1:
        plan.notes.append(f"MIG instances run one worker each at tensor-parallel size 1 (whole GPUs use {tp})")
    for group in groups:
        label = "GPU " + ",".join(str(d.index) for d in group)
        device = cap.DeviceSpec(name=group[0].name, memory_bytes=min(d.memory_bytes for d in group))
        _add_gpu_worker(plan, config, shape, label, device, [d.uuid for d in group], tp=tp)
    for mig in migs:
        device = cap.DeviceSpec(name=f"MIG {mig.mig_profile}", memory_bytes=mig.memory_bytes)
        _add_gpu_worker(plan, config, shape, mig.label, device, [mig.uuid], tp=1, mig_profile=mig.mig_profile)


def _add_gpu_worker(plan: Plan, config: PlanConfig, shape: ModelShape | None, label: str, device: cap.DeviceSpec,
                    uuids: list[str], *, tp: int, mig_profile: str = "") -> None:
    engine = engine_config(config, tensor_parallel_size=tp, gpu_memory_utilization=config.gpu_memory_utilization)
    spec = WorkerSpec(worker_id=node_worker_id(len(plan.workers)), device=label, port=0, host=config.host,
                      engine=engine, env={"CUDA_VISIBLE_DEVICES": ",".join(uuids)}, mig_profile=mig_profile)
    _check(plan, config, shape, spec, device)


# ---------------------------------------------------------------------------------------------
# CPU


def _place_cpu(plan: Plan, inventory: Inventory, config: PlanConfig, shape: ModelShape | None) -> None:
    cpu = inventory.cpu
    if cpu is None or not cpu.cores:
        raise ConfigError("no GPU and no usable CPU core found")
    per_worker = config.cores_per_worker
    by_cores = len(cpu.cores) // per_worker
    if by_cores == 0:
        raise ConfigError(f"--cores-per-worker {per_worker} exceeds the {len(cpu.cores)} cores this process may use")
    kv_gib = config.kv_cache_space_gb or default_kv_gib(shape, config)
    count = config.cpu_workers or min(by_cores, _workers_by_memory(shape, config, kv_gib, cpu.memory_bytes))
    if count > by_cores:
        raise ConfigError(
            f"--cpu-workers {count} × --cores-per-worker {per_worker} needs {count * per_worker} cores; "
            f"this machine gives {len(cpu.cores)}. Workers must not share cores (they slow each other down)"
        )
    share = cpu.memory_bytes // count
    for i in range(count):
        cores = format_cores(cpu.cores[i * per_worker:(i + 1) * per_worker])
        engine = engine_config(config, cpu_cores=cores, kv_cache_space_gb=kv_gib)
        spec = WorkerSpec(worker_id=node_worker_id(i), device=f"cpu {cores}", port=0, host=config.host, engine=engine)
        device = cap.DeviceSpec(name="cpu", kind="cpu", memory_bytes=share, kv_cache_space_bytes=kv_gib * cap.GiB)
        _check(plan, config, shape, spec, device)


def default_kv_gib(shape: ModelShape | None, config: PlanConfig) -> int:
    """Whole GiB (VLLM_CPU_KVCACHE_SPACE takes an integer) holding 4 full-length sequences."""
    if shape is None:
        return 1
    length = config.max_model_len or shape.max_position
    need = 4 * (cap.state_bytes_per_sequence(shape) + length * cap.kv_bytes_per_token(shape))
    return max(1, math.ceil(need / cap.GiB))


def _workers_by_memory(shape: ModelShape | None, config: PlanConfig, kv_gib: int, memory: int) -> int:
    if shape is None:
        return 1 << 30
    per_worker = shape.weight_bytes() + kv_gib * cap.GiB + cap.CPU_RUNTIME_RESERVE
    return max(1, memory // per_worker)


# ---------------------------------------------------------------------------------------------
# Shared


def node_worker_id(number: int) -> str:
    # Unique across nodes, stable across restarts of the same worker.
    return f"{socket.gethostname()}-w{number}"


def engine_config(config: PlanConfig, **fields: object) -> EngineConfig:
    values: dict[str, object] = {"engine": config.engine, **fields}
    for name in ("model", "max_model_len", "max_num_seqs"):
        if getattr(config, name) is not None:
            values[name] = getattr(config, name)
    if config.enforce_eager:
        values["enforce_eager"] = True
    if config.kv_events:
        values["kv_events"] = True
    if config.engine_arg:
        values["engine_arg"] = list(config.engine_arg)
    if config.engine == "mock":  # the mock engine ignores device settings; keep its command line short
        kept = ("engine", "model", "served_model_name", "max_num_seqs", "cpu_cores")
        values = {k: v for k, v in values.items() if k in kept}
    return EngineConfig(**values)


def _check(plan: Plan, config: PlanConfig, shape: ModelShape | None, spec: WorkerSpec, device: cap.DeviceSpec) -> None:
    """Add `spec` to the plan if the model fits; otherwise skip it (--skip-unfit) or refuse."""
    if shape is not None:
        settings = cap.EngineSettings(
            max_model_len=config.max_model_len, max_num_seqs=config.max_num_seqs,
            gpu_memory_utilization=config.gpu_memory_utilization,
            tensor_parallel_size=spec.engine.tensor_parallel_size, enforce_eager=config.enforce_eager,
        )
        spec.capacity = cap.estimate(shape, device, settings)
        if not spec.capacity.fits:
            reason = "; ".join(spec.capacity.problems)
            if not config.skip_unfit:
                raise ConfigError(f"{shape.name} does not fit on {spec.device}: {reason} (or pass --skip-unfit "
                                  f"to leave such devices out)")
            plan.notes.append(f"{spec.device} skipped: {reason}")
            return
    plan.workers.append(spec)
