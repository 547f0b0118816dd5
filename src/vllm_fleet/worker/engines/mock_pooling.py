"""The mock engine's embeddings (`--mock-pooling`), for control-plane tests of pooling routing
and failover. A named stand-in, never a default: the vector of a text is derived from its hash
(8 floats, unit length), so any worker answers the same text alike and a test can check an
answer that came from another worker after a failover. Only /v1/embeddings with string inputs.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math

from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol.pooling import EMBEDDINGS, PoolRequest, PoolResult

MOCK_DIMENSIONS = 8


def mock_vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    raw = [b - 127.5 for b in digest[:MOCK_DIMENSIONS]]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


async def mock_embeddings(request: PoolRequest, model: str, delay_s: float) -> PoolResult:
    """vLLM's EmbeddingResponse shape for string inputs, after `delay_s` (the engine's time)."""
    if request.endpoint != EMBEDDINGS:
        raise InvalidRequestError(f"the mock engine serves only embeddings, not {request.endpoint!r}", param="model")
    body = json.loads(request.body_json or b"{}")
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InvalidRequestError("the mock engine embeds a string or a list of strings", param="input")
    await asyncio.sleep(delay_s)
    tokens = sum(len(t.split()) for t in texts)
    answer = {"id": f"embd-{request.request_id}", "object": "list", "model": model,
              "data": [{"index": i, "object": "embedding", "embedding": mock_vector(t)} for i, t in enumerate(texts)],
              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return PoolResult(body_json=json.dumps(answer).encode(), prompt_tokens=tokens)
