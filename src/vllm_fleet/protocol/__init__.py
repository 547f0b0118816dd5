"""The worker protocol (`vllm_fleet.v1.Worker`): generated gRPC code and plain dataclasses.

Code outside this folder uses the dataclasses in `types`, the body builders in `sampling` and
the converters in `convert`, never the generated messages, so the wire format can change in one
place. A request is one form: an envelope plus vLLM's OpenAI body (the top of worker.proto).
"""

from vllm_fleet.protocol.sampling import Constraint, SamplingParams, build_request
from vllm_fleet.protocol.types import (
    ChatMessage,
    Chunk,
    GenerateInput,
    GenerateRequest,
    RequestBody,
    RoutingHints,
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
    "Constraint",
    "GenerateInput",
    "GenerateRequest",
    "RequestBody",
    "RoutingHints",
    "SamplingParams",
    "TokenLogprob",
    "Usage",
    "WorkerInfo",
    "WorkerLoad",
    "build_request",
]
