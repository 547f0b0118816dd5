"""The two workers of the cache-routing benchmarks (cache_routing.py, cache_routing_vllm_bench.py)
and the options that pick them: real vLLM engines on CPU cores 0 and 1 or on GPUs
(`--cuda-devices`), or mock engines with a simulated prefix cache (`--workers mock`, for rehearsing
a run's sequence; their times are a model, not an engine). Every kind has prefix caching on and
its KV cache capped at the benchmark's `--kv-blocks` blocks, so that one worker cannot hold every
prefix but the pair can.

    async with cache_pair(args) as (addresses, info): ...
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from worker_pair import worker_pair
from vllm_fleet.fleet.worker_process import WorkerProcess, small_vllm_args
from vllm_fleet.models import resolve_model


def add_worker_options(parser: argparse.ArgumentParser) -> None:
    """--workers, --max-model-len, the mock engines' options and the "GPU workers" group. Each
    benchmark keeps its own --kv-blocks: their defaults differ."""
    parser.add_argument("--workers", choices=("vllm", "mock"), default="vllm",
                        help="mock: rehearse the sequence on mock engines, no figures")
    parser.add_argument("--max-model-len", type=int, default=4096)
    mock = parser.add_argument_group("mock workers")
    mock.add_argument("--block-size", type=int, default=128,
                      help="mock workers only (vLLM's CPU block is 128 tokens, its GPU block 16)")
    mock.add_argument("--mock-prefill-tokens-per-s", type=int, default=4000)
    mock.add_argument("--mock-max-num-seqs", type=int, default=4)
    mock.add_argument("--mock-prefill-serial", action="store_true",
                      help="prompts prefill one at a time per mock engine, as on a GPU (a long one delays the rest)")
    gpu = parser.add_argument_group("GPU workers")
    gpu.add_argument("--cuda-devices", type=two_devices, default=None, metavar="D0,D1",
                     help="One CUDA_VISIBLE_DEVICES value per worker (0,0: both on GPU 0) instead of CPU cores")
    gpu.add_argument("--model", default=None, help="Worker --model (a folder); default: the packaged model")
    gpu.add_argument("--tokenizer", default=None,
                     help="The tokenizer folder of the client side (its prompts, the best possible cached share) "
                          "and of mock workers (default: --model, else the packaged model)")
    gpu.add_argument("--worker-arg", action="append", default=[], metavar="ARG", help="Added to each worker's command line")
    gpu.add_argument("--python", default=sys.executable, help="Interpreter that runs the workers")
    gpu.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="Added to each worker's environment")


def two_devices(value: str) -> list[str]:
    devices = value.split(",")
    if len(devices) != 2 or not all(devices):
        raise argparse.ArgumentTypeError(f"{value!r}: give two CUDA_VISIBLE_DEVICES values, one per worker (e.g. 0,0)")
    return devices


def tokenizer_folder(args: argparse.Namespace) -> str:
    return args.tokenizer or args.model or resolve_model(None, None).path


def worker(cores: str, args: argparse.Namespace) -> WorkerProcess:
    """Worker `cores` ("0" or "1") of the pair: with --cuda-devices a vLLM engine on that entry's
    GPU, else a vLLM or mock engine bound to that CPU core."""
    env = {"VLLM_FLEET_LOG_LEVEL": "WARNING"}
    if args.workers == "vllm" or args.cuda_devices:
        cache = [*small_vllm_args(max_model_len=args.max_model_len), *(["--model", args.model] if args.model else []),
                 "--enable-prefix-caching", "--kv-events",  # cache routing follows the events (off by default)
                 "--engine-arg", f"num_gpu_blocks_override={args.kv_blocks}"]
        if not args.cuda_devices:
            return WorkerProcess(cache, env, cores=cores, log_path=f"/tmp/cache-routing-worker-{cores}.log")
        env |= {"CUDA_VISIBLE_DEVICES": args.cuda_devices[int(cores)], **dict(item.split("=", 1) for item in args.env)}
        return WorkerProcess([*cache, *args.worker_arg], env, python=args.python,
                             log_path=f"/tmp/cache-bench-worker-gpu{cores}.log")
    prefill_ms_per_1k = 1e6 / args.mock_prefill_tokens_per_s
    return WorkerProcess(["--engine", "mock", "--mock-kv-blocks", str(args.kv_blocks), "--block-size",
                          str(args.block_size), "--mock-prefill-ms-per-1k", f"{prefill_ms_per_1k:g}",
                          "--mock-tokens-per-s", "50", "--mock-ttft-ms", "5", "--max-model-len", str(args.max_model_len),
                          "--max-num-seqs", str(args.mock_max_num_seqs), "--mock-tokenizer", tokenizer_folder(args),
                          *(["--mock-prefill-serial"] if args.mock_prefill_serial else [])],
                         env, cores=cores, log_path=f"/tmp/cache-routing-mock-{cores}.log")


def cache_pair(args: argparse.Namespace) -> contextlib.AbstractAsyncContextManager:
    """worker_pair of `worker`s. Two vLLM engines on one GPU start one after another (worker_pair says why)."""
    return worker_pair(lambda cores: worker(cores, args), cuda_devices=args.cuda_devices)
