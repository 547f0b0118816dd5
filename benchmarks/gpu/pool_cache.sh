#!/usr/bin/env bash
# Issues #26, #29 and #52 on the GPU machine, after stage.sh install (core and spark bundles):
#
#   source /tmp/gpu-env.sh && OUT=DIR bash benchmarks/gpu/pool_cache.sh cache|unique|shared|jobs|pool|pool8b
#
# cache  workload (a) of #26: vLLM's bench client (prefix_repetition) through our gateway per
#        policy, on two workers of the Qwen3-8B shape (random weights, word-level stand-in
#        tokenizer) sharing GPU 0, each with a KV cache of KV_BLOCKS blocks (16 tokens each), so
#        that one worker holds about half of the prefixes and the pair holds them all.
#        POLICIES=...,smg_cache_aware adds SMG's `cache_aware` over two stock vLLM gRPC servers with
#        the same engine settings (needs SMG in $SMG_SITE: carry .gpu/smg to a `stage.sh install`).
# unique workload (c) of #26: the same bench with every prompt its own prefix (nothing shared), so
#        cache_aware can only balance load; its target is "never worse than least outstanding".
# shared workload (b) of #26: cache_routing.py's shared-start (one system text, then one of
#        TENANTS documents, then a user's question; each user asks TURNS questions, the history
#        resent) through an in-process Router per policy, on the `cache` target's two workers.
#        As completions (the stand-in tokenizer has no chat template) in stand-in words (it tells
#        apart only the words t<N>: one token each). Sizes, in 16-token GPU blocks: the system text
#        is 170 tokens (the run's salt and 169 words), 10 blocks every request shares; a tenant's
#        document adds DOC_WORDS + 3 tokens, so its prefix ends at 1873 tokens (117 full blocks),
#        107 of them the tenant's own. 24 tenants: 10 + 24 x 107 = 2578 blocks, 1.6x one worker's
#        KV_BLOCKS (1600) and 81% of the pair's 3200: a worker holding half the tenants keeps ~300
#        blocks for what is in flight and recent (a turn's question and answer, ~4 blocks). Users
#        arrive at RATE per second for USERS / RATE = 60 s per policy (480 requests of ~1900 prompt
#        tokens); with the workers' start (~60-90 s each, one after another) the four policies
#        take ~400 s. THROUGH_GATEWAY=1: our policies through a `vllm-fleet gateway` process over
#        HTTP, measured as SMG is (default: an in-process Router).
#        ITL_TARGET_MS (jobs, pool, pool8b) defaults to 63 ms, 1.1x the H100's online-alone ITL P99 (57-59 ms
#        there on 12-05, SmolLM2): a target below what online alone gets has the controller cut batch in every
#        window (12-05, pool: batch at 35% of the idle capacity with 50 ms, 71% with 63 ms). pool8b's
#        online-alone ITL is not measured yet; with relative TARGETS the ms targets only stand in until
#        the baseline is learnt (each online phase's 3 s warm-up runs without batch).
# jobs   #29: online chat through the gateway beside a real Spark job and a Batch API job, on two
#        workers of the real SmolLM2-135M sharing GPU 0 (chat needs a chat template: the stand-in
#        tokenizers have none). PHASES=spark,spark-steps,api,no-classes picks the phases after
#        online alone (shared_pool_jobs.py --phases; all of them do not fit one ten-minute call).
#        PHASES=api starts no Spark: it needs only the core staging, not the spark bundle.
# pool   #29's in-process closed loop (shared_pool.py) on the `jobs` target's workers: batch alone,
#        online alone, online + batch with classes and without, and the online rate stepped up
#        (8 -> 16/s) mid-phase, whose recovery time the bench prints.
# pool8b #52: the same five phases on two workers of the Qwen3-8B shape (random weights, the
#        stand-in tokenizer: online as completions, every prompt word t<N> one token) sharing GPU 0,
#        each at 0.42 of its memory (~16 GiB of weights, ~14 GiB of KV cache: 64 sequences of
#        ~640 tokens need 41k tokens, ~6 GiB), CUDA graphs and torch.compile on (as deployed; the
#        other targets run eager). Online: RATE (8) completions/s of 256 tokens in, 64 out (16/s
#        after the step); batch: 128 in flight (64 running per engine) of 512 in, 128 out; a step's
#        budget 8192 tokens (what `vllm serve` takes on an H100). Prints #52's targets met or not:
#        online TTFT/ITL P99 <= 1.05x online alone with batch >= 80% of the idle capacity, back
#        within target <= 1 s after the step. Time: ~1.5 + ~1 min for the two starts (one after the
#        other; the second finds the first's compile cache), 5 x SECONDS_PER_PHASE (30) + ~25 s of warm-up
#        and drains: ~5.5 min, 7 at worst.
# TARGETS=relative|absolute (jobs, pool, pool8b): the controller's --interactive-targets. relative
#        (the default) cuts batch at 1.1x a P90 learnt without it; the ms targets only stand in until then.
# The issue asks for one worker per H200; only the one-GPU machine is lent, so both share GPU 0,
# unless ONE_WORKER=1 (jobs, pool8b): then one worker has GPU 0 to itself (twice the memory share
# and sequences, the same load), so each step's time is its own engine's, not also the other's.
ONE_WORKER=${ONE_WORKER:-0}
devices=$( ((ONE_WORKER)) && echo 0 || echo 0,0)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the results folder}
mkdir -p "$OUT"
{ date -u +%FT%TZ; nvidia-smi -L; git -C .. log --oneline -1 2>/dev/null; } >"$OUT/machine-$1.txt" 2>&1
# VARIANTS='LABEL=POLICY ARGS;...': policies with their own gateway arguments, named in POLICIES
# (e.g. VARIANTS='ca_lw05=cache_aware --cache-load-weight 0.5' POLICIES=cache_aware,ca_lw05; the gateway
# takes three --cache-* knobs, the rest are internal constants: router/cache/tuning.py).
variant_args=()
IFS=';' read -ra variant_specs <<<"${VARIANTS:-}"
for spec in "${variant_specs[@]}"; do [[ -n $spec ]] && variant_args+=(--variant "$spec"); done
# API_VARIANTS='NAME=GATEWAY ARGS;...' (jobs, with PHASES naming api): the online + Batch API phase
# again through a gateway with those arguments (e.g. API_VARIANTS='lenient=--interactive-slowdown-target 1.25').
api_variant_args=()
IFS=';' read -ra api_variant_specs <<<"${API_VARIANTS:-}"
for spec in "${api_variant_specs[@]}"; do [[ -n $spec ]] && api_variant_args+=(--api-variant "$spec"); done
# smg_cache_aware in POLICIES (cache, shared): SMG (stage.sh install with .gpu/smg carried puts it
# in $SMG_SITE) in front of two stock vLLM gRPC servers with the workers' settings, after our pair
# has stopped. Its circuit breaker off, as in the H200 comparison of #17: a saturation burst once
# opened it for the rest of a run, which would leave one engine serving everything.
smg_args=()
smg_options() {
    if [[ ,${POLICIES:-}, == *,smg_* ]]; then
        if [[ ! -d ${SMG_SITE:-/nonexistent}/smg ]]; then
            echo "no SMG in \$SMG_SITE (${SMG_SITE:-unset}): carry .gpu/smg and run stage.sh install" >&2; exit 2
        fi
        smg_args=(--smg-site "$SMG_SITE" --smg-arg=--disable-circuit-breaker)
    fi
}
# DEADLINE=S: the bench gets SIGINT after S seconds (SIGKILL 30 s later), so that it stops its
# workers and the device call keeps the time it has left. `timeout -s INT S bash pool_cache.sh`
# does not do this: the signal reaches this shell, which waits for its foreground bench (lost a
# whole 480-s call on 2026-12-07).
bounded() {
    if [[ -n ${DEADLINE:-} ]]; then timeout -s INT -k 30 "$DEADLINE" "$@"; else "$@"; fi
}
case ${1:?cache, unique, shared, jobs, pool or pool8b} in
unique)
    PROMPTS=${PROMPTS:-160} RATE=${RATE:-8} POLICIES=${POLICIES:-round_robin,least_outstanding,cache_aware}
    PREFIXES=$PROMPTS ;&
cache)
    smg_options
    bounded $FLEET_PY cache_routing_vllm_bench.py --one-pair --cuda-devices 0,0 --model "$QWEN3_8B" \
        --tokenizer "$QWEN3_8B" \
        --max-model-len 4096 --worker-arg=--load-format --worker-arg=dummy \
        --worker-arg=--gpu-memory-utilization --worker-arg=0.35 --kv-blocks ${KV_BLOCKS:-1600} \
        --num-prefixes ${PREFIXES:-24} --prefix-len ${PREFIX_LEN:-2048} --suffix-len 128 --output-len 32 \
        --num-prompts ${PROMPTS:-400} --request-rate ${RATE:-8} \
        --policies ${POLICIES:-round_robin,least_outstanding,prefix_affinity,cache_aware} \
        "${variant_args[@]}" "${smg_args[@]}" 2>&1 | tee "$OUT/$1-routing.txt"
    # Each policy's gateway log (WARNING and up): the bench client counts a failed request, not its error.
    for log in /tmp/cache-bench-gateway-*.log /tmp/cache-bench-worker-gpu*.log; do
        [[ -f $log ]] && xz -c "$log" >"$OUT/$(basename "$log").xz"
    done
    # SMG's gateway and engine logs as one file: at most 8 files come back from a device run.
    if [[ -d /tmp/cache-bench-smg ]]; then tar -C /tmp -cJf "$OUT/cache-bench-smg-logs.tar.xz" cache-bench-smg; fi ;;
shared)
    rm -f /tmp/cache-bench-worker-gpu*.log /tmp/cache-bench-gateway-*.log  # appended to: keep this run's only
    smg_options
    bounded $FLEET_PY cache_routing.py --workload shared-start --completions --stand-in-words --cuda-devices 0,0 \
        --model "$QWEN3_8B" --max-model-len 4096 --worker-arg=--load-format --worker-arg=dummy \
        --worker-arg=--gpu-memory-utilization --worker-arg=0.35 --kv-blocks ${KV_BLOCKS:-1600} \
        --tenants ${TENANTS:-24} --doc-words ${DOC_WORDS:-1700} --users ${USERS:-240} --rate ${RATE:-4} \
        --turns ${TURNS:-2} --max-tokens ${MAX_TOKENS:-32} ${THROUGH_GATEWAY:+--through-gateway} \
        --policies ${POLICIES:-round_robin,least_outstanding,prefix_affinity,cache_aware} "${smg_args[@]}" \
        2>&1 | tee "$OUT/shared-routing.txt"
    # In-process, the router's warnings are in the output above; through the gateway, in its log
    # (WARNING and up: load-only scoring, mismatched ids). The workers log apart.
    for log in /tmp/cache-bench-worker-gpu*.log ${THROUGH_GATEWAY:+/tmp/cache-bench-gateway-*.log}; do
        [[ -f $log ]] && xz -c "$log" >"$OUT/shared-$(basename "$log").xz"
    done
    if [[ -d /tmp/cache-bench-smg ]]; then tar -C /tmp -cJf "$OUT/shared-smg-logs.tar.xz" cache-bench-smg; fi ;;
jobs)
    bounded $FLEET_PY shared_pool_jobs.py --workers vllm --model "$SMOL_REAL" --cuda-devices $devices \
        --max-model-len 2048 \
        --worker-arg=--gpu-memory-utilization --worker-arg=$( ((ONE_WORKER)) && echo 0.4 || echo 0.2) --max-num-seqs $((ONE_WORKER ? 128 : 64)) \
        --seconds 30 --rate ${RATE:-8} --rows ${ROWS:-3000} --max-tokens 64 --batch-words 200 \
        --spark-cores 8 --spark-in-flight 12 --batch-api-concurrency 96 --phases ${PHASES:-spark,api,no-classes} "${api_variant_args[@]}" \
        --targets ${TARGETS:-relative} --ttft-target-ms ${TTFT_TARGET_MS:-200} --itl-target-ms ${ITL_TARGET_MS:-63} 2>&1 | tee "$OUT/shared-pool-jobs.txt" ;;
pool)
    bounded $FLEET_PY shared_pool.py --workers vllm --model "$SMOL_REAL" --cuda-devices 0,0 --max-model-len 2048 \
        --worker-arg=--gpu-memory-utilization --worker-arg=0.2 --max-num-seqs 64 --seconds 30 --rate ${RATE:-8} \
        --online-words 60 --online-max-tokens 32 --batch-in-flight 96 --batch-words 300 --batch-max-tokens 64 \
        --targets ${TARGETS:-relative} --ttft-target-ms ${TTFT_TARGET_MS:-200} --itl-target-ms ${ITL_TARGET_MS:-63} 2>&1 | tee "$OUT/shared-pool.txt" ;;
pool8b)
    rm -f /tmp/shared-pool-worker-gpu*.log  # appended to: keep this run's only
    # STEP_TOKENS=N: the engine scheduler's batch prefill per step beside interactive work (its
    # batch_step_tokens; default 1/32 of the step, 256 here), to trace the ITL / batch-share trade-off.
    # SLOWDOWN=X: its step governor on, holding steps with batch to X times a step without.
    # BASIS=tail: the governor holds the tail of the steps with batch (each window's longest against
    # the clean steps' 90th percentile), not their mean (batch_slowdown_basis, step_governor.py).
    # SOLO_TOKENS=N: batch prefill in a step of batch alone (batch_solo_step_tokens; default a quarter
    # of the step, 2,048): the step an interactive arrival waits behind before its own prefill.
    classes=()
    [[ -n ${STEP_TOKENS:-} ]] && classes+=("\"batch_step_tokens\": $STEP_TOKENS")
    [[ -n ${BASIS:-} ]] && classes+=("\"batch_slowdown_basis\": \"$BASIS\"")
    [[ -n ${SOLO_TOKENS:-} ]] && classes+=("\"batch_solo_step_tokens\": $SOLO_TOKENS")
    [[ -n ${SLOWDOWN:-} ]] && classes+=("\"batch_slowdown_target\": $SLOWDOWN")
    # ALONE_AGAIN=1: online alone measured again after the phase with batch (the spread of one P99)
    again=(); [[ ${ALONE_AGAIN:-0} == 1 ]] && again=(--alone-again)
    step_args=()
    if ((${#classes[@]})); then
        joined=$(IFS=,; echo "${classes[*]}")
        step_args=(--worker-arg=--engine-arg "--worker-arg=additional_config={\"vllm_fleet_classes\": {$joined}}")
    fi
    bounded $FLEET_PY shared_pool.py --workers vllm --model "$QWEN3_8B" --cuda-devices $devices --max-model-len 2048 \
        --worker-arg=--load-format --worker-arg=dummy --worker-arg=--gpu-memory-utilization --worker-arg=$( ((ONE_WORKER)) && echo 0.85 || echo 0.42) \
        --worker-arg=--no-enforce-eager --worker-arg=--max-num-batched-tokens --worker-arg=8192 "${step_args[@]}" \
        --completions --stand-in-words --max-num-seqs $((ONE_WORKER ? 128 : 64)) --seconds ${SECONDS_PER_PHASE:-30} --rate ${RATE:-8} \
        --online-words 256 --online-max-tokens 64 --batch-in-flight 128 --batch-words 512 --batch-max-tokens 128 \
        --targets ${TARGETS:-relative} --ttft-target-ms ${TTFT_TARGET_MS:-200} --itl-target-ms ${ITL_TARGET_MS:-63} \
        "${again[@]}" 2>&1 | tee "$OUT/shared-pool-8b.txt"
    for log in /tmp/shared-pool-worker-gpu*.log; do [[ -f $log ]] && xz -c "$log" >"$OUT/8b-$(basename "$log").xz"; done ;;
esac
