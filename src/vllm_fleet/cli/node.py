"""`vllm-fleet node`: run this node's planned workers, registered, restarted, drained on SIGTERM."""

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
    add_options(parser.add_argument_group("plan"), PlanConfig)
    add_options(parser.add_argument_group("supervisor"), SupervisorConfig)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vllm_fleet.errors import ConfigError
    from vllm_fleet.fleet.config import PlanConfig, SupervisorConfig
    from vllm_fleet.fleet.gpus import discover
    from vllm_fleet.fleet.plan import build_plan
    from vllm_fleet.fleet.report import plan_text

    plan = build_plan(discover(), from_args(PlanConfig, args))
    print(plan_text(plan), flush=True)
    if args.dry_run:
        return 0
    if args.registry and not args.registry.startswith("zk://"):
        raise ConfigError("--registry must be zk://host:port/cluster: a static list cannot accept registrations")
    return asyncio.run(_main(plan, from_args(SupervisorConfig, args), args.registry))


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
