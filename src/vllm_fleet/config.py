"""Typed configuration: one pydantic model per component, each of which builds its CLI options.

Components define their models here (the engine and worker, which several rooms share) or in
their own room (`router/config.py`, `gateway/config.py`, ...) on top of `FleetModel`.
`add_options(parser, Model)` turns a model's fields into argparse options (the field's
description is the help text); `from_args(Model, args)` builds the model back, so each option
is written once. Environment variables are read only in `env_*` helpers below.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vllm_fleet.errors import ConfigError


class FleetModel(BaseModel):
    """Base of every config model: unknown keys are an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


# ---------------------------------------------------------------------------------------------
# Environment (read only here)


def env_cache_dir() -> Path:
    """Where converted models and other per-user files go: $VLLM_FLEET_CACHE or ~/.cache/vllm-fleet."""
    root = os.environ.get("VLLM_FLEET_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "vllm-fleet"


def env_parent_pid() -> int | None:
    """VLLM_FLEET_PARENT_PID: set by a supervisor for a child that must die with it."""
    value = os.environ.get("VLLM_FLEET_PARENT_PID", "")
    return int(value) if value.isdigit() else None


def env_log_level() -> str:
    return os.environ.get("VLLM_FLEET_LOG_LEVEL", "INFO").upper()


def env_hf_hub_cache() -> Path:
    """The Hugging Face hub cache, by huggingface_hub's own precedence.

    Read at call time (huggingface_hub reads it once at import), so the capacity model and the
    vLLM workers a node starts look in the same place.
    """
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if cache:
        return Path(os.path.expandvars(cache)).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def env_hf_endpoint() -> str:
    """The Hugging Face hub's address: $HF_ENDPOINT (a mirror) or https://huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def env_hf_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) set: never contact the Hugging Face hub."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


# ---------------------------------------------------------------------------------------------
# Engine and worker


# The adapter ranks vLLM accepts as max_lora_rank (vllm/config/lora.py, MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class EngineConfig(FleetModel):
    """Which engine a worker runs and how. vLLM options pass through unchanged."""

    engine: Literal["vllm", "mock"] = Field(
        "vllm", description="Engine: 'vllm' (the real engine) or 'mock' (a named stand-in for control-plane tests)"
    )
    model: str | None = Field(
        None, description="HF model id (e.g. Qwen/Qwen3.5-9B) or local folder; default: the packaged SmolLM2-135M-Instruct; "
                          "'all-minilm-l6-v2': the packaged embedding model (pooling endpoints)"
    )
    served_model_name: str | None = Field(None, description="Name clients use for this model (default: derived from --model)")
    tokenizer: str | None = Field(None, description="Tokenizer id or folder, if not the model's own")
    dtype: str = Field(
        "auto", description="Weight dtype: auto, bfloat16, float16, float32. auto: the fastest the device runs "
                            "(GPU: the model's; CPU: float32, even with native bf16, whose answers differ for small models)"
    )
    max_model_len: int | None = Field(None, ge=16, description="Context length (prompt + output tokens)")
    max_num_seqs: int | None = Field(None, ge=1, description="Most sequences the engine runs at once")
    max_num_batched_tokens: int | None = Field(None, ge=16, description="Token budget of one engine step")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="Fraction of GPU memory vLLM may use")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per worker (tensor parallel); never across MIG slices")
    enforce_eager: bool = Field(False, description="Disable graph capture/compilation (faster start; on CPU ~30 s vs ~100 s)")
    block_size: int | None = Field(None, ge=1, description="KV-cache block size in tokens")
    enable_prefix_caching: bool | None = Field(None, description="Reuse KV cache across requests sharing a prefix")
    kv_events: bool | None = Field(
        None, description="Relay the engine's KV-cache events to routers, for --policy cache_aware (KvEvents RPC; "
        "needs prefix caching). Default: off for vLLM, whose engine process builds and publishes them each step "
        "(on one H100 they made a 0.6B engine's TPOT P50 1.08-2.3x at 100 req/s, benchmarks/RESULTS.md), on for the mock engine"
    )
    load_format: str | None = Field(None, description="vLLM load format, e.g. 'dummy' for random weights (throughput tests)")
    kv_cache_space_gb: int | None = Field(
        None, ge=1, description="CPU only: KV-cache size in whole GiB (VLLM_CPU_KVCACHE_SPACE; default 2)"
    )
    cpu_cores: str | None = Field(None, description="CPU only: cores this worker's engine binds to, e.g. '0' or '0-3' (VLLM_CPU_OMP_THREADS_BIND)")
    seed: int | None = Field(None, description="Engine seed")
    trust_remote_code: bool = Field(False, description="Allow model code from the model folder")
    engine_arg: list[str] = Field(
        default_factory=list, description="Any other vLLM engine argument as key=value (JSON values allowed); repeatable"
    )
    # vLLM's OpenAI-server options with its names and meaning; the engine needs them at start
    # (the reasoning parser also goes to vLLM's structured-outputs config, as `vllm serve` does,
    # so a constraint starts after the reasoning) and for each OpenAI chat request.
    tool_call_parser: str | None = Field(
        None, description="vLLM tool-call parser for the model (e.g. hermes, llama3_json): turns its output into tool calls"
    )
    enable_auto_tool_choice: bool = Field(
        False, description="Allow tool_choice 'auto' (the model decides when to call a tool); needs --tool-call-parser"
    )
    reasoning_parser: str | None = Field(
        None, description="vLLM reasoning parser for the model (e.g. qwen3, deepseek_r1): splits reasoning from content"
    )
    # LoRA adapters (#16): vLLM's enable_lora/max_loras/max_lora_rank; off unless asked for.
    lora: list[str] = Field(
        default_factory=list, description="A LoRA adapter to load at start, as name=path (a PEFT folder); repeatable"
    )
    max_loras: int = Field(
        0, ge=0, description="Adapter slots (vLLM's max_loras); 0 = LoRA off, or one per --lora when some are given"
    )
    max_lora_rank: int = Field(
        16, ge=1, description="Largest adapter rank accepted (vLLM's max_lora_rank: 1, 8, 16, 32, 64, 128, 256, "
                              "320 or 512)"
    )
    # The mock engine (never a default): deterministic tokens at a set pace.
    mock_tokens_per_s: float = Field(50.0, gt=0, description="Mock engine: tokens per second per sequence")
    mock_ttft_ms: float = Field(20.0, ge=0, description="Mock engine: fixed delay before the first token")
    mock_prefill_ms_per_1k: float = Field(5.0, ge=0, description="Mock engine: extra prompt-processing delay per 1,000 prompt tokens")
    mock_prefill_serial: bool = Field(
        False, description="Mock engine: prompts prefill one at a time, as one engine's prefills share its compute: "
        "a long prefill delays the first token of every prompt behind it (routing benchmarks)")
    mock_batched_steps: bool = Field(
        False, description="Mock engine: every running sequence steps on one shared 10 ms clock, as a GPU engine's "
        "batch does (one step's tokens for all requests at once), instead of each on a timer of its own")
    mock_max_model_len: int = Field(4096, ge=16, description="Mock engine: context length it reports")
    mock_kv_blocks: int = Field(
        0, ge=0, description="Mock engine: blocks of its simulated prefix cache (of --block-size tokens, 16 when "
        "unset), LRU-evicted, with KV-cache events; 0 = no cache"
    )
    mock_tokenizer: str | None = Field(
        None, description="Mock engine: a real tokenizer folder to tokenize with (chat template, tool/reasoning parsers)"
    )
    mock_script: str | None = Field(
        None, description="Mock engine: a text file every answer is (tokenized with --mock-tokenizer; resumes continue it)"
    )
    mock_pooling: bool = Field(
        False, description="Mock engine: be an embedding model's stand-in (serves only /v1/embeddings, hash-derived "
        "vectors, answered after --mock-ttft-ms) instead of generating"
    )
    mock_stall_file: str | None = Field(
        None, description="Mock engine (test double of a wedged engine): while this file exists, running requests "
        "produce nothing and stay running, and the worker process stays up"
    )


    @field_validator("max_lora_rank")
    @classmethod
    def _vllm_rank(cls, value: int) -> int:
        if value not in LORA_RANKS:  # vLLM takes only these; said here, not at engine start
            raise ValueError(f"must be one of {', '.join(map(str, LORA_RANKS))}")
        return value

    @property
    def adapter_slots(self) -> int:
        """Adapter slots this engine runs with: --max-loras, else one per --lora (0 = LoRA off)."""
        return self.max_loras or len(self.lora)


class WorkerConfig(FleetModel):
    """The gRPC worker around one engine."""

    host: str = Field("127.0.0.1", description="Address the gRPC server binds to (0.0.0.0 to serve other hosts)")
    port: int = Field(50051, ge=0, le=65535, description="gRPC port (0 picks a free one)")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Prometheus metrics port (off when unset)")
    worker_id: str | None = Field(None, description="Stable id of this worker (default host:port)")
    device: str = Field("cpu", description="Device label reported in Info (e.g. 'GPU 0', 'MIG 1g.18gb')")
    pool: str = Field(
        "", description="Workload pool this worker serves, reported in Info (e.g. 'short' or 'long': routers with "
        "class_pools send that class here); empty: any pool"
    )
    max_n: int = Field(16, ge=1, description="Largest n (samples per input) accepted")
    max_inputs: int = Field(1024, ge=1, description="Most inputs accepted in one Generate request")
    max_logprobs: int = Field(20, ge=0, description="Most top logprobs per token accepted")
    default_stream_interval_ms: int = Field(
        0, ge=0, description="Coalescing interval used when a request does not set one (0: every engine step)"
    )
    drain_grace_s: float = Field(30.0, ge=0, description="On SIGTERM: how long in-flight streams may finish before stop")
    health_interval_s: float = Field(0.5, gt=0, description="How often engine health is checked")
    # An engine that holds requests but stops producing output (worker/watch/engine_watch.py says why
    # the bound is built this way): the worker turns NOT_SERVING, fails them, and exits (code 4).
    engine_stall_check: bool = Field(
        True, description="Watch engine progress: a stalled engine makes the worker fail its requests and exit"
    )
    engine_stall_floor_s: float = Field(
        4.0, gt=0, description="Engine stall: shortest silence (requests running, no output) judged a stall"
    )
    engine_stall_step_factor: float = Field(
        10.0, gt=0, description="Engine stall: silence allowed, in multiples of the longest recent engine step"
    )
    engine_stall_max_s: float = Field(
        10.0, gt=0, description="Engine stall: longest silence allowed while every running request has produced "
        "output (prompts still pending add their prefill allowance on top)"
    )
    engine_stall_prefill_s_per_1k: float = Field(
        10.0, ge=0, description="Engine stall: extra silence allowed per 1,000 prompt tokens of running requests "
        "with no output yet (a long prefill is not a stall)"
    )
    engine_stall_cold_start_s: float = Field(
        60.0, gt=0, description="Engine stall: silence allowed before the engine's first output ever (lazy compilation)"
    )
    engine_stall_busy_max_s: float = Field(
        60.0, gt=0, description="Engine stall: longest silence allowed while the engine's processes keep using CPU "
        "(a slow step, not a hang; a stopped or blocked engine process uses none)"
    )
    # Off by default: the engine then runs exactly what `vllm serve` renders, always. On, a prompt the
    # router rendered with this worker's own tokenizer files (same digest) skips the worker's
    # rendering; the first ones and a sample after are rendered anyway and compared, and one
    # mismatch ends the trust for the worker's life (worker/router_ids.py).
    accept_router_ids: bool = Field(
        False, description="Run a router's prompt token ids (rendered with this worker's tokenizer files) instead "
        "of rendering the prompt here, verifying some; saves the worker's CPU per request"
    )
    router_ids_verify_first: int = Field(
        32, ge=0, description="With --accept-router-ids: render and compare the first this many prompts that carry ids"
    )
    router_ids_verify_every: int = Field(
        100, ge=1, description="With --accept-router-ids: after the first ones, render and compare 1 prompt in this many"
    )
    max_message_mb: int = Field(64, ge=1, description="Largest gRPC message, in MiB")
    tls_cert: str | None = Field(None, description="PEM certificate: serve gRPC over TLS")
    tls_key: str | None = Field(None, description="PEM private key for --tls-cert")
    tls_client_ca: str | None = Field(None, description="PEM CA: require client certificates signed by it (mTLS)")


# ---------------------------------------------------------------------------------------------
# Model <-> argparse


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(inner type, optional?) of `X | None`."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, model: type[FleetModel],
                *, prefix: str = "", skip: tuple[str, ...] = ()) -> None:
    """Add one `--kebab-name` option per field of `model` (nested models are not expanded)."""
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        flag = "--" + (prefix + name).replace("_", "-")
        dest = prefix + name
        annotation, optional = _unwrap(field.annotation)
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        helptext = (field.description or "").replace("%", "%%")
        if default not in (None, [], False):
            helptext += f" (default: {default})"
        if optional and default is not None and annotation in (int, float):
            helptext += "; 'none' for null"
        kwargs: dict[str, Any] = {"dest": dest, "help": helptext, "default": argparse.SUPPRESS}
        origin = typing.get_origin(annotation)
        if annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif origin is Literal:
            kwargs["choices"] = list(typing.get_args(annotation))
        elif origin is list:
            kwargs["action"] = "append"
        elif optional and annotation in (int, float):
            kwargs["type"] = _number_or_none(annotation)
        elif annotation in (int, float, str):
            kwargs["type"] = annotation
        parser.add_argument(flag, **kwargs)


def _number_or_none(number: type) -> Callable[[str], Any]:
    """An option's type for `int | None` / `float | None` fields: 'none' (or 'null') gives None,
    which for several fields means off (a bound, a target), and a config file's null is not the
    only way to say it."""
    def parse(text: str) -> Any:
        return None if text.strip().lower() in ("none", "null") else number(text)
    parse.__name__ = f"{number.__name__} or 'none'"  # argparse names the type in its error
    return parse


def from_args(model: type[FleetModel], args: argparse.Namespace, *, prefix: str = "", **overrides: Any) -> Any:
    """Build `model` from the options `add_options` added (only those the user gave), plus overrides."""
    values = {}
    for name in model.model_fields:
        if hasattr(args, prefix + name):
            values[name] = getattr(args, prefix + name)
    values.update(overrides)
    return validated(model, values)


def to_options(config: FleetModel) -> list[str]:
    """`config` → the `--option value` list `add_options` reads back, for the fields that were set
    (the rest keep their defaults in the process that reads them)."""
    args: list[str] = []
    for name in sorted(config.model_fields_set):
        value = getattr(config, name)
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list):
            for item in value:
                args += [flag, str(item)]
        elif isinstance(value, float):
            args += [flag, f"{value:g}"]  # 1.0 → "1": VLLM_CPU_KVCACHE_SPACE takes an integer
        elif value is not None:
            args += [flag, str(value)]
    return args


def validated(model: type[FleetModel], values: dict[str, Any]) -> Any:
    """Build a config model, turning pydantic's error into a ConfigError a person can act on."""
    try:
        return model(**values)
    except ValidationError as exc:
        problems = "; ".join(
            f"--{'.'.join(str(p) for p in err['loc']).replace('_', '-')}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid {model.__name__}: {problems}") from None
