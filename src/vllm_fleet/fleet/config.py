"""Config models of the fleet room: how to place workers on a node, and how to supervise them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from vllm_fleet.config import FleetModel


class PlanConfig(FleetModel):
    """Where workers go on this node and with which engine settings."""

    engine: Literal["vllm", "mock"] = Field("vllm", description="Engine of every worker: 'vllm' or 'mock' (control-plane tests)")
    model: str | None = Field(
        None, description="HF model id or local folder; capacity is read from its config.json or the built-in table"
    )
    devices: str = Field(
        "all", description="Which devices to use: 'all', 'gpu' (whole GPUs), 'mig', 'cpu', or a comma list of GPU indices / UUIDs"
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per worker; whole GPUs only (MIG slices cannot be combined)")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Fraction of each GPU (or MIG slice) vLLM may use")
    max_model_len: int | None = Field(None, ge=16, description="Context length of every worker (default: the model's)")
    max_num_seqs: int | None = Field(None, ge=1, description="Most sequences each worker runs at once")
    enforce_eager: bool = Field(False, description="No CUDA graphs / compilation: faster start, less memory, slower decode")
    host: str = Field("127.0.0.1", description="Address workers bind to")
    base_port: int = Field(50051, ge=1, le=65535, description="Port of the first worker; the others take the next ones")
    cpu_workers: int | None = Field(None, ge=1, description="CPU machines: number of workers (default: as many as cores and memory allow)")
    cores_per_worker: int = Field(1, ge=1, description="CPU machines: cores bound to each worker (they never share cores)")
    kv_cache_space_gb: int | None = Field(
        None, ge=1, description="CPU machines: KV-cache GiB per worker (default: room for 4 full-length sequences)"
    )
    skip_unfit: bool = Field(
        False, description="Leave out devices the model does not fit on (mixed layouts) instead of refusing the plan"
    )
    kv_events: bool = Field(
        False, description="Every worker relays its engine's KV-cache events, for gateways with --policy cache_aware "
        "(off by default: vLLM builds them on its engine's step)"
    )
    engine_arg: list[str] = Field(default_factory=list, description="Extra vLLM engine argument key=value for every worker; repeatable")


class SupervisorConfig(FleetModel):
    """How the node supervisor keeps its workers alive."""

    startup_timeout_s: float = Field(600.0, gt=0, description="How long a worker may take to report SERVING")
    backoff_initial_s: float = Field(1.0, gt=0, description="Wait before the first restart of a crashed worker")
    backoff_max_s: float = Field(60.0, gt=0, description="Longest wait between restarts (the wait doubles each time)")
    max_restarts: int = Field(5, ge=1, description="Restarts within --restart-window-s after which a flapping worker is given up")
    restart_window_s: float = Field(600.0, gt=0, description="Window in which restarts are counted")
    stop_grace_s: float = Field(30.0, ge=0, description="On stop: how long workers may drain after SIGTERM before SIGKILL")
    health_interval_s: float = Field(5.0, gt=0, description="How often a running worker's health is checked")
    not_serving_grace_s: float = Field(
        30.0, gt=0, description="A running worker not SERVING (or not answering health) this long is stopped and "
        "restarted; one that recovers sooner keeps running"
    )
    log_dir: str | None = Field(None, description="Folder for worker logs (default: a temp folder)")
