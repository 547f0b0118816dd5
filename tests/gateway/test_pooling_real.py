"""Pooling endpoints through the gateway, in front of one REAL vLLM worker with the packaged
embedding model (all-MiniLM-L6-v2). Select with `-m engine`.

Vectors are checked against an independent computation of the same model (transformers: BERT,
mean pooling over the attention mask, L2 normalization, as its sentence-transformers files say)
and against the worker's own answer over gRPC.
"""

from __future__ import annotations

import base64
import json
import math
import struct

import httpx
import openai
import pytest

from vllm_fleet.client import WorkerClient
from vllm_fleet.models import ensure_embedding_model
from vllm_fleet.protocol.pooling import PoolRequest

from support import wait_until

pytestmark = pytest.mark.engine

MODEL = "all-MiniLM-L6-v2"
TEXTS = ["A cat sits on the mat.", "Stock markets fell sharply today.", "Ein Hund läuft im Park. 猫"]


@pytest.fixture
async def pooling_gateway(start_gateway, vllm_pooling_worker):
    server = await start_gateway([vllm_pooling_worker.address])
    await wait_until(lambda: server.router.models() == [MODEL], timeout=60, message="the pooling worker serving")
    return server


@pytest.fixture(scope="module")
def reference_vectors():
    """The same model run by transformers in this process: what a correct server must answer."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    folder = ensure_embedding_model()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).float()
        mean = (hidden * mask).sum(1) / mask.sum(1)
        return torch.nn.functional.normalize(mean, dim=-1).tolist()


def _close(a: list[float], b: list[float], tol: float = 1e-4) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b)) < tol


async def test_openai_sdk_embeddings_float_and_base64(pooling_gateway, vllm_pooling_worker, reference_vectors):
    client = openai.AsyncOpenAI(base_url=pooling_gateway.url + "/v1", api_key="x", max_retries=0)
    as_floats = await client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    # The SDK asks for base64 when no format is given, and decodes it itself.
    as_base64 = await client.embeddings.create(model=MODEL, input=TEXTS)
    assert [d.index for d in as_floats.data] == [0, 1, 2]
    assert as_floats.usage.prompt_tokens > len(TEXTS)
    for i, reference in enumerate(reference_vectors):
        assert len(as_floats.data[i].embedding) == 384
        assert _close(as_floats.data[i].embedding, reference), i
        assert _close(as_base64.data[i].embedding, as_floats.data[i].embedding, 1e-6), i

    # The worker answers the gateway's body exactly as it answers a direct Pool call.
    async with WorkerClient(vllm_pooling_worker.address) as worker:
        direct = await worker.pool(PoolRequest("direct-1", "embeddings",
                                               json.dumps({"model": MODEL, "input": TEXTS[0]}).encode()))
    direct_vector = json.loads(direct.body_json)["data"][0]["embedding"]
    assert _close(direct_vector, as_floats.data[0].embedding, 1e-6)

    # One string alone, and the same text as token ids: the same vector.
    single = await client.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float")
    assert _close(single.data[0].embedding, reference_vectors[1])
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(ensure_embedding_model())(TEXTS[1])["input_ids"]
    by_ids = await client.embeddings.create(model=MODEL, input=[ids], encoding_format="float")
    assert _close(by_ids.data[0].embedding, reference_vectors[1])


async def test_raw_base64_is_little_float32(pooling_gateway, reference_vectors):
    async with httpx.AsyncClient(base_url=pooling_gateway.url, timeout=60) as http:
        reply = await http.post("/v1/embeddings", json={"model": MODEL, "input": TEXTS[0],
                                                        "encoding_format": "base64"})
    assert reply.status_code == 200, reply.text
    raw = base64.b64decode(reply.json()["data"][0]["embedding"])
    vector = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert _close(vector, reference_vectors[0])


async def test_rerank_and_score(pooling_gateway, reference_vectors):
    documents = ["The weather is rainy.", TEXTS[0], "A kitten is lying on a rug."]
    async with httpx.AsyncClient(base_url=pooling_gateway.url, timeout=60) as http:
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            reply = await http.post(path, json={"model": MODEL, "query": TEXTS[0], "documents": documents,
                                                "top_n": 2})
            assert reply.status_code == 200, reply.text
            results = reply.json()["results"]
            assert [r["index"] for r in results] == [1, 2]  # itself first, then the kitten
            assert results[0]["document"]["text"] == TEXTS[0]
            assert results[0]["relevance_score"] > results[1]["relevance_score"]
        reply = await http.post("/v1/score", json={"model": MODEL, "queries": TEXTS[0], "documents": [TEXTS[1]]})
        assert reply.status_code == 200, reply.text
        cosine = sum(a * b for a, b in zip(reference_vectors[0], reference_vectors[1]))
        assert math.isclose(reply.json()["data"][0]["score"], cosine, abs_tol=1e-4)


async def test_bad_input_is_a_400_naming_the_field(pooling_gateway):
    async with httpx.AsyncClient(base_url=pooling_gateway.url, timeout=60) as http:
        cases = [
            ({"model": MODEL, "input": 5}, "input"),
            ({"model": MODEL, "input": "x", "dimensions": 8}, "dimensions"),  # not a Matryoshka model
            ({"model": MODEL, "input": "x", "encoding_format": "bytes"}, "encoding_format"),  # not JSON
            ({"model": MODEL, "input": "x", "no_such_field": 1}, "no_such_field"),  # vLLM would ignore it
        ]
        for body, param in cases:
            reply = await http.post("/v1/embeddings", json=body)
            assert reply.status_code == 400, (body, reply.text)
            error = reply.json()["error"]
            assert error["type"] == "invalid_request_error"
            assert error["param"] == param, (body, error)
        reply = await http.post("/classify", json={"model": MODEL, "input": "x"})
        assert reply.status_code == 400
        assert MODEL in reply.json()["error"]["message"] and "/classify" in reply.json()["error"]["message"]
        # Nothing was lost: the worker still serves.
        reply = await http.post("/v1/embeddings", json={"model": MODEL, "input": "still here"})
        assert reply.status_code == 200


async def test_generation_on_an_embedding_model_is_a_clear_400(pooling_gateway):
    client = openai.AsyncOpenAI(base_url=pooling_gateway.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    message = caught.value.body["message"]
    assert MODEL in message and "embed" in message and "/v1/embeddings" in message
