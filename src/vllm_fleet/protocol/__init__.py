"""The worker protocol (`vllm_fleet.v1.Worker`): generated gRPC code and plain dataclasses.

Code outside this folder uses the dataclasses in `types` and the converters in `convert`,
never the generated messages, so the wire format can change in one place.
"""

from vllm_fleet.protocol.types import (
    ChatMessage,
    Chunk,
    GenerateInput,
    GenerateRequest,
    SamplingParams,
    TokenLogprob,
    Usage,
    WorkerInfo,
    WorkerLoad,
)

SERVICE_NAME = "vllm_fleet.v1.Worker"

__all__ = [
    "SERVICE_NAME",
    "ChatMessage",
    "Chunk",
    "GenerateInput",
    "GenerateRequest",
    "SamplingParams",
    "TokenLogprob",
    "Usage",
    "WorkerInfo",
    "WorkerLoad",
]
