"""SMG (`smg launch --policy ...`) in front of two vLLM engines under vLLM's own gRPC launcher,
with the engine settings of gpu_pair.py's worker pair: the side SMG brings to the routing
benchmarks of issue #26 (cache_routing.py, cache_routing_vllm_bench.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "smg"))
from stacks import SERVED_NAME, Stack, start_smg, vllm_flags  # noqa: E402

SMG_SYSTEMS = {"smg_cache_aware": "cache_aware"}  # system name -> `smg launch --policy`


def add_smg_options(parser: argparse.ArgumentParser) -> None:
    smg = parser.add_argument_group("SMG systems (smg_cache_aware in --policies)")
    smg.add_argument("--smg-site", default=str(Path.home() / ".cache/vllm-fleet/smg-site"),
                     help="Where benchmarks/smg/install.sh (or gpu/stage.sh install) put SMG and its vLLM "
                          "servicer; first on its engines' and gateway's PYTHONPATH, before this one's")
    smg.add_argument("--smg-arg", action="append", default=[], help="Extra `smg launch` argument (repeatable)")
    smg.add_argument("--smg-logs", default="/tmp/cache-bench-smg", help="Folder for SMG's and its engines' logs")


def served_name(args: argparse.Namespace) -> str:
    return Path(args.model).name if args.model else SERVED_NAME  # as our worker names a folder


def smg_settings(system: str, args: argparse.Namespace) -> argparse.Namespace:
    """start_smg's settings for our pair's engine settings: --model, enforce-eager
    (small_vllm_args), the same max-model-len, prefix caching, --kv-blocks blocks, step budget and
    KV-cache events on (SMG's event mode reads them through the servicer). On CPU: cores 0 and 1,
    float32 (what our worker picks there). With --cuda-devices: one engine per entry (one after
    another when they share a GPU), dtype auto (our worker's choice on a GPU), --env, and
    --worker-arg as vLLM flags."""
    on_gpu = bool(args.cuda_devices)
    # Our worker builds its engine as AsyncLLM does by default (usage context ENGINE_CONTEXT:
    # SchedulerConfig's 2048 tokens a step, 128 sequences; its GPU log: "max_num_batched_tokens=2048");
    # vLLM's gRPC server builds it as its OpenAI server does: 8192 and 1024 on an H200 (2048 and
    # 128 on CPU). Spelled out so both sides schedule alike; a --worker-arg later on the line wins.
    step = ["--max-num-batched-tokens", "2048", "--max-num-seqs", "128"]
    extra_env = dict(item.split("=", 1) for item in args.env) if on_gpu else {}  # our GPU workers' --env
    return argparse.Namespace(
        python=args.python, smg_site=args.smg_site, smg_warmup="off", smg_bind="cores", cores=["0", "1"],
        cuda_devices=args.cuda_devices, extra_engine_env=extra_env,
        kv_cache_gb=1, dtype="auto" if on_gpu else "float32", max_model_len=args.max_model_len, max_num_seqs=None,
        served_name=served_name(args), smg_policy=SMG_SYSTEMS[system], smg_arg=args.smg_arg, start_timeout=600.0,
        smg_engine_arg=["--enable-prefix-caching", "--num-gpu-blocks-override", str(args.kv_blocks), *step,
                        "--kv-events-config", json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                                          "endpoint": "tcp://127.0.0.1:{port}"}),
                        *(vllm_flags(args.worker_arg) if on_gpu else [])])


@contextlib.asynccontextmanager
async def smg_running(system: str, model_path: str, args: argparse.Namespace) -> AsyncIterator[str]:
    """SMG's gateway URL while its stack runs; its index metrics printed after the run. Its
    engines are fresh, with no earlier policy's blocks, and are not ours: no Load RPC there, so
    the engines' cached share is whatever its responses' usage says (n/a when absent)."""
    logs = Path(args.smg_logs)
    logs.mkdir(parents=True, exist_ok=True)
    stack = Stack("smg")
    try:
        await start_smg(smg_settings(system, args), args.model or model_path, logs, stack)
        yield stack.url
        print_smg_index(logs / "smg-gateway.log")
    finally:
        await stack.stop()


def print_smg_index(gateway_log: Path) -> None:
    """SMG's own Prometheus lines about its cache index and KV events after the run: whether its
    event-mode index held anything (the engines' cached share is not readable on this side)."""
    # The log is appended to by every run: this run's gateway is the last one that says its port.
    ports = re.findall(r"Metrics server listening on [0-9.]+:(\d+)", re.sub(r"\x1b\[[0-9;]*m", "", gateway_log.read_text()))
    if not ports:
        print("SMG metrics: port not found in its log")
        return
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{ports[-1]}/metrics", timeout=10).read().decode()
    except OSError as exc:  # a report of its state: never worth the run's figures
        print(f"SMG metrics: not read ({exc})")
        return
    lines = [l for l in text.splitlines() if not l.startswith("#") and re.search(r"kv|tree|cache|event|block|route|worker_requests", l, re.I)]
    print("SMG metrics (cache index, KV events, routing):", *lines[:80], sep="\n  ")
