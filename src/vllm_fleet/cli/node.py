"""`vllm-fleet node`: run this node's planned workers, registered, restarted, drained on SIGTERM.

One model over the node's devices (`--model` and the plan options), or several models from a
fleet file (`--fleet-file`: fleet/fleet_file.py), each on its own devices and in its own pool.
"""

from __future__ import annotations

import argparse
import asyncio

from vllm_fleet.config import add_options, from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    from vllm_fleet.fleet.config import PlanConfig, SupervisorConfig

    parser = subparsers.add_parser(
        "node", help="Start and supervise this node's workers (plan → start → register → restart)",
        description="Discover devices, plan workers (checked against the capacity model), start them with their "
                    "CUDA_VISIBLE_DEVICES / CPU cores, register them, restart crashed ones with backoff, and drain "
                    "everything on SIGTERM.",
    )
    parser.add_argument("--registry", default=None,
                        help="zk://host:port[,host:port]/cluster to register workers in (default: no registration)")
    parser.add_argument("--dry-run", action="store_true", help="Print the plan and exit")
    parser.add_argument("--fleet-file", metavar="PATH", default=None,
                        help="YAML or JSON file of several models (replicas, devices, pool, engine settings each); "
                             "replaces --model and the other plan options. Refused as a whole, with every problem "
                             "listed, when it does not fit this node's devices")
    add_options(parser.add_argument_group("plan"), PlanConfig)
    add_options(parser.add_argument_group("supervisor"), SupervisorConfig)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vllm_fleet.errors import ConfigError
    from vllm_fleet.fleet.config import PlanConfig, SupervisorConfig
    from vllm_fleet.fleet.gpus import discover
    from vllm_fleet.fleet.plan import build_plan
    from vllm_fleet.fleet.report import plan_text

    registry = args.registry
    if args.fleet_file:
        plan, registry = _fleet_plan(args)
    else:
        plan = build_plan(discover(), from_args(PlanConfig, args))
    print(plan_text(plan), flush=True)
    if args.dry_run:
        return 0
    if registry and not registry.startswith("zk://"):
        raise ConfigError("--registry must be zk://host:port/cluster: a static list cannot accept registrations")
    return asyncio.run(_main(plan, from_args(SupervisorConfig, args), registry))


def _fleet_plan(args: argparse.Namespace):
    """The plan of `--fleet-file`, and the registry (--registry, else the file's)."""
    from vllm_fleet.errors import ConfigError
    from vllm_fleet.fleet.config import PlanConfig
    from vllm_fleet.fleet.fleet_file import load_fleet_file
    from vllm_fleet.fleet.fleet_plan import build_fleet_plan
    from vllm_fleet.fleet.gpus import discover

    # Plan options would be silently ignored beside a fleet file: refuse them instead.
    given = ["--" + name.replace("_", "-") for name in PlanConfig.model_fields if hasattr(args, name)]
    if given:
        raise ConfigError(f"--fleet-file replaces the plan options; move {', '.join(given)} into the fleet file "
                          f"(--model is mutually exclusive with --fleet-file)")
    fleet = load_fleet_file(args.fleet_file)
    return build_fleet_plan(discover(), fleet), args.registry or fleet.registry


async def _main(plan, config, registry_spec: str | None) -> int:
    from vllm_fleet.fleet.supervisor import NodeSupervisor
    from vllm_fleet.registry import open_registry

    registry = open_registry(registry_spec) if registry_spec else None
    if registry is not None:
        await registry.start()
    try:
        await NodeSupervisor(plan, registry, config).run_until_signal()
    finally:
        if registry is not None:
            await registry.close()
    return 0
