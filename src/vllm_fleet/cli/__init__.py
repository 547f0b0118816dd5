"""`vllm-fleet <command>`. Each command lives in its own module in this package and exposes
`register(subparsers)`; modules are discovered, so adding a command touches no shared file."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from vllm_fleet import __version__
from vllm_fleet.errors import FleetError
from vllm_fleet.logs import setup_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vllm-fleet",
        description="Serve LLMs from a fleet of vLLM workers: gRPC workers, an OpenAI gateway, Spark, benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"vllm-fleet {__version__}")
    parser.add_argument("--log-level", default=None, help="DEBUG, INFO, WARNING, ERROR (default: $VLLM_FLEET_LOG_LEVEL or INFO)")
    parser.add_argument("--log-json", action="store_true", help="Log one JSON object per line")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        if hasattr(module, "register"):
            module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    setup_logging(args.log_level, json_lines=args.log_json)
    try:
        return int(args.handler(args) or 0)
    except FleetError as exc:
        print(f"vllm-fleet {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
