#!/usr/bin/env bash
# The fault and feature suite (issue #28 item 1) on a GPU machine, after benchmarks/gpu/stage.sh.
#
# One fleet file puts two models on GPU 0 (a pool each), started by `vllm-fleet node`, which
# starts workers that share a GPU one after another:
#   qwen3.5-9b  2 workers x 0.30 of the GPU: the Qwen3.5-9B shape, random weights, the word-level
#               stand-in tokenizer (make_model.py); kill -9 under 64 streams, the hung engine
#   smollm2     2 workers x 0.12: the SmolLM2-135M shape with its own tokenizer and chat template,
#               random weights; LoRA slots, the hermes tool parser; tools, structured output, LoRA
# (no model hub is reachable from the GPU machine: weights are random, tokenizers are real where
# the scenario needs text: JSON, tool calls.)
#
#   source /tmp/gpu-env.sh && SMOL=/tmp/stage/smol ADAPTER=/tmp/stage/lora-r8 OUT=DIR benchmarks/gpu/suite.sh
#
# With SMOL_WEIGHTS=real, SMOL is the real SmolLM2-135M (stage.sh converts the GGUF our package
# ships: $SMOL_REAL), loaded with its weights, and the fleet file holds only that model (two
# workers x 0.12): for the scenarios that need a model that means what it says (tools,
# structured output, LoRA changing the answer) and the Spark job, SUITE_ARGS="--scenarios
# fleet,tools,lora,surface,spark" (surface: Responses, Messages, the token routes on this vLLM).
# The issue asks for one worker per H200 on two H200s; only the one-GPU machine was lent, so the
# two workers of each model share GPU 0 here.
set -uo pipefail
cd "$(dirname "$0")/../.."
FLEET_PY=${FLEET_PY:-python3}
OUT=${OUT:?set OUT to the results folder}
SMOL=${SMOL:?set SMOL to a SmolLM2-135M config + tokenizer folder}
ADAPTER=${ADAPTER:?set ADAPTER to a rank-8 LoRA folder for SmolLM2-135M}
MODEL=${MODEL:?set MODEL to the Qwen3.5-9B-shaped folder (stage.sh)}
SMOL_WEIGHTS=${SMOL_WEIGHTS:-dummy}
mkdir -p "$OUT"

{
    echo "date: $(date -u +%FT%TZ)"
    nvidia-smi -L
    $FLEET_PY -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    echo "java: $(command -v java || echo none)"
    $FLEET_PY -c "import pyspark; print('pyspark', pyspark.__version__)" 2>&1 | tail -1
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

qwen_entry="  - model: $MODEL
    served_model_name: qwen3.5-9b
    replicas: 2
    devices: gpu:0@0.3
    pool: long
    max_model_len: 4096
    max_num_seqs: 256
    enforce_eager: true
    load_format: dummy
    engine_arg: [language_model_only=true, gdn_prefill_backend=triton, seed=0]
"
smol_entry="  - model: $SMOL
    served_model_name: smollm2
    replicas: 2
    devices: gpu:0@0.12
    pool: short
    max_model_len: 2048
    max_num_seqs: 64
    enforce_eager: true
    max_loras: 2
    max_lora_rank: 8
    tool_call_parser: hermes
    enable_auto_tool_choice: true
"
if [[ $SMOL_WEIGHTS == real ]]; then
    entries=$smol_entry stream=(--stream-model smollm2)
else
    entries="$qwen_entry$smol_entry    load_format: dummy
" stream=(--stream-model qwen3.5-9b --word-tokens)
fi
printf 'engine: vllm\nbase_port: 18610\nmodels:\n%s' "$entries" >"$OUT/fleet.yaml"
$FLEET_PY -m vllm_fleet.cli node --fleet-file "$OUT/fleet.yaml" --dry-run >"$OUT/node-dry-run.txt" 2>&1
cat "$OUT/node-dry-run.txt"
nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total,utilization.gpu --format=csv,noheader -l 2 \
    >"$OUT/gpu-memory.csv" 2>/dev/null &
SMI=$!
# shellcheck disable=SC2086
$FLEET_PY benchmarks/gpu/suite.py --python "$FLEET_PY" --fleet-file "$OUT/fleet.yaml" "${stream[@]}" \
    --tools-model smollm2 --adapter "$ADAPTER" --out "$OUT" ${SUITE_ARGS:-} 2>&1 | tee "$OUT/suite.txt"
status=${PIPESTATUS[0]}
kill "$SMI" 2>/dev/null
exit "$status"
