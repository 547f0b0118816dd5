"""`vllm-fleet worker`: one engine behind the gRPC worker service."""

from __future__ import annotations

import argparse
import asyncio

from vllm_fleet.config import EngineConfig, WorkerConfig, add_options, from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "worker", help="Run one vLLM worker (gRPC)",
        description="Serve one engine over gRPC. vLLM options (--dtype, --max-model-len, ...) pass through; "
                    "anything else with --engine-arg key=value.",
    )
    add_options(parser.add_argument_group("worker"), WorkerConfig)
    add_options(parser.add_argument_group("engine"), EngineConfig)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    worker_config = from_args(WorkerConfig, args)
    engine_config = from_args(EngineConfig, args)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(_main(worker_config, engine_config))


async def _main(worker_config: WorkerConfig, engine_config: EngineConfig) -> int:
    from vllm_fleet.worker import run_worker

    return await run_worker(worker_config, engine_config)
