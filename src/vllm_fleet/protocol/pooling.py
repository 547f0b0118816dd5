"""Pooling requests on the wire (the Pool RPC): embeddings, pooling, score, rerank, classify.

One form, like generation's: the body is vLLM's request model for the endpoint, as JSON, and
the answer is vLLM's response body. The fleet adds only the request id and the priority; it
never reads or rewrites the body's meaning (the worker gives it to vLLM's own serving code).
"""

from __future__ import annotations

from dataclasses import dataclass

# The pooling endpoints of `vllm serve` 0.32, by the name the Pool RPC carries.
EMBEDDINGS, POOLING, SCORE, RERANK, CLASSIFY = "embeddings", "pooling", "score", "rerank", "classify"
POOLING_ENDPOINTS = (EMBEDDINGS, POOLING, SCORE, RERANK, CLASSIFY)
# Each endpoint's main HTTP path at `vllm serve` (and at the gateway), for messages that name it.
ENDPOINT_PATHS = {EMBEDDINGS: "/v1/embeddings", POOLING: "/pooling", SCORE: "/score", RERANK: "/rerank",
                  CLASSIFY: "/classify"}


@dataclass(frozen=True, slots=True)
class PoolRequest:
    request_id: str
    endpoint: str          # one of POOLING_ENDPOINTS
    body_json: bytes       # vLLM's request body for the endpoint
    priority: int = 0


@dataclass(frozen=True, slots=True)
class PoolResult:
    body_json: bytes       # vLLM's response body
    prompt_tokens: int = 0
