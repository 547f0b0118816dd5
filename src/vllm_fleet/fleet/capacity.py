"""How much of a model fits on a device: weights, KV cache, sequences × context.

Per GPU (after tensor-parallel sharding), vLLM's budget is

    memory × gpu_memory_utilization − weights − activation peak − CUDA graphs − runtime overhead

and what is left holds the KV cache. On CPU the KV cache is exactly VLLM_CPU_KVCACHE_SPACE GiB
and the weights live in system memory beside it.

KV bytes per token = attention layers × 2 (K and V) × KV heads × head_dim × dtype bytes.
KV *heads*, not attention heads: grouped-query attention is why Qwen3-8B needs 144 KiB/token
and not 576. The formula in common deployment guides,
`blocks = len × seqs × 2 × head_dim × layers / (block_size × dtype_bytes)`, drops the KV heads
and divides by the dtype instead of multiplying, so it is neither bytes nor tokens.

Hybrid models (Qwen3.5: 3 Gated DeltaNet layers per full-attention layer) keep a KV cache only
in their attention layers; each DeltaNet layer instead holds a fixed state per sequence:
a conv state (2·key_dim + value_dim) × (kernel − 1) and a recurrent state
value_heads × key_head_dim × value_head_dim. So a sequence costs `state + len × kv_per_token`.

The reserve terms are rough, on purpose (vLLM measures them by profiling at start-up):
activation ≈ max_num_batched_tokens × (2·intermediate + 4·hidden) × dtype bytes plus fp32
logits and probabilities for max_num_seqs × vocab; CUDA graphs 0.75 GiB unless enforce_eager;
runtime 1 GiB (CUDA context, allocator slack), + 0.5 GiB for NCCL when tensor parallel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_fleet.fleet.model_shape import ModelShape

GiB = 1024**3
CUDA_GRAPH_RESERVE = int(0.75 * GiB)
RUNTIME_RESERVE = 1 * GiB
NCCL_RESERVE = int(0.5 * GiB)
CPU_RUNTIME_RESERVE = 2 * GiB       # Python, torch and the engine-core process of a CPU worker
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_BATCHED_TOKENS = 8192
TABLE_LENGTHS = (2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)


@dataclass(frozen=True)
class DeviceSpec:
    """What a worker runs on, for capacity purposes."""

    name: str                      # "NVIDIA H200", "MIG 1g.18gb", "cpu"
    memory_bytes: int              # per GPU; on CPU the memory available to this worker
    kind: str = "gpu"              # "gpu" (whole or MIG) or "cpu"
    kv_cache_space_bytes: int = 0  # CPU only


@dataclass(frozen=True)
class EngineSettings:
    """The engine options that change memory. None means vLLM's default."""

    max_model_len: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    block_size: int = 16
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    kv_cache_dtype_bytes: int | None = None


@dataclass
class Capacity:
    """The answer for one (model, device, settings)."""

    model: str
    device: str
    max_model_len: int
    weight_bytes: int                  # per device
    kv_bytes_per_token: int            # per device
    state_bytes_per_seq: int           # per device (hybrid models)
    reserve_bytes: int                 # activation + graphs + runtime
    kv_budget_bytes: int               # what is left for the KV cache (negative: weights do not fit)
    block_size: int
    max_num_seqs: int                  # the requested (or default) cap
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems

    def bytes_per_sequence(self, length: int) -> int:
        return self.state_bytes_per_seq + length * self.kv_bytes_per_token

    def concurrent_sequences(self, length: int) -> int:
        """Sequences of `length` tokens whose KV cache fits at once."""
        return max(0, self.kv_budget_bytes // self.bytes_per_sequence(length))

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV cache holds while max_num_seqs sequences (or as many as fit) keep their state."""
        if self.kv_budget_bytes <= 0:
            return 0
        seqs = min(self.max_num_seqs, self.concurrent_sequences(1)) if self.state_bytes_per_seq else 0
        return max(0, (self.kv_budget_bytes - seqs * self.state_bytes_per_seq) // self.kv_bytes_per_token)

    @property
    def num_blocks(self) -> int:
        return self.kv_tokens // self.block_size

    def table(self) -> list[tuple[int, int]]:
        """(max_model_len, sequences that fit at that length) for lengths up to the model's."""
        lengths = sorted({n for n in TABLE_LENGTHS if n < self.max_model_len} | {self.max_model_len})
        return [(n, self.concurrent_sequences(n)) for n in lengths]


def kv_bytes_per_token(shape: ModelShape, *, tp: int = 1, dtype_bytes: int | None = None) -> int:
    """K and V of one token in every attention layer, on one of `tp` GPUs.

    KV heads are split across tensor-parallel ranks, and replicated when there are fewer
    heads than ranks (vLLM does the same), hence the max(1, ...).
    """
    heads_per_rank = max(1, shape.num_kv_heads // tp)
    return shape.num_attention_layers * 2 * heads_per_rank * shape.head_dim * (dtype_bytes or shape.dtype_bytes)


def state_bytes_per_sequence(shape: ModelShape, *, tp: int = 1, dtype_bytes: int | None = None) -> int:
    """Gated DeltaNet conv + recurrent state of one sequence across all linear layers."""
    if not shape.is_hybrid:
        return 0
    key_dim = shape.linear_num_key_heads * shape.linear_key_head_dim
    value_dim = shape.linear_num_value_heads * shape.linear_value_head_dim
    conv = (2 * key_dim + value_dim) * max(0, shape.linear_conv_kernel - 1)
    recurrent = shape.linear_num_value_heads * shape.linear_key_head_dim * shape.linear_value_head_dim
    per_layer = (conv + recurrent) * (dtype_bytes or shape.dtype_bytes)
    return shape.num_linear_layers * per_layer // tp


def activation_bytes(shape: ModelShape, settings: EngineSettings) -> int:
    tokens = settings.max_num_batched_tokens or DEFAULT_BATCHED_TOKENS
    seqs = settings.max_num_seqs or DEFAULT_MAX_NUM_SEQS
    per_token = (2 * shape.intermediate_size + 4 * shape.hidden_size) // settings.tensor_parallel_size
    logits = seqs * shape.vocab_size * 4 * 2  # fp32 logits and probabilities in the sampler
    return tokens * per_token * shape.dtype_bytes + logits


def estimate(shape: ModelShape, device: DeviceSpec, settings: EngineSettings = EngineSettings()) -> Capacity:
    """Weights, KV cache and what fits; `problems` says why a plan cannot run."""
    tp = settings.tensor_parallel_size
    length = settings.max_model_len or shape.max_position
    weights = shape.weight_bytes() // tp
    if device.kind == "cpu":
        reserve = CPU_RUNTIME_RESERVE + activation_bytes(shape, settings)
        budget = device.kv_cache_space_bytes
    else:
        reserve = activation_bytes(shape, settings) + RUNTIME_RESERVE
        reserve += 0 if settings.enforce_eager else CUDA_GRAPH_RESERVE
        reserve += NCCL_RESERVE if tp > 1 else 0
        budget = int(device.memory_bytes * settings.gpu_memory_utilization) - weights - reserve
    capacity = Capacity(
        model=shape.name, device=device.name, max_model_len=length, weight_bytes=weights,
        kv_bytes_per_token=kv_bytes_per_token(shape, tp=tp, dtype_bytes=settings.kv_cache_dtype_bytes),
        state_bytes_per_seq=state_bytes_per_sequence(shape, tp=tp, dtype_bytes=settings.kv_cache_dtype_bytes),
        reserve_bytes=reserve, kv_budget_bytes=budget, block_size=settings.block_size,
        max_num_seqs=settings.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
    )
    capacity.problems.extend(_problems(shape, device, settings, capacity))
    return capacity


def _problems(shape: ModelShape, device: DeviceSpec, settings: EngineSettings, cap: Capacity) -> list[str]:
    """Why this cannot start, each with what to change."""
    problems: list[str] = []
    if settings.max_model_len and settings.max_model_len > shape.max_position:
        problems.append(
            f"max_model_len {settings.max_model_len} exceeds the model's context ({shape.max_position}); "
            f"lower --max-model-len"
        )
    if device.kind == "cpu":
        need = cap.weight_bytes + cap.reserve_bytes + device.kv_cache_space_bytes
        if need > device.memory_bytes:
            problems.append(
                f"weights {_gib(cap.weight_bytes)} + KV space {_gib(device.kv_cache_space_bytes)} + runtime "
                f"{_gib(cap.reserve_bytes)} = {_gib(need)} exceed the {_gib(device.memory_bytes)} of memory "
                f"for this worker; lower --kv-cache-space-gb or run fewer CPU workers"
            )
    elif cap.kv_budget_bytes <= 0:
        usable = int(device.memory_bytes * settings.gpu_memory_utilization)
        problems.append(
            f"weights {_gib(cap.weight_bytes)} + reserve {_gib(cap.reserve_bytes)} exceed "
            f"{_gib(usable)} usable on {device.name} (gpu_memory_utilization {settings.gpu_memory_utilization}); "
            f"use a larger device or more tensor-parallel GPUs (whole GPUs only), or a quantized model"
        )
        return problems
    if cap.kv_budget_bytes < cap.bytes_per_sequence(cap.max_model_len):
        fit = _longest_fitting_length(cap)
        problems.append(
            f"one sequence of {cap.max_model_len} tokens needs {_gib(cap.bytes_per_sequence(cap.max_model_len))} "
            f"of KV cache but only {_gib(cap.kv_budget_bytes)} is left; set --max-model-len {fit} or less"
            + ("" if device.kind == "cpu" else ", raise --gpu-memory-utilization, or use a larger device")
            + (", or raise --kv-cache-space-gb" if device.kind == "cpu" else "")
        )
    return problems


def _longest_fitting_length(cap: Capacity) -> int:
    room = cap.kv_budget_bytes - cap.state_bytes_per_seq
    return max(0, room // cap.kv_bytes_per_token // cap.block_size * cap.block_size)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


# nvidia-smi memory.total (MiB) of common data-centre GPUs, for planning without the hardware.
KNOWN_GPU_MEMORY_MIB = {
    "H200": 143771, "H100": 81559, "H100 NVL": 95830, "A100-SXM4-80GB": 81920, "A100 80GB": 81920,
    "A100-SXM4-40GB": 40960, "A100-PCIE-40GB": 40960, "L40S": 46068, "L4": 23034, "A10": 23028,
}


def device_spec(name: str, *, kv_cache_space_gb: float | None = None, memory_bytes: int | None = None) -> DeviceSpec:
    """A device from what a person types: `H200`, `NVIDIA H100 80GB HBM3`, `1g.18gb`, `cpu`."""
    from vllm_fleet.errors import ConfigError
    from vllm_fleet.fleet.gpus import available_memory_bytes, profile_memory_bytes

    text = name.strip()
    if text.lower() == "cpu":
        space = int((kv_cache_space_gb or 4) * GiB)
        return DeviceSpec(name="cpu", kind="cpu", memory_bytes=memory_bytes or available_memory_bytes(),
                          kv_cache_space_bytes=space)
    profile = text.removeprefix("MIG ").strip()
    if profile_memory_bytes(profile) and "." in profile:
        return DeviceSpec(name=f"MIG {profile}", memory_bytes=memory_bytes or profile_memory_bytes(profile))
    if memory_bytes:
        return DeviceSpec(name=text, memory_bytes=memory_bytes)
    # Longest key first, so "A100-SXM4-80GB" wins over shorter names it contains.
    for key in sorted(KNOWN_GPU_MEMORY_MIB, key=len, reverse=True):
        if key.lower() in text.lower():
            return DeviceSpec(name=text, memory_bytes=KNOWN_GPU_MEMORY_MIB[key] * 1024**2)
    known = ", ".join(KNOWN_GPU_MEMORY_MIB)
    raise ConfigError(
        f"unknown device {name!r}: give a GPU name ({known}), a MIG profile like 1g.18gb, or 'cpu'"
    )
