"""`vllm-fleet gpus`: the devices of this node and the workers a plan would put on them."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from vllm_fleet.config import add_options, from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    from vllm_fleet.fleet.config import PlanConfig

    parser = subparsers.add_parser(
        "gpus", help="List GPUs / MIG instances / CPU and the worker plan for them",
        description="Discover devices (NVML, else nvidia-smi, else CPU) and show where `vllm-fleet node` would "
                    "start workers. --nvidia-smi-listing plans for another machine from its recorded output.",
    )
    parser.add_argument("--nvidia-smi-listing", metavar="FILE",
                        help="Use this saved `nvidia-smi -L` output instead of this machine's devices")
    parser.add_argument("--nvidia-smi-query", metavar="FILE",
                        help="With --nvidia-smi-listing: saved `nvidia-smi --query-gpu=index,name,uuid,memory.total "
                             "--format=csv,noheader,nounits` output (whole-GPU memory)")
    parser.add_argument("--no-plan", action="store_true", help="Only list devices")
    parser.add_argument("--json", action="store_true", help="Print JSON instead of tables")
    add_options(parser.add_argument_group("plan"), PlanConfig)
    parser.set_defaults(handler=run)


def load_inventory(args: argparse.Namespace):
    from vllm_fleet.fleet.gpus import Inventory, cpu_device, discover, parse_nvidia_smi

    if not args.nvidia_smi_listing:
        return discover()
    listing = Path(args.nvidia_smi_listing).read_text()
    query = Path(args.nvidia_smi_query).read_text() if args.nvidia_smi_query else ""
    return Inventory(source=f"file {args.nvidia_smi_listing}", devices=tuple(parse_nvidia_smi(listing, query)),
                     cpu=cpu_device())


def _plan(inventory, config):
    """The plan `vllm-fleet node` would run. The model's config.json is looked up where the workers'
    vLLM would find the model (HF_HUB_CACHE / HF_HOME), so there is no --hf-cache here."""
    from vllm_fleet.fleet.model_shape import load_shape
    from vllm_fleet.fleet.plan import build_plan

    shape = load_shape(config.model) if config.engine == "vllm" else None
    plan = build_plan(inventory, config, shape)
    if shape is not None and shape.from_builtin:
        plan.notes.append(f"model config from {shape.source}")
    return plan


def run(args: argparse.Namespace) -> int:
    from vllm_fleet.fleet.config import PlanConfig
    from vllm_fleet.fleet.report import inventory_text, plan_text

    inventory = load_inventory(args)
    plan = None if args.no_plan else _plan(inventory, from_args(PlanConfig, args))
    if args.json:
        out = {"source": inventory.source, "devices": [asdict(d) for d in inventory.devices],
               "cpu": asdict(inventory.cpu) if inventory.cpu else None}
        if plan:
            out["plan"] = [{"worker_id": w.worker_id, "address": w.address, "device": w.device, "env": w.env,
                            "argv": w.argv(), "capacity": w.capacity_summary()} for w in plan.workers]
            out["notes"] = plan.notes
        print(json.dumps(out, indent=2))
        return 0
    print(inventory_text(inventory))
    if plan:
        print(plan_text(plan))
    return 0
