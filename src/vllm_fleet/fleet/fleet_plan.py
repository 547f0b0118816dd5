"""Placement of a fleet file: several models on one node, on devices no two models share.

Each model entry's `devices` is split evenly between its replicas (fleet_file.py lists the
forms). A device belongs to one model, except GPU shares: several share-workers may sit on
one GPU while their shares add up to at most MAX_GPU_SHARE_TOTAL. Every worker is then
checked against the capacity model.

Nothing is placed half-way: every problem of every entry (an unknown model, devices the node
lacks or another entry holds, more replicas than devices, a worker the model does not fit
on) is collected, and the whole file is refused with all of them in one ConfigError, before
any worker starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_fleet.errors import ConfigError, FleetError
from vllm_fleet.fleet import capacity as cap
from vllm_fleet.fleet.config import PlanConfig
from vllm_fleet.fleet.fleet_file import FleetFile, ModelEntry
from vllm_fleet.fleet.gpus import Device, Inventory, format_cores
from vllm_fleet.fleet.model_shape import ModelShape, load_shape
from vllm_fleet.fleet.plan import Plan, WorkerSpec, default_kv_gib, engine_config, node_worker_id

# vLLM refuses to start when the GPU's free memory is below its gpu_memory_utilization × total,
# and each process's CUDA context lies outside the other workers' shares: shares of one GPU
# that add up to 1.0 would fail the last worker's start, so some room is kept free.
MAX_GPU_SHARE_TOTAL = 0.95
CLASS_POOLS = ("short", "long")   # the router's workload classes (router/features.py)


@dataclass
class _Slot:
    """Where one replica runs, before its capacity check."""

    label: str
    device: cap.DeviceSpec
    env: dict[str, str] = field(default_factory=dict)
    engine: dict[str, object] = field(default_factory=dict)   # device-specific engine settings
    mig_profile: str = ""


@dataclass
class _Ledger:
    """Which entry holds each device, so that overlaps are named."""

    whole: dict[int, str] = field(default_factory=dict)      # GPU index → entry
    shares: dict[int, float] = field(default_factory=dict)   # GPU index → shares given
    share_owners: dict[int, list[str]] = field(default_factory=dict)
    mig: dict[str, str] = field(default_factory=dict)        # MIG UUID → entry
    cores: dict[int, str] = field(default_factory=dict)      # CPU core → entry


def build_fleet_plan(inventory: Inventory, fleet: FleetFile, shapes: dict[str, ModelShape] | None = None) -> Plan:
    """Workers for every entry of `fleet`; raises ConfigError listing every problem when it cannot run."""
    problems: list[tuple[int, str]] = []   # (entry number, problem): listed in file order
    shapes = dict(shapes or {})
    ledger = _Ledger()
    placed: list[tuple[ModelEntry, list[_Slot]]] = []
    for number, entry in enumerate(fleet.models):
        where = f"models[{number}] ({entry.name})"
        if fleet.engine == "vllm" and entry.model not in shapes:
            try:
                shapes[entry.model] = load_shape(entry.model)
            except FleetError as exc:  # ModelError: where it looked and how to get the config
                problems.append((number, f"{where}: {exc}"))
        slots, entry_problems = _place(entry, where, inventory, ledger)
        problems += [(number, f"{where}: {p}") for p in entry_problems]
        placed.append((entry, slots))
    plan = Plan(workers=[], source=inventory.source, model=", ".join(e.name for e in fleet.models))
    cpu_workers = sum(1 for _, slots in placed for s in slots if s.device.kind == "cpu")
    for number, (entry, slots) in enumerate(placed):
        shape = shapes.get(entry.model)
        for slot in slots:
            problem = _add_worker(plan, fleet, entry, slot, shape, inventory, cpu_workers)
            if problem:
                problems.append((number, f"models[{number}] ({entry.name}) on {slot.label}: {problem}"))
    if problems:
        listed = "\n  - ".join(p.replace("\n", "\n    ") for _, p in sorted(problems, key=lambda item: item[0]))
        raise ConfigError(f"the fleet file does not fit this node; nothing was started:\n  - {listed}")
    for offset, worker in enumerate(plan.workers):
        worker.port = fleet.base_port + offset
    plan.notes += [f"{name}: model config from {s.source}" for name, s in shapes.items() if s.from_builtin]
    plan.notes += [f"pool {pool!r} is not a workload class (short, long): routers with --class-pools send it nothing"
                   for pool in sorted({e.pool for e in fleet.models} - {"", *CLASS_POOLS})]
    return plan


def _place(entry: ModelEntry, where: str, inventory: Inventory, ledger: _Ledger) -> tuple[list[_Slot], list[str]]:
    request = entry.device_request
    if request.kind == "gpu":
        return _place_gpus(entry, where, inventory, ledger)
    if request.kind == "share":
        return _place_shares(entry, where, inventory, ledger)
    if request.kind == "mig":
        return _place_migs(entry, where, inventory, ledger)
    return _place_cores(entry, where, inventory, ledger)


def _split(count: int, replicas: int, what: str) -> tuple[int, list[str]]:
    """How many of `count` devices each replica gets, or why they do not split."""
    if replicas > count:
        return 0, [f"{replicas} replicas but {count} {what}: more replicas than devices"]
    if count % replicas:
        return 0, [f"{count} {what} do not split evenly over {replicas} replicas"]
    return count // replicas, []


def _whole_gpus(indices: tuple[int, ...], inventory: Inventory) -> tuple[list[Device], list[str]]:
    by_index = {d.index: d for d in inventory.whole_gpus}
    in_mig_mode = {d.index for d in inventory.devices if d.kind == "gpu" and d.mig_enabled}
    problems = [f"GPU {i} is in MIG mode; name its instances with mig:PROFILE" for i in indices if i in in_mig_mode]
    missing = [i for i in indices if i not in by_index and i not in in_mig_mode]
    if missing:
        problems.append(f"this node has no GPU {', '.join(map(str, missing))} (see `vllm-fleet gpus`)")
    return [by_index[i] for i in indices if i in by_index], problems


def _place_gpus(entry: ModelEntry, where: str, inventory: Inventory, ledger: _Ledger) -> tuple[list[_Slot], list[str]]:
    gpus, problems = _whole_gpus(entry.device_request.indices, inventory)
    for gpu in gpus:
        holder = ledger.whole.get(gpu.index) or ", ".join(ledger.share_owners.get(gpu.index, []))
        if holder:
            problems.append(f"GPU {gpu.index} is also given to {holder}")
        ledger.whole.setdefault(gpu.index, where)
    tp, split_problems = _split(len(entry.device_request.indices), entry.replicas, "GPUs")
    problems += split_problems
    if tp and entry.tensor_parallel_size and entry.tensor_parallel_size != tp:
        problems.append(f"tensor_parallel_size {entry.tensor_parallel_size} differs from the {tp} GPUs each "
                        f"replica gets; list replicas × tensor_parallel_size GPUs")
    if problems:
        return [], problems
    slots = []
    for start in range(0, len(gpus), tp):
        group = gpus[start:start + tp]
        slots.append(_Slot(
            label="GPU " + ",".join(str(d.index) for d in group),
            device=cap.DeviceSpec(name=group[0].name, memory_bytes=min(d.memory_bytes for d in group)),
            env={"CUDA_VISIBLE_DEVICES": ",".join(d.uuid for d in group)},
            engine={"tensor_parallel_size": tp, "gpu_memory_utilization": entry.gpu_memory_utilization},
        ))
    return slots, []


def _place_shares(entry: ModelEntry, where: str, inventory: Inventory,
                  ledger: _Ledger) -> tuple[list[_Slot], list[str]]:
    request = entry.device_request
    if request.indices:
        candidates, problems = _whole_gpus(request.indices, inventory)
    else:
        candidates, problems = inventory.whole_gpus, [] if inventory.whole_gpus else ["this node has no whole GPU"]
    if entry.tensor_parallel_size not in (None, 1):
        problems.append("a GPU share runs on one GPU: tensor_parallel_size must be 1")
    slots: list[_Slot] = []
    for replica in range(entry.replicas if not problems else 0):
        gpu = next((g for g in candidates if g.index not in ledger.whole
                    and ledger.shares.get(g.index, 0.0) + request.share <= MAX_GPU_SHARE_TOTAL + 1e-9), None)
        if gpu is None:
            taken = "; ".join(f"GPU {g.index} held whole by {ledger.whole[g.index]}" if g.index in ledger.whole
                              else f"GPU {g.index} {ledger.shares.get(g.index, 0):g} shared" for g in candidates)
            problems.append(f"no GPU has {request.share:g} left for replica {replica + 1} of {entry.replicas} "
                            f"(shares of one GPU add up to at most {MAX_GPU_SHARE_TOTAL}; {taken})")
            break
        ledger.shares[gpu.index] = ledger.shares.get(gpu.index, 0.0) + request.share
        ledger.share_owners.setdefault(gpu.index, []).append(where)
        slots.append(_Slot(
            label=f"GPU {gpu.index} ({request.share:g})", env={"CUDA_VISIBLE_DEVICES": gpu.uuid},
            device=cap.DeviceSpec(name=gpu.name, memory_bytes=gpu.memory_bytes),
            engine={"gpu_memory_utilization": request.share},
        ))
    return (slots, []) if not problems else ([], problems)


def _place_migs(entry: ModelEntry, where: str, inventory: Inventory, ledger: _Ledger) -> tuple[list[_Slot], list[str]]:
    wanted = entry.device_request.mig
    problems = []
    if entry.tensor_parallel_size not in (None, 1):
        problems.append("MIG instances cannot be combined (no peer access between them): tensor_parallel_size "
                        "must be 1, one instance per replica")
    named = [m for m in inventory.mig_instances if m.uuid in wanted]
    if named or any(w.startswith("MIG-") for w in wanted):
        unknown = [w for w in wanted if w not in {m.uuid for m in named}]
        if unknown:
            problems.append(f"this node has no MIG instance {', '.join(unknown)} (see `vllm-fleet gpus`)")
        problems += [f"{m.label} is also given to {ledger.mig[m.uuid]}" for m in named if m.uuid in ledger.mig]
        if len(wanted) != entry.replicas:
            problems.append(f"{entry.replicas} replicas but {len(wanted)} MIG instances listed; list one per replica")
        picked = named
    else:
        free = [m for m in inventory.mig_instances if m.mig_profile in wanted and m.uuid not in ledger.mig]
        if len(free) < entry.replicas:
            total = sum(1 for m in inventory.mig_instances if m.mig_profile in wanted)
            problems.append(f"{entry.replicas} replicas but {len(free)} free MIG instances of {', '.join(wanted)} "
                            f"({total} on this node): more replicas than devices")
        picked = free[:entry.replicas]
    for mig in picked:
        ledger.mig.setdefault(mig.uuid, where)
    if problems:
        return [], problems
    return [_Slot(label=m.label, device=cap.DeviceSpec(name=f"MIG {m.mig_profile}", memory_bytes=m.memory_bytes),
                  env={"CUDA_VISIBLE_DEVICES": m.uuid}, mig_profile=m.mig_profile,
                  engine={"gpu_memory_utilization": entry.gpu_memory_utilization}) for m in picked], []


def _place_cores(entry: ModelEntry, where: str, inventory: Inventory, ledger: _Ledger) -> tuple[list[_Slot], list[str]]:
    cores = entry.device_request.indices
    usable = set(inventory.cpu.cores) if inventory.cpu else set()
    problems = []
    missing = [c for c in cores if c not in usable]
    if missing:
        problems.append(f"cores {format_cores(missing)} are not among the cores this process may use "
                        f"({format_cores(sorted(usable)) or 'none'})")
    overlap: dict[str, list[int]] = {}
    for core in cores:
        if core in ledger.cores:
            overlap.setdefault(ledger.cores[core], []).append(core)
        ledger.cores.setdefault(core, where)
    problems += [f"cores {format_cores(c)} are also given to {holder} (workers must not share cores: they "
                 f"slow each other down)" for holder, c in overlap.items()]
    per_replica, split_problems = _split(len(cores), entry.replicas, "cores")
    problems += split_problems
    if problems:
        return [], problems
    slots = []
    for start in range(0, len(cores), per_replica):
        group = format_cores(cores[start:start + per_replica])
        slots.append(_Slot(label=f"cpu {group}", device=cap.DeviceSpec(name="cpu", kind="cpu", memory_bytes=0),
                           engine={"cpu_cores": group}))
    return slots, []


def _add_worker(plan: Plan, fleet: FleetFile, entry: ModelEntry, slot: _Slot, shape: ModelShape | None,
                inventory: Inventory, cpu_workers: int) -> str:
    """Capacity-check one replica and add it to the plan; returns the problem if it does not fit."""
    config = PlanConfig(engine=fleet.engine, model=entry.model, max_model_len=entry.max_model_len,
                        max_num_seqs=entry.max_num_seqs, enforce_eager=entry.enforce_eager, host=fleet.host,
                        engine_arg=list(entry.engine_arg), kv_cache_space_gb=entry.kv_cache_space_gb,
                        kv_events=entry.kv_events)
    fields = {**slot.engine, **entry.worker_options}
    device = slot.device
    if device.kind == "cpu":
        kv_gib = entry.kv_cache_space_gb or default_kv_gib(shape, config)
        fields["kv_cache_space_gb"] = kv_gib
        # CPU workers of every model split the machine's memory.
        memory = (inventory.cpu.memory_bytes if inventory.cpu else 0) // max(1, cpu_workers)
        device = cap.DeviceSpec(name="cpu", kind="cpu", memory_bytes=memory, kv_cache_space_bytes=kv_gib * cap.GiB)
    if entry.served_model_name:
        fields["served_model_name"] = entry.served_model_name
    spec = WorkerSpec(worker_id=node_worker_id(len(plan.workers)), device=slot.label, port=0, host=fleet.host,
                      engine=engine_config(config, **fields), env=slot.env, mig_profile=slot.mig_profile,
                      pool=entry.pool)
    if shape is not None:
        settings = cap.EngineSettings(
            max_model_len=entry.max_model_len, max_num_seqs=entry.max_num_seqs,
            gpu_memory_utilization=float(fields.get("gpu_memory_utilization", entry.gpu_memory_utilization)),
            tensor_parallel_size=int(fields.get("tensor_parallel_size", 1)), enforce_eager=entry.enforce_eager,
        )
        spec.capacity = cap.estimate(shape, device, settings)
        if not spec.capacity.fits:
            return "; ".join(spec.capacity.problems)
    plan.workers.append(spec)
    return ""
