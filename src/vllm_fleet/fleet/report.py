"""Text tables for `vllm-fleet gpus` and `vllm-fleet plan` (kept apart from the math)."""

from __future__ import annotations

from vllm_fleet.fleet.capacity import Capacity, GiB
from vllm_fleet.fleet.gpus import Inventory
from vllm_fleet.fleet.plan import Plan


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def inventory_text(inventory: Inventory) -> str:
    rows = []
    for d in inventory.devices:
        state = "MIG mode (use its instances)" if d.mig_enabled else ("usable" if d.kind != "cpu" else "")
        rows.append([d.label, d.name if d.kind == "gpu" else d.parent_name, d.mig_profile or "-",
                     f"{d.memory_bytes / GiB:.1f} GiB" if d.memory_bytes else "?", d.uuid, state])
    text = f"devices (from {inventory.source}):\n"
    if rows:
        text += _table(["device", "name", "MIG", "memory", "UUID", "state"], rows) + "\n"
    else:
        text += "  no GPU\n"
    if inventory.cpu:
        cpu = inventory.cpu
        text += f"cpu: {len(cpu.cores)} cores ({cpu.label[4:]}), {cpu.memory_bytes / GiB:.1f} GiB memory\n"
    return text


def plan_text(plan: Plan) -> str:
    rows = []
    for w in plan.workers:
        c = w.capacity
        binding = w.env.get("CUDA_VISIBLE_DEVICES") or f"cores {w.engine.cpu_cores or 'any'}"
        if w.engine.kv_cache_space_gb:
            binding += f", KV {w.engine.kv_cache_space_gb:g} GiB"
        rows.append([w.worker_id, w.address, w.device, binding,
                     f"{c.kv_tokens:,}" if c else "-", f"{c.max_model_len:,}" if c else "-",
                     str(c.concurrent_sequences(c.max_model_len)) if c else "-"])
    header = ["worker", "address", "device", "binding", "KV tokens", "max_model_len", "full-length seqs"]
    names = [w.engine.served_model_name or w.engine.model or "default" for w in plan.workers]
    if len(set(names)) > 1 or any(w.pool for w in plan.workers):  # a fleet file: which model, which pool
        header[1:1] = ["model", "pool"]
        rows = [[row[0], name, w.pool or "any", *row[1:]] for row, name, w in zip(rows, names, plan.workers)]
    text = f"plan for {plan.model} ({len(plan.workers)} workers, devices from {plan.source}):\n"
    text += _table(header, rows)
    for note in plan.notes:
        text += f"\nnote: {note}"
    return text + "\n"


def capacity_text(capacity: Capacity) -> str:
    lines = [
        f"model {capacity.model} on {capacity.device}",
        f"  weights           {capacity.weight_bytes / GiB:8.2f} GiB",
        f"  reserve           {capacity.reserve_bytes / GiB:8.2f} GiB  (activation, CUDA graphs, runtime)",
        f"  KV budget         {capacity.kv_budget_bytes / GiB:8.2f} GiB",
        f"  KV per token      {capacity.kv_bytes_per_token / 1024:8.1f} KiB",
    ]
    if capacity.state_bytes_per_seq:
        lines.append(f"  state per seq     {capacity.state_bytes_per_seq / 1024**2:8.1f} MiB  (Gated DeltaNet)")
    lines += [
        f"  KV tokens         {capacity.kv_tokens:8,}  ({capacity.num_blocks:,} blocks of {capacity.block_size})",
        "",
        _table(["max_model_len", "sequences at full length"], [[f"{n:,}", str(s)] for n, s in capacity.table()]),
    ]
    if capacity.problems:
        lines += ["", "does not fit:"] + [f"  - {p}" for p in capacity.problems]
    return "\n".join(lines) + "\n"
