"""Start a real vLLM engine on a model and print the KV capacity it reports, as JSON.

Run as a script (vLLM spawns its engine process, which needs the __main__ guard):
    python tests/fleet/vllm_kv_probe.py MODEL_DIR KV_SPACE_GIB MAX_MODEL_LEN
"""

import json
import os
import sys


def main() -> None:
    model, space_gib, max_model_len = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = space_gib
    from vllm import LLM

    llm = LLM(model=model, enforce_eager=True, max_model_len=max_model_len, max_num_seqs=8)
    cache = llm.llm_engine.vllm_config.cache_config
    print("KV_PROBE " + json.dumps({"num_gpu_blocks": cache.num_gpu_blocks, "block_size": cache.block_size,
                      "kv_cache_size_tokens": getattr(cache, "kv_cache_size_tokens", None)}), flush=True)


if __name__ == "__main__":
    main()
