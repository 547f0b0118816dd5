"""`vllm-fleet demo`: a real worker on the default model, a few streamed answers, clean exit.

The worker runs as a child process, exactly as `vllm-fleet worker` would, and is reached over
gRPC; on exit (normal, error or Ctrl-C) it is drained and its whole process group is reaped.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from vllm_fleet.client import WorkerClient
from vllm_fleet.errors import ProcessStartError
from vllm_fleet.fleet.worker_process import WorkerProcess
from vllm_fleet.protocol import ChatMessage, GenerateInput, SamplingParams, build_request

# Questions the packaged 135M model answers right in float32 on AVX2 and AMX alike. It was trained
# on English: a Chinese question got a repeated phrase in every dtype (RESULTS, issue #27), so the
# demo no longer asks one; non-ASCII streaming is tested on the real engine (tests/chaos).
DEMO_PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for writing clear code.",
    "Explain in one sentence what a GPU is.",
]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo", help="Start a worker on the default model and stream a few answers",
        description="Starts a real vLLM worker (CPU, SmolLM2-135M-Instruct unless --model), streams answers "
                    "to a few prompts, prints TTFT and tokens/s, and shuts everything down.",
    )
    parser.add_argument("--model", default=None, help="HF id or folder (default: the packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--engine", default="vllm", choices=["vllm", "mock"], help="Engine (default: vllm)")
    parser.add_argument("--prompt", action="append", help="A prompt to ask (repeatable; default: three built-in ones)")
    parser.add_argument("--max-tokens", type=int, default=96, help="Tokens per answer (default: 96)")
    parser.add_argument("--start-timeout", type=float, default=600, help="Seconds to wait for the engine (default: 600)")
    parser.add_argument("--worker-arg", action="append", default=[],
                        help="Extra option for the worker, e.g. --worker-arg=--max-model-len=4096 (repeatable)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    options = ["--engine", args.engine, "--enforce-eager", "--max-model-len", "2048", *args.worker_arg]
    if args.model:
        options += ["--model", args.model]
    worker = WorkerProcess(options)
    print(f"Starting a {args.engine} worker on {worker.address} (log: {worker.log_path}); "
          f"the first start converts the default model and takes a minute or two...", flush=True)
    worker.start()
    try:
        return asyncio.run(_demo(worker, args))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        worker.stop()  # drain, then reap the group (vLLM's engine core included)
        print("Worker stopped; no process left behind.", flush=True)


async def _demo(worker: WorkerProcess, args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        await worker.wait_serving(args.start_timeout)
    except ProcessStartError as exc:
        print(f"The worker did not start: {exc}", file=sys.stderr)
        return 1
    async with WorkerClient(worker.address) as client:
        info = await client.info()
        dtype = f", dtype {info.settings['dtype']} ({info.settings['dtype_reason']})" if "dtype_reason" in info.settings else ""
        print(f"Worker ready in {time.monotonic() - started:.0f}s: model {info.model} "
              f"(engine {info.engine} {info.engine_version}, context {info.max_model_len} tokens{dtype})\n")
        for number, prompt in enumerate(args.prompt or DEMO_PROMPTS, 1):
            await _ask(client, f"demo-{number}", prompt, args.max_tokens)
    return 0


async def _ask(client: WorkerClient, request_id: str, prompt: str, max_tokens: int) -> None:
    print(f"\033[1m> {prompt}\033[0m", flush=True)
    request = build_request(request_id, [GenerateInput(messages=[ChatMessage("user", prompt)])],
                            SamplingParams(temperature=0.0, max_tokens=max_tokens))
    sent = time.monotonic()
    first: float | None = None
    tokens = 0
    async for chunk in client.generate(request, timeout=300):
        if first is None and chunk.token_ids:
            first = time.monotonic()
        tokens += len(chunk.token_ids)
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
    done = time.monotonic()
    ttft = (first or done) - sent
    rate = (tokens - 1) / (done - first) if first and tokens > 1 and done > first else 0.0
    print(f"\n\033[2m[TTFT {ttft * 1000:.0f} ms · {tokens} tokens · {rate:.1f} tokens/s]\033[0m\n", flush=True)

