"""vLLM's AsyncLLM in this process, measured by `vllm-fleet bench`'s own runner: the baseline
with no server, no network and no serialization, for the (c)/(a) ratio of the GPU comparison.

The engine is built from the same `EngineConfig` and `engine_kwargs` our worker uses, so the
settings cannot drift; the runner, workload, arrivals and metrics are the bench's, so the figures
mean the same as every other report. Tokens are timed as the engine yields them (DELTA outputs).

    python benchmarks/gpu/inprocess_bench.py --model DIR --load-format dummy --max-model-len 4096 \\
        --engine-arg language_model_only=true --bench-rate 4,8 --bench-num-requests 192 \\
        --bench-input-len 256 --bench-output-len 512 --bench-prompt-format tokens \\
        --inf-num-requests 512 --bench-output out/a-inprocess.json
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from vllm_fleet.bench.config import BenchConfig
from vllm_fleet.bench.record import RequestRecord
from vllm_fleet.bench.report import build_report, markdown, write_all
from vllm_fleet.bench.runner import Runner
from vllm_fleet.bench.targets import Clock, Target
from vllm_fleet.bench.targets.worker import fit_token_ids
from vllm_fleet.bench.workloads import BenchItem, make_workload
from vllm_fleet.config import EngineConfig, add_options, from_args

ENGINE_OPTIONS = ("model", "dtype", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                  "gpu_memory_utilization", "enforce_eager", "block_size", "enable_prefix_caching",
                  "load_format", "seed", "engine_arg")


class InProcessEngineTarget(Target):
    name = "engine"

    def __init__(self, engine: EngineConfig, config: BenchConfig) -> None:
        self.engine = engine
        self.config = config
        self._llm = None
        self.vocab_size: int | None = None

    async def start(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from vllm_fleet.models import resolve_model
        from vllm_fleet.worker.engines.vllm_args import engine_kwargs

        resolved = resolve_model(self.engine.model)
        kwargs = engine_kwargs(self.engine, resolved.path, resolved.served_name)
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        self.vocab_size = self._llm.vllm_config.model_config.get_vocab_size()

    async def send(self, item: BenchItem, record: RequestRecord, clock: Clock) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=item.max_tokens, temperature=self.config.temperature,
                                ignore_eos=self.config.ignore_eos, output_kind=RequestOutputKind.DELTA)
        prompt = TokensPrompt(prompt_token_ids=fit_token_ids(item.token_ids, self.vocab_size))
        async for output in self._llm.generate(prompt, params, record.request_id):
            now = clock()
            tokens = sum(len(c.token_ids) for c in output.outputs)
            if tokens:
                record.chunk_times.append(now)
                record.chunk_tokens.append(tokens)
                record.output_tokens += tokens
            record.prompt_tokens = len(output.prompt_token_ids or ())

    async def close(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()

    def describe(self) -> str:
        return f"vLLM AsyncLLM in-process ({self.engine.model})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser.add_argument_group("engine"), EngineConfig,
                skip=tuple(n for n in EngineConfig.model_fields if n not in ENGINE_OPTIONS))
    add_options(parser.add_argument_group("bench"), BenchConfig, prefix="bench_",
                skip=("target", "workers", "policy", "model", "api_key"))
    parser.add_argument("--inf-num-requests", type=int, default=0,
                        help="Then, on the same engine, this many requests all at once (seed + 1), "
                             "reported to <output>-inf.json: the offline-throughput point")
    args = parser.parse_args()
    engine = from_args(EngineConfig, args)
    config = from_args(BenchConfig, args, prefix="bench_", target="engine")
    configs = [config]
    if args.inf_num_requests:
        stem = config.output.removesuffix(".json") if config.output else None
        configs.append(config.model_copy(update={"rate": "inf", "num_requests": args.inf_num_requests,
                                                 "seed": config.seed + 1,
                                                 "output": f"{stem}-inf.json" if stem else None}))
    logging.basicConfig(level=logging.WARNING)
    target = InProcessEngineTarget(engine, config)

    async def run() -> list[dict]:
        # One engine for every load: loading it is the slow part, and the settings stay identical.
        await target.start()
        reports = []
        try:
            for cfg in configs:
                workload = make_workload(cfg)
                runner = Runner(target, workload, cfg)
                runs = [await runner.run_load(mode, value) for mode, value in runner.loads]
                reports.append((cfg, build_report(cfg, runs, target=target.describe(), workload=workload.describe())))
        finally:
            await target.close()
        return reports

    for cfg, report in asyncio.run(run()):
        if cfg.output:
            report["files"] = [str(p) for p in write_all(report, cfg.output)]
        print(markdown(report))


if __name__ == "__main__":
    main()
