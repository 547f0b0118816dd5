"""`vllm-fleet plan`: what a model needs and how much fits on a device."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="Capacity of a model on a device: weights, KV cache, sequences × context",
        description="Estimate weights, KV bytes per token (grouped-query and hybrid attention), KV blocks and the "
                    "largest max_num_seqs × max_model_len that fit. Exit status 1 when the plan does not fit.",
    )
    parser.add_argument("--model", default=None,
                        help="Local model folder, or a Hugging Face id read from the HF cache (or the hub when "
                             "reachable); Qwen/Qwen3.5-9B, Qwen/Qwen3-8B and meta-llama/Llama-3.1-8B-Instruct have "
                             "built-in copies (default: the packaged default model)")
    parser.add_argument("--hf-cache", metavar="DIR", default=None,
                        help="Hugging Face hub cache to read config.json from (default: $HF_HUB_CACHE, "
                             "else $HF_HOME/hub, else ~/.cache/huggingface/hub)")
    parser.add_argument("--revision", default=None,
                        help="Branch, tag or commit of a Hugging Face id (default: main)")
    parser.add_argument("--device", default="cpu",
                        help="GPU name (H200, H100, A100-SXM4-80GB, ...), MIG profile (1g.18gb, 3g.40gb), or cpu")
    parser.add_argument("--memory-gib", type=float, default=None, help="Device memory, if the name is not known")
    parser.add_argument("--kv-cache-space-gb", type=int, default=None, help="cpu: KV-cache GiB (default 4)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="Fraction of GPU memory vLLM may use")
    parser.add_argument("--max-model-len", type=int, default=None, help="Context length (default: the model's)")
    parser.add_argument("--max-num-seqs", type=int, default=None, help="Sequence cap (default 256)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per worker (whole GPUs)")
    parser.add_argument("--block-size", type=int, default=16, help="KV block size in tokens")
    parser.add_argument("--enforce-eager", action="store_true", help="No CUDA graphs (saves their memory)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from vllm_fleet.errors import ConfigError
    from vllm_fleet.fleet.capacity import EngineSettings, device_spec, estimate
    from vllm_fleet.fleet.model_shape import load_shape
    from vllm_fleet.fleet.report import capacity_text

    if not 0 < args.gpu_memory_utilization <= 1:
        raise ConfigError("--gpu-memory-utilization must be in (0, 1]")
    if args.device.strip().lower().startswith("mig") or "." in args.device:
        if args.tensor_parallel_size > 1:
            raise ConfigError("tensor parallelism across MIG slices is not possible; use --tensor-parallel-size 1")
    memory = int(args.memory_gib * 1024**3) if args.memory_gib else None
    device = device_spec(args.device, kv_cache_space_gb=args.kv_cache_space_gb, memory_bytes=memory)
    settings = EngineSettings(
        max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization, tensor_parallel_size=args.tensor_parallel_size,
        block_size=args.block_size, enforce_eager=args.enforce_eager,
    )
    shape = load_shape(args.model, hf_cache=args.hf_cache, revision=args.revision)
    capacity = estimate(shape, device, settings)
    print(capacity_text(capacity), end="")
    print(f"\n{'note: ' if shape.from_builtin else ''}model config from {shape.source}")
    return 0 if capacity.fits else 1
