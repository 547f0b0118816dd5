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
# Trailing metadata of a Generate call refused with INVALID_ARGUMENT: the request field at
# fault, as MuxEvent.status_param carries it on GenerateMany.
PARAM_METADATA_KEY = "vllm-fleet-param"

__all__ = [
    "PARAM_METADATA_KEY",
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
