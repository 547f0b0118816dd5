"""A Spark job routes by what each engine holds (#26 item 5): rows that share long documents pay
each document's prefill about once per worker, not once per row, even when the documents do not
all fit in one worker's cache. Mock engines with a simulated prefix cache and the packaged
model's tokenizer (the executors' routers tokenize with it, as a gateway does)."""

from __future__ import annotations

import asyncio
import random

from vllm_fleet.client import WorkerClient
from vllm_fleet.models import resolve_model
from vllm_fleet.spark import generate

BS = 16
DOCUMENTS, QUESTIONS = 8, 12
# Each worker's cache holds about 5 of the 8 documents: routing by load alone makes both workers
# cycle through all 8 and evict them again and again.
KV_BLOCKS = 130
TOPICS = "river harbor orchard castle ledger signal meadow bridge".split()


def document(d: int) -> str:
    rng = random.Random(d)
    words = "the of a to in grain weather market tide stone copper lantern valley wheel".split()
    return f"Document {d} about the {TOPICS[d]}: " + " ".join(rng.choice(words) for _ in range(360))


async def misses(addresses: list[str]) -> int:
    """Prompt tokens the engines had to prefill (queried, not found in their caches), summed."""
    total = 0
    for address in addresses:
        async with WorkerClient(address) as client:
            load = await client.load(timeout=10)
        total += load.prefix_cache_queries - load.prefix_cache_hits
    return total


async def test_rows_sharing_documents_pay_each_prefill_about_once_per_worker(spark, mock_worker_factory):
    tokenizer = resolve_model(None, None).path
    # With KV events, as cache-aware routing is deployed (the router warns without them). Without,
    # the router remembers a document only 2 s past a row's first token (speculative_ttl_s), and on
    # a loaded machine a document's rows came further apart than that: one fresh-clone suite run
    # paid 12,688 prompt tokens against this bound of 8,944.
    workers = await mock_worker_factory.start_many(2, mock_kv_blocks=KV_BLOCKS, block_size=BS, mock_tokenizer=tokenizer,
                                                   mock_tokens_per_s=2000, mock_ttft_ms=1, kv_events=True)
    addresses = [w.address for w in workers]
    rows = [(d * QUESTIONS + q, f"{document(d)}\nQuestion {q}: what does it say about item {q}?")
            for d in range(DOCUMENTS) for q in range(QUESTIONS)]
    random.Random(5).shuffle(rows)
    df = spark.createDataFrame(rows, "id long, prompt string").repartition(2)
    before = await misses(addresses)
    out = generate(df, prompt_col="prompt", params={"max_tokens": 2, "temperature": 0}, workers=addresses,
                   router={"policy": "cache_aware"}, max_in_flight=4)
    answered = await asyncio.to_thread(out.collect)
    assert len(answered) == len(rows) and all(r.error is None for r in answered)
    paid = await misses(addresses) - before

    from vllm_fleet.router.prompt.tokenizers import PromptTokenizer  # noqa: PLC0415 - only to size the bound
    tokens = PromptTokenizer.load(tokenizer)
    count = lambda text: len(tokens.completion_ids(text, add_special_tokens=False))  # noqa: E731
    doc_tokens = sum(count(document(d)) for d in range(DOCUMENTS))
    per_row_rest = max(count(prompt) for _, prompt in rows) - min(count(document(d)) for d in range(DOCUMENTS))
    # Once per worker at most for each document, plus each row's own question (and the block
    # it ends in); routing by load alone pays most documents again for most rows.
    bound = 2 * doc_tokens + len(rows) * (per_row_rest + BS)
    assert paid <= bound, f"{paid} prompt tokens prefilled, more than once per worker per document ({bound})"
