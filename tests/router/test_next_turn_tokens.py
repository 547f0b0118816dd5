"""A chat answer the router streamed is tokenized after it ends (CacheRouting.answered), so the
conversation's next turn, which sends it back as an assistant message, finds it in the piece
cache: the decision tokenizes only the user's new message, and its ids are those of tokenizing
the whole prompt."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from support import wait_until
from test_head_first_tokens import _decide, _document, _routing, _store, encoding_counted
from vllm_fleet.models import resolve_model
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.registry import StaticRegistry, WorkerRecord
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.cache.routing import CachePrompt


@pytest.fixture(scope="module")
def folder() -> Path:
    return Path(resolve_model(None, None).path)


def _conversation(seed: int) -> tuple[list[dict], str, str]:
    """Earlier turns, the assistant's answer to the last of them, and the user's next message."""
    rng = random.Random(seed)
    turns = [{"role": "system", "content": "You are a helpful assistant."}]
    for n in range(3):
        turns += [{"role": "user", "content": _document(rng.randrange(10**6), 300)},
                  {"role": "assistant", "content": _document(rng.randrange(10**6), 900)}]
    turns.append({"role": "user", "content": _document(rng.randrange(10**6), 300)})
    # An answer under twice the router's head (250 characters): the decision would tokenize all of it.
    return turns, _document(rng.randrange(10**6), 420), "And then? " + _document(rng.randrange(10**6), 200)


def test_the_next_turn_tokenizes_only_the_new_message_once_the_answer_was_seen(folder, monkeypatch):
    seen, unseen, whole = _routing(folder, 250), _routing(folder, 250), _routing(folder, 0)
    earlier, answer, question = _conversation(3)
    for routing in (seen, unseen):
        features, _, request = _decide(routing, earlier)
        _store(routing, "w1", routing.prompt_ids(request, "m"), 1)   # what the engine that answered holds
        if routing is seen:
            routing.answered(request, *features, answer).result()
    next_turn = [*earlier, {"role": "assistant", "content": answer}, {"role": "user", "content": question}]
    encoded = encoding_counted(monkeypatch)
    features, _, _ = _decide(seen, next_turn)
    assert 0 < sum(encoded) <= len(question) + 20            # the new message (and the template's bits)
    encoded.clear()
    _decide(unseen, next_turn)
    assert sum(encoded) >= len(answer)                       # without it, the answer is tokenized in the decision
    expected, _, _ = _decide(whole, next_turn)
    assert features.prompt.block_keys == expected.prompt.block_keys and features.prompt.ids_len == expected.prompt.ids_len > 0


def test_an_answer_with_nothing_known_of_its_prompt_is_not_tokenized(folder):
    routing = _routing(folder, 250)
    request = build_request("r", [GenerateInput(token_ids=[1, 2, 3])], SamplingParams(max_tokens=4))
    assert not routing.wants_answer(request)                 # ids given: there is no conversation to render
    earlier, answer, _ = _conversation(4)
    features, _, request = _decide(routing, earlier)
    assert routing.wants_answer(request)
    assert routing.answered(request, features.features, CachePrompt(), answer) is None


async def test_a_streamed_chat_answer_reaches_the_piece_cache(mock_worker_factory, folder, monkeypatch):
    # Two workers: with a model's only worker there is no decision, and nothing is tokenized.
    workers = [await mock_worker_factory.start(mock_kv_blocks=512, block_size=16, mock_tokenizer=str(folder),
                                               mock_ttft_ms=1, mock_tokens_per_s=2000) for _ in range(2)]
    registry = StaticRegistry([WorkerRecord(address=worker.address) for worker in workers])
    router = Router(registry, RouterConfig(policy="cache_aware", load_poll_interval_s=0.1, health_poll_interval_s=0.2),
                    metrics_registry=CollectorRegistry())
    await router.start()
    try:
        await router.wait_ready(timeout=60)
        await wait_until(lambda: len(router.snapshot().eligible()) == 2, timeout=60, message="both workers serving")
        model = router.snapshot().eligible()[0].model
        await wait_until(lambda: router._cache.tokenizers.get(model) is not None, timeout=60,
                         message="the worker's tokenizer loaded at the router")
        earlier, _, question = _conversation(5)
        request = build_request("turn-1", [GenerateInput(messages=earlier)], SamplingParams(max_tokens=24))
        async with router.stream(request) as stream:
            answer = "".join([chunk.text async for chunk in stream])
        assert answer
        router._cache.close(wait=True)   # the answer is tokenized on the keying thread
        next_turn = [*earlier, {"role": "assistant", "content": answer}, {"role": "user", "content": question}]
        encoded = encoding_counted(monkeypatch)
        tokenizer = router._cache.tokenizers.get(model)
        tokenizer.chat_ids(next_turn)
        assert 0 < sum(encoded) <= len(question) + 20
    finally:
        await router.close()
