"""The router's prompt ids on the wire (CacheRouting.attempt_request, RoutedStream._attempt): a
cache_aware router puts input 0's ids on an attempt only for a worker that takes router ids with
the digest of the files the router rendered with, and only when it has the whole prompt's ids at
decision time (not a head of a long new text). In-process workers (mock engine with the packaged
model's tokenizer, KV events on) count what they did with the ids."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import CollectorRegistry

from fakes import started_router
from vllm_fleet.config import EngineConfig, WorkerConfig
from vllm_fleet.protocol import GenerateInput, SamplingParams
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol.types import WorkerInfo
from vllm_fleet.router import Router, RouterConfig
from vllm_fleet.router.cache.routing import CachePrompt, CacheRouting
from vllm_fleet.router.cache.tuning import CacheTuning
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.metrics import RouterMetrics
from vllm_fleet.worker.engines.base import build_engine
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.server import WorkerServer

FAST = dict(load_poll_interval_s=0.1, health_poll_interval_s=0.2)
TOPICS = ["rivers of Europe", "the history of tea", "how bridges stand", "prime numbers", "baking bread"]


@asynccontextmanager
async def serving(folder: Path, **config):
    """An in-process worker (WorkerServer: health, Info, KV events) whose renders are counted."""
    engine = build_engine(EngineConfig(engine="mock", mock_tokenizer=str(folder), mock_kv_blocks=512, block_size=16,
                                       kv_events=True, mock_max_model_len=4096))
    registry = CollectorRegistry()
    server = WorkerServer(WorkerConfig(port=0, **config), engine, WorkerMetrics(registry))
    await server.start()
    render, counts = engine.render, {"renders": 0}

    async def counted(request):
        counts["renders"] += 1
        return await render(request)
    engine.render = counted
    outcomes = lambda: {o: registry.get_sample_value("vllm_fleet_worker_router_ids_total", {"outcome": o}) or 0
                        for o in ("used", "verified", "mismatched", "declined")}
    try:
        yield SimpleNamespace(address=server.address, counts=counts, outcomes=outcomes)
    finally:
        await server.drain_and_stop()


@asynccontextmanager
async def routed(*addresses: str):
    async with started_router(list(addresses), RouterConfig(policy="cache_aware", **FAST)) as router:
        await router.wait_cache_ready(timeout=60)
        yield router


@asynccontextmanager
async def two_workers(folder: Path, **config):
    async with serving(folder, **config) as first, serving(folder, **config) as second:
        yield first, second


def _summed(workers) -> tuple[dict, int]:
    outcomes = [w.outcomes() for w in workers]
    return {o: sum(out[o] for out in outcomes) for o in outcomes[0]}, sum(w.counts["renders"] for w in workers)


async def _chat(router: Router, rid: str, topic: str) -> int:
    messages = [{"role": "system", "content": "You are a careful assistant. " * 10},
                {"role": "user", "content": f"Tell me about {topic}, briefly."}]
    request = build_request(rid, [GenerateInput(messages=messages)], SamplingParams(max_tokens=2, temperature=0))
    async with router.stream(request) as stream:
        usage = [c.usage async for c in stream if c.usage is not None]
    return usage[-1].prompt_tokens


async def test_a_worker_that_takes_ids_gets_them_and_skips_rendering(tokenizer_folder):
    async with two_workers(tokenizer_folder, accept_router_ids=True, router_ids_verify_first=0,
                           router_ids_verify_every=1000) as workers, routed(*(w.address for w in workers)) as router:
        for n, topic in enumerate(TOPICS):
            await _chat(router, f"chat-{n}", topic)
        assert _summed(workers) == ({"used": 5, "verified": 0, "mismatched": 0, "declined": 0}, 0)
        # A long new text: the decision tokenized only its head, so no ids go with it.
        text = " ".join(f"word{i} of a long fresh document" for i in range(300))
        request = build_request("long", [GenerateInput(text=text)], SamplingParams(max_tokens=2))
        async with router.stream(request) as stream:
            [c async for c in stream]
        assert _summed(workers) == ({"used": 5, "verified": 0, "mismatched": 0, "declined": 0}, 1)


async def test_a_worker_without_the_option_gets_no_ids(tokenizer_folder):
    async with two_workers(tokenizer_folder) as workers, routed(*(w.address for w in workers)) as router:
        for n, topic in enumerate(TOPICS[:3]):
            await _chat(router, f"chat-{n}", topic)
        assert _summed(workers) == ({"used": 0, "verified": 0, "mismatched": 0, "declined": 0}, 3)


async def test_the_only_worker_of_a_model_gets_prompts_the_router_never_keyed(tokenizer_folder):
    """With one worker there is nothing to decide (#49 goal 2): the router neither tokenizes nor
    sends ids, and the worker renders each prompt itself, as under any other policy."""
    async with serving(tokenizer_folder, accept_router_ids=True, router_ids_verify_first=0,
                       router_ids_verify_every=1000) as worker, routed(worker.address) as router:
        for n, topic in enumerate(TOPICS[:3]):
            await _chat(router, f"chat-{n}", topic)
        assert _summed([worker]) == ({"used": 0, "verified": 0, "mismatched": 0, "declined": 0}, 3)
        stats = router.cache_stats()
        assert stats["routed_without_choice"] == 3 and stats["routed_without_ids"] == 0


class _Tokenizers:
    """The part of TokenizerCache that attempt_request reads, and what on_info calls."""

    def digest(self, model: str) -> str:
        return "sha256:router-files"

    def ensure(self, *args, **kwargs) -> None:
        return None


def test_ids_go_per_attempt_only_where_the_digests_agree():
    cache = CacheRouting(RouterConfig(policy="cache_aware"), lambda address: None,
                         RouterMetrics.for_registry(CollectorRegistry()), tokenizers=_Tokenizers())
    for address, takes, digest in [("same", True, "sha256:router-files"), ("other-files", True, "sha256:x"),
                                   ("off", False, "sha256:router-files")]:
        cache.on_info(address, WorkerInfo(model="m", max_model_len=4096, engine="vllm", engine_version="0.32.0",
                                          tokenizer_digest=digest, takes_router_ids=takes), lambda: "m")
    request = build_request("r", [GenerateInput(text="hello there")], SamplingParams(max_tokens=2))
    features, prompt = RequestFeatures(model="m"), CachePrompt(ids=(1, 2, 3))
    sent = cache.attempt_request("same", request, features, prompt)
    assert sent.inputs[0].router_token_ids == [1, 2, 3] and sent.inputs[0].router_ids_digest == "sha256:router-files"
    assert request.inputs[0].router_token_ids is None        # the caller's request is never changed
    for address in ("other-files", "off", "unknown"):        # a retry there goes without them
        assert cache.attempt_request(address, request, features, prompt) is request
    assert cache.attempt_request("same", request, features, CachePrompt()) is request  # only a head known
    cache.forget("same")
    assert cache.attempt_request("same", request, features, prompt) is request


def test_a_router_told_not_to_send_ids_sends_none():
    cache = CacheRouting(RouterConfig(policy="cache_aware", cache_tuning=CacheTuning(send_prompt_ids=False)), lambda address: None,
                         RouterMetrics.for_registry(CollectorRegistry()), tokenizers=_Tokenizers())
    cache.on_info("same", WorkerInfo(model="m", max_model_len=4096, engine="vllm", engine_version="0.32.0",
                                     tokenizer_digest="sha256:router-files", takes_router_ids=True), lambda: "m")
    request = build_request("r", [GenerateInput(text="hello there")], SamplingParams(max_tokens=2))
    assert cache.attempt_request("same", request, RequestFeatures(model="m"), CachePrompt(ids=(1, 2, 3))) is request
