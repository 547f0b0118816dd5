"""The fleet file: several models on one node, each with its replicas, devices and pool.

    engine: vllm
    registry: zk://zk1:2181/prod
    models:
      - model: Qwen/Qwen3-8B          # 2 replicas, tensor parallel over 2 GPUs each
        replicas: 2
        devices: gpu:0-3
        pool: long
        max_model_len: 32768
      - model: Qwen/Qwen3.5-9B        # one replica per 3g.71gb MIG instance named
        replicas: 2
        devices: mig:3g.71gb
        pool: short
      - model: HuggingFaceTB/SmolLM2-135M-Instruct
        replicas: 2                   # two workers sharing GPU 4, 0.4 of its memory each
        devices: gpu:4@0.4

`devices` says what the replicas of one model get, split evenly between them:

    gpu:0-3, gpu:0,2     whole GPUs; each replica gets (GPUs / replicas) of them, tensor parallel
    gpu:4@0.4            a share of a GPU per replica (its gpu_memory_utilization), on GPU 4
    0.4                  a share of any whole GPU no other model holds whole
    mig:3g.71gb          one MIG instance of that profile per replica (or mig:MIG-<uuid>,...)
    cpu:0-3              CPU cores; each replica gets (cores / replicas) of them

Per model also: served_model_name, pool, max_model_len, max_num_seqs, enforce_eager,
kv_cache_space_gb, kv_events (for cache-aware gateways), engine_arg (vLLM engine arguments), and the worker options max_loras,
max_lora_rank, tool_call_parser, enable_auto_tool_choice, load_format.

YAML or JSON (a `.json` file is read as JSON; anything else as YAML, which JSON also is).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator

from vllm_fleet.config import LORA_RANKS, FleetModel
from vllm_fleet.errors import ConfigError

_SHARE = re.compile(r"^(?:gpu:(?P<gpus>[\d,\s-]+)@)?(?P<share>0?\.\d+|1(?:\.0*)?)$")
_INDICES = re.compile(r"^\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*$")


@dataclass(frozen=True)
class DeviceRequest:
    """`devices` of one model entry, parsed."""

    kind: Literal["gpu", "share", "mig", "cpu"]
    indices: tuple[int, ...] = ()      # gpu: GPU indices; cpu: core ids; share: GPUs allowed (empty: any)
    share: float = 0.0                 # share: fraction of one GPU per replica
    mig: tuple[str, ...] = ()          # mig: profile names or MIG UUIDs


def parse_indices(text: str) -> tuple[int, ...]:
    """"0-2,5" → (0, 1, 2, 5); raises ValueError on anything else."""
    text = text.replace(" ", "")
    if not _INDICES.match(text):
        raise ValueError(f"{text!r} is not a list of indices like 0-3 or 0,2")
    found: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        found.extend(range(int(first), int(last or first) + 1))
    if len(set(found)) != len(found):
        raise ValueError(f"{text!r} names an index twice")
    return tuple(found)


def parse_devices(text: str) -> DeviceRequest:
    """One `devices` string → a DeviceRequest; raises ValueError saying the accepted forms."""
    text = text.strip()
    if match := _SHARE.match(text):
        share = float(match["share"])
        if not 0 < share <= 1:
            raise ValueError(f"a GPU share must be in (0, 1], not {share}")
        gpus = parse_indices(match["gpus"]) if match["gpus"] else ()
        return DeviceRequest(kind="share", indices=gpus, share=share)
    kind, _, rest = text.partition(":")
    if kind == "gpu" and rest:
        return DeviceRequest(kind="gpu", indices=parse_indices(rest))
    if kind == "cpu" and rest:
        return DeviceRequest(kind="cpu", indices=parse_indices(rest))
    if kind == "mig" and rest:
        return DeviceRequest(kind="mig", mig=tuple(p.strip() for p in rest.split(",") if p.strip()))
    raise ValueError(
        f"{text!r} is not a device list: use gpu:0-3 (whole GPUs), gpu:0@0.5 or 0.5 (a share of a GPU), "
        f"mig:3g.71gb (MIG instances of a profile) or cpu:0-3 (CPU cores)"
    )


class ModelEntry(FleetModel):
    """One model of the fleet file: how many workers, where, in which pool, with which settings."""

    model: str = Field(description="HF model id or local folder (capacity is read from its config.json)")
    served_model_name: str | None = Field(None, description="Name clients use for this model (default: from model)")
    replicas: int = Field(1, ge=1, description="Workers of this model; the devices are split evenly between them")
    devices: str = Field(
        description="What the replicas get: gpu:0-3 (whole GPUs), gpu:0@0.5 or 0.5 (a share of a GPU each), "
        "mig:3g.71gb (one MIG instance each), cpu:0-3 (CPU cores)"
    )
    pool: str = Field("", description="Workload pool of these workers (e.g. short or long); empty: any pool")
    tensor_parallel_size: int | None = Field(
        None, ge=1, description="GPUs per replica; must equal the GPUs listed / replicas (default: that)"
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Fraction of each whole GPU or MIG slice vLLM may use (a share sets its own)"
    )
    max_model_len: int | None = Field(None, ge=16, description="Context length (default: the model's)")
    max_num_seqs: int | None = Field(None, ge=1, description="Most sequences each worker runs at once")
    enforce_eager: bool = Field(False, description="No CUDA graphs / compilation: faster start, less memory")
    kv_cache_space_gb: int | None = Field(
        None, ge=1, description="CPU: KV-cache GiB per worker (default: room for 4 full-length sequences)"
    )
    kv_events: bool = Field(
        False, description="Relay each replica's KV-cache events, for gateways with --policy cache_aware (off by "
        "default: vLLM builds them on its engine's step)"
    )
    engine_arg: list[str] = Field(default_factory=list, description="Extra vLLM engine arguments key=value")
    # Worker options that are not engine arguments: the worker must know them to serve the
    # admin and chat endpoints (adapter slots, the tool-call parser), so `engine_arg` can't carry them.
    max_loras: int = Field(0, ge=0, description="LoRA adapter slots per worker (vLLM's max_loras); 0 = LoRA off")
    max_lora_rank: int = Field(16, description="Largest adapter rank accepted (vLLM's max_lora_rank)")
    tool_call_parser: str | None = Field(None, description="vLLM tool-call parser (e.g. hermes) for the model")
    enable_auto_tool_choice: bool = Field(False, description="Allow tool_choice 'auto'; needs tool_call_parser")
    load_format: str | None = Field(None, description="vLLM load format, e.g. 'dummy' (random weights, tests)")

    @field_validator("max_lora_rank")
    @classmethod
    def _lora_rank(cls, value: int) -> int:
        if value not in LORA_RANKS:
            raise ValueError(f"must be one of {', '.join(map(str, LORA_RANKS))}")
        return value

    @property
    def worker_options(self) -> dict[str, object]:
        """The options above that differ from a plain worker's, as EngineConfig fields."""
        options: dict[str, object] = {}
        if self.max_loras:
            options.update(max_loras=self.max_loras, max_lora_rank=self.max_lora_rank)
        if self.tool_call_parser:
            options.update(tool_call_parser=self.tool_call_parser, enable_auto_tool_choice=self.enable_auto_tool_choice)
        if self.load_format:
            options["load_format"] = self.load_format
        return options

    @field_validator("devices")
    @classmethod
    def _devices_parse(cls, value: str) -> str:
        parse_devices(value)
        return value

    @property
    def device_request(self) -> DeviceRequest:
        return parse_devices(self.devices)

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


class FleetFile(FleetModel):
    """Every model this node serves (`vllm-fleet node --fleet-file`)."""

    engine: Literal["vllm", "mock"] = Field("vllm", description="Engine of every worker: 'vllm' or 'mock' (tests)")
    registry: str | None = Field(None, description="zk://host:port/cluster to register workers in (--registry wins)")
    host: str = Field("127.0.0.1", description="Address workers bind to")
    base_port: int = Field(50051, ge=1, le=65535, description="Port of the first worker; the others take the next ones")
    models: list[ModelEntry] = Field(min_length=1, description="The models, each with replicas, devices and pool")


def load_fleet_file(path: str | Path) -> FleetFile:
    """Read and validate a fleet file; ConfigError lists every problem with its place in the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the fleet file {path}: {exc.strerror}") from None
    data = _parse(path, text)
    try:
        return FleetFile.model_validate(data)
    except ValidationError as exc:
        problems = [f"{_location(err['loc'])}: {err['msg']}" for err in exc.errors()]
        raise ConfigError(f"fleet file {path} is invalid:\n  - " + "\n  - ".join(problems)) from None


def _parse(path: Path, text: str) -> object:
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"fleet file {path} is not valid JSON: {exc}") from None
    try:
        import yaml  # installed with vLLM; a JSON fleet file needs nothing
    except ImportError:
        raise ConfigError(f"reading {path} as YAML needs pyyaml; install it or write the file as .json") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"fleet file {path} is not valid YAML: {exc}") from None


def _location(loc: tuple) -> str:
    """('models', 1, 'replicas') → models[1].replicas"""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"
