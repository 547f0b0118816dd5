"""embed() with real Spark on the session's real pooling worker (all-MiniLM-L6-v2): one vector
per row, equal to what the worker answers the same text alone; a bad row carries its error and
costs its batch nothing. Run under `flock /tmp/vllm-fleet-heavy.lock`."""

from __future__ import annotations

import asyncio
import json

import pytest

from vllm_fleet.client import WorkerClient
from vllm_fleet.errors import ConfigError
from vllm_fleet.protocol.pooling import PoolRequest
from vllm_fleet.spark import embed

pytestmark = pytest.mark.engine

TOO_LONG = "word " * 400  # over the worker's 256-token context: vLLM refuses this row


async def _alone(address: str, text: str) -> list[float]:
    async with WorkerClient(address) as worker:
        reply = await worker.pool(PoolRequest(f"ref-{hash(text)}", "embeddings", json.dumps({"input": text}).encode()))
    return json.loads(reply.body_json)["data"][0]["embedding"]


async def test_embed_one_vector_per_row_and_row_errors(spark, vllm_pooling_worker):
    texts = [f"Sentence number {i} is about {topic}." for i, topic in
             enumerate(["cats", "rivers", "tea", "chess", "trains", "winter"] * 5)]
    rows = [(i, t) for i, t in enumerate(texts)] + [(100, TOO_LONG), (101, None)]
    df = spark.createDataFrame(rows, "id long, text string").repartition(2)
    out = embed(df, input_col="text", workers=[vllm_pooling_worker.address], batch_size=8, max_in_flight=2)
    assert dict(out.dtypes)["embedding"] == "array<float>"
    got = {r.id: r for r in await asyncio.to_thread(out.collect)}

    assert sorted(got) == sorted(i for i, _ in rows)  # rows in = rows out
    good = [got[i] for i in range(len(texts))]
    assert all(r.error is None and len(r.embedding) == 384 and r.worker == vllm_pooling_worker.address for r in good)
    assert got[100].embedding is None and "invalid request" in got[100].error
    assert got[101].embedding is None and "null" in got[101].error
    for i in (0, 7, 29):  # batched with others, the same vector as alone
        alone = await _alone(vllm_pooling_worker.address, texts[i])
        assert max(abs(a - b) for a, b in zip(got[i].embedding, alone)) < 1e-5


async def test_embed_refuses_a_generating_model_at_the_driver(spark, mock_pair):
    df = spark.createDataFrame([(1, "x")], "id long, text string")
    with pytest.raises(ConfigError, match="does not serve embeddings"):
        await asyncio.to_thread(embed, df, input_col="text", workers=[w.address for w in mock_pair])
