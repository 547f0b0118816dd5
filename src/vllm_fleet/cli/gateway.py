"""`vllm-fleet gateway`: the OpenAI-compatible HTTP gateway; `vllm-fleet gateway keys ...` manages API keys."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from vllm_fleet.config import add_options, from_args
from vllm_fleet.errors import ConfigError

if TYPE_CHECKING:  # the CLI imports the heavy parts only for the command that runs
    from vllm_fleet.gateway.config import GatewayConfig
    from vllm_fleet.gateway.reload import LimitsSource
    from vllm_fleet.registry import Registry
    from vllm_fleet.router import RouterConfig


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "gateway", help="Serve the OpenAI-compatible HTTP API in front of the workers",
        description="Serve /v1/chat/completions, /v1/completions and /v1/models from a fleet of workers. "
        "Without --api-key-file the gateway listens on loopback only.",
    )
    from vllm_fleet.gateway.config import GatewayConfig  # starlette-free, cheap
    from vllm_fleet.router.config import add_router_options

    source = parser.add_argument_group("workers")
    source.add_argument("--workers", help="Static worker list: host:port[,host:port...]")
    source.add_argument("--registry", help="Registry: zk://host:port[,host:port]/cluster")
    group = parser.add_argument_group("gateway")
    add_options(group, GatewayConfig)
    group.add_argument("--processes", type=int, default=1, metavar="N",
                       help="Serve from N gateway processes on one port (SO_REUSEPORT), one core each; each has "
                       "its own router, breakers and in-flight counts; per-key limits hold for all N together, "
                       "and /metrics and the dashboard add up all N. Default 1")
    add_router_options(parser)
    parser.set_defaults(handler=_serve)
    _register_keys(parser.add_subparsers(dest="gateway_command", metavar="keys"))


def _serve(args: argparse.Namespace) -> int:
    from vllm_fleet.gateway.config import GatewayConfig
    from vllm_fleet.registry import open_registry
    from vllm_fleet.router.config import router_config_from_args

    if bool(args.workers) == bool(args.registry):
        raise ConfigError("pass exactly one of --workers host:port[,...] or --registry zk://...")
    config = from_args(GatewayConfig, args)
    router_config = router_config_from_args(args)
    limits = _limits_source(args, router_config)
    if args.processes != 1:
        from vllm_fleet.gateway.multiprocess import Supervisor

        def child(slot, port: int, listening) -> int:  # a forked process: its own registry and router
            registry = open_registry(args.registry or args.workers)
            return _run(_serve_async(config.model_copy(update={"port": port}), router_config, registry, limits,
                                     reuse_port=True, on_listening=listening, sibling_slot=slot))

        return Supervisor(child, args.processes, config.host, config.port).run()
    registry = open_registry(args.registry or args.workers)
    return _run(_serve_async(config, router_config, registry, limits))


def _limits_source(args: argparse.Namespace, router_config: RouterConfig) -> LimitsSource:
    """Per-key limits as the command line gives them; with `--key-limits @FILE`, read again
    from the file on each reload, and the file watched."""
    from vllm_fleet.gateway.reload import LimitsSource
    from vllm_fleet.router.config import router_config_from_args

    key_limits = getattr(args, "key_limits", None)
    if not key_limits or not key_limits.startswith("@"):
        return LimitsSource.fixed(router_config.admission)
    return LimitsSource(read=lambda: router_config_from_args(args).admission, path=Path(key_limits[1:]))


def _run(coro) -> int:
    try:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    except ImportError:  # uvloop is optional on platforms without it
        return asyncio.run(coro)


async def _serve_async(config: GatewayConfig, router_config: RouterConfig, registry: Registry,
                       limits: LimitsSource, *, reuse_port: bool = False, on_listening=None,
                       sibling_slot=None) -> int:
    from vllm_fleet.gateway.server import GatewayServer

    server = GatewayServer(config, router_config, registry, limits=limits, reuse_port=reuse_port,
                           sibling_slot=sibling_slot)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # SIGHUP re-reads the keys file and --key-limits @FILE (its default action would end us).
    loop.add_signal_handler(signal.SIGHUP, server.reload)
    await server.start()
    from vllm_fleet.heap import settle_garbage_collector

    settle_garbage_collector()  # everything the gateway keeps is loaded: take it out of the GC's scans
    print(f"vllm-fleet gateway: listening on {server.url}", file=sys.stderr, flush=True)
    if on_listening is not None:
        on_listening()
    waiter = asyncio.ensure_future(server.wait())
    await asyncio.wait({waiter, asyncio.ensure_future(stop.wait())}, return_when=asyncio.FIRST_COMPLETED)
    await server.stop()
    return 0


# -- keys ---------------------------------------------------------------------------------


def _register_keys(subparsers) -> None:
    keys = subparsers.add_parser("keys", help="Manage the API keys file (hashed keys with per-key limits)")
    actions = keys.add_subparsers(dest="keys_command", metavar="add|revoke|list", required=True)
    add = actions.add_parser("add", help="Create a key; prints it once (only its sha256 is stored)")
    add.add_argument("--file", required=True, help="Keys file (created if missing)")
    add.add_argument("--id", required=True, help="Name of the key, shown in logs and metrics")
    add.add_argument("--requests-per-min", type=float, help="Requests this key may start per minute")
    add.add_argument("--tokens-per-min", type=float, help="Tokens this key may use per minute")
    add.add_argument("--admin", action="store_true", help="May also read /metrics and the dashboard data")
    add.set_defaults(handler=_keys_add)
    revoke = actions.add_parser("revoke", help="Remove a key; running gateways drop it within --reload-interval-s "
                                "(or at once on SIGHUP)")
    revoke.add_argument("--file", required=True)
    revoke.add_argument("--id", required=True)
    revoke.set_defaults(handler=_keys_revoke)
    listing = actions.add_parser("list", help="Show key ids, limits and admin flags (never keys)")
    listing.add_argument("--file", required=True)
    listing.set_defaults(handler=_keys_list)


def _keys_add(args: argparse.Namespace) -> int:
    from vllm_fleet.gateway.keys import KeyRecord, hash_key, new_key, read_keys, write_keys
    from vllm_fleet.router.config import KeyLimits

    path = Path(args.file)
    records = read_keys(path) if path.exists() else []
    if any(r.id == args.id for r in records):
        raise ConfigError(f"key id {args.id!r} already exists in {path}; revoke it first or pick another id")
    limits = {k: v for k, v in {"requests_per_min": args.requests_per_min,
                                "tokens_per_min": args.tokens_per_min}.items() if v is not None}
    KeyLimits(**limits)  # validate now rather than when the gateway loads the file
    key = new_key()
    write_keys(path, [*records, KeyRecord(id=args.id, sha256=hash_key(key), limits=limits, admin=args.admin)])
    print(key)
    print(f"added key {args.id!r} to {path}; the key is shown only now", file=sys.stderr)
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    from vllm_fleet.gateway.keys import read_keys, write_keys

    records = read_keys(args.file)
    kept = [r for r in records if r.id != args.id]
    if len(kept) == len(records):
        raise ConfigError(f"no key {args.id!r} in {args.file}")
    write_keys(args.file, kept)
    print(f"revoked key {args.id!r}", file=sys.stderr)
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    from vllm_fleet.gateway.keys import read_keys

    for record in read_keys(args.file):
        limits = ", ".join(f"{k}={v:g}" for k, v in record.limits.items()) or "no limits"
        admin = "\tadmin" if record.admin else ""
        print(f"{record.id}\t{limits}{admin}")
    return 0
