"""`vllm-fleet <command>`. Each command lives in its own module in this package and exposes
`register(subparsers)`; modules are discovered, so adding a command touches no shared file."""

from __future__ import annotations

import argparse
import importlib
import logging
import pkgutil
import sys

# Before anything below imports grpc: gRPC's core reads its settings once, at import.
from vllm_fleet.grpc_env import apply_command_defaults  # isort: skip

from vllm_fleet import __version__  # noqa: E402
from vllm_fleet.config import env_parent_pid  # noqa: E402
from vllm_fleet.errors import FleetError  # noqa: E402
from vllm_fleet.logs import setup_logging  # noqa: E402
from vllm_fleet.processes import die_with_parent  # noqa: E402


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
        try:
            module = importlib.import_module(f"{__name__}.{module_info.name}")
        except ImportError as exc:
            # A command whose optional extra is not installed (e.g. spark-run without pyspark on a
            # GPU node) must not take the other commands down with it.
            _register_unavailable(subparsers, module_info.name, exc)
            continue
        if hasattr(module, "register"):
            module.register(subparsers)
    return parser


def _register_unavailable(subparsers: argparse._SubParsersAction, module_name: str, exc: ImportError) -> None:
    command = module_name.replace("_", "-")
    missing = exc.name or str(exc)
    parser = subparsers.add_parser(command, help=f"(unavailable: needs {missing})", add_help=False,
                                   prefix_chars="\0")  # take every argument as-is: the error comes first
    parser.add_argument("rest", nargs="*")

    def unavailable(args: argparse.Namespace) -> int:
        raise FleetError(f"this command needs the Python package {missing!r}, which is not installed "
                         f"(install the extra that provides it, e.g. pip install 'vllm-fleet[spark]')")

    parser.set_defaults(handler=unavailable)


def main(argv: list[str] | None = None) -> int:
    applied = apply_command_defaults(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    setup_logging(args.log_level, json_lines=args.log_json)
    for name, value in applied.items():  # say so: an operator comparing runs must see it
        logging.getLogger(__name__).info("%s=%s set for %s (set the variable yourself to choose; empty keeps "
                                         "grpc's defaults)", name, value, args.command)
    parent_pid = env_parent_pid()
    if parent_pid is not None:  # started by a supervisor that wants us gone when it dies
        die_with_parent(parent_pid)
    try:
        return int(args.handler(args) or 0)
    except FleetError as exc:
        print(f"vllm-fleet {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
