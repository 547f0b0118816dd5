"""The bench's settings: one model that also builds the `vllm-fleet bench` options."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from vllm_fleet.config import FleetModel
from vllm_fleet.errors import ConfigError


class BenchConfig(FleetModel):
    """One benchmark: a target, a workload, a load (rates or concurrencies), when to stop, the report."""

    target: str = Field(..., description="http(s)://host:port (any OpenAI-compatible server), grpc://host:port[,host:port] "
                                         "(workers directly), or 'fleet' (route over --workers in-process)")
    workers: str | None = Field(None, description="With --target fleet: worker addresses host:port,host:port")
    policy: str | None = Field(None, description="With --target fleet: routing policy name (default: the router's)")
    model: str | None = Field(None, description="Model name sent to HTTP targets (default: the first of GET /v1/models)")
    api_key: str | None = Field(None, description="Bearer token for HTTP targets")
    workload: Literal["random", "mix", "prefix", "jsonl"] = Field(
        "random", description="random | mix (60% questions, 30% sessions, 10% summaries) | prefix (shared prefixes) | jsonl (--prompts)")
    input_len: int = Field(128, ge=1, description="random/prefix: prompt tokens (the prefix workload's per-request suffix)")
    output_len: int = Field(128, ge=1, description="random/prefix/jsonl: output tokens asked for (max_tokens)")
    prefix_groups: int = Field(4, ge=1, description="prefix: how many distinct shared prefixes")
    prefix_len: int = Field(512, ge=1, description="prefix: tokens in each shared prefix")
    prompts: str | None = Field(None, description="jsonl: file of {'prompt': ...} or {'messages': [...]} lines")
    prompt_format: Literal["auto", "text", "tokens"] = Field(
        "auto", description="random workload: send token ids or text; auto = token ids to workers that report their vocabulary "
                       "(gRPC/fleet), text to HTTP servers; tokens = token ids everywhere")
    rate: str | None = Field(None, description="Open loop: request rate(s) per second, e.g. 4 or 1,2,4,8 (a sweep) or inf")
    burstiness: float = Field(1.0, gt=0, description="Open loop: gamma shape of inter-arrival gaps (1 = Poisson, < 1 = burstier)")
    concurrency: str | None = Field(None, description="Closed loop: users each sending the next request when answered, e.g. 8 or 1,4,16")
    num_requests: int | None = Field(None, ge=1, description="Measured requests per rate (default 100 unless --duration is set)")
    duration: float | None = Field(None, gt=0, description="Seconds of arrivals per rate (after warm-up)")
    warmup_requests: int = Field(2, ge=0, description="Requests sent first at each rate and left out of the figures")
    drain_timeout: float = Field(60.0, gt=0, description="After the last arrival, seconds to wait for answers before "
                                                         "cancelling the rest (counted as error 'unfinished')")
    request_timeout: float = Field(300.0, gt=0, description="Seconds one request may take")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature")
    ignore_eos: bool = Field(True, description="Ask for exactly max_tokens output tokens (vLLM's ignore_eos)")
    stream_interval_ms: int = Field(0, ge=0, description="gRPC/fleet: coalesce tokens into chunks this often (0: every step)")
    multiplex: bool = Field(True, description="gRPC: all requests to a worker over one GenerateMany call "
                                              "(--no-multiplex: one call per request)")
    slo: str | None = Field(None, description="Goodput bounds, e.g. ttft=500ms,tpot=50ms,e2e=800ms")
    seed: int = Field(0, description="Seed of arrivals and workload (same seed, same requests and schedule)")
    label: str | None = Field(None, description="Name of this run in reports and comparisons (default: the target)")
    output: str | None = Field(None, description="Report path: writes PATH (JSON), PATH.md and PATH-*.png (default: print summary only)")
    progress: bool = Field(True, description="Progress bar on stderr")

    def loads(self) -> list[tuple[str, float]]:
        """[("rate", r) ...] or [("concurrency", c) ...]: one run per entry, in order."""
        if self.rate and self.concurrency:
            raise ConfigError("give --rate (open loop) or --concurrency (closed loop), not both")
        if self.concurrency:
            values = _numbers(self.concurrency, "--concurrency")
            if any(v < 1 or v != int(v) for v in values):
                raise ConfigError("--concurrency takes whole numbers >= 1, e.g. 1,4,16")
            return [("concurrency", v) for v in values]
        values = _numbers(self.rate or "inf", "--rate")
        if any(not v > 0 for v in values):
            raise ConfigError("--rate takes positive numbers or inf, e.g. 1,2,4")
        return [("rate", v) for v in values]

    def measured_requests(self) -> int | None:
        if self.num_requests is None and self.duration is None:
            return 100
        return self.num_requests

    @property
    def display_name(self) -> str:
        return self.label or self.target


def _numbers(spec: str, option: str) -> list[float]:
    try:
        values = [math.inf if part.strip().lower() == "inf" else float(part) for part in spec.split(",")]
    except ValueError:
        raise ConfigError(f"{option}: cannot read {spec!r}; write numbers separated by commas, e.g. 1,2,4") from None
    if not values:
        raise ConfigError(f"{option} is empty")
    return values
