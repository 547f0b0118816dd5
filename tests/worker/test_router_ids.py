"""A router's prompt ids on the worker (worker/router_ids.py), in process over gRPC: a mock engine
with the packaged model's tokenizer, whose `render` is counted. Trusted ids skip rendering and
answer as rendering does; the first ones are rendered anyway and compared; a mismatch runs the
worker's own ids, is counted and logged, and ends the trust; ids from other files, for prompts
they may not stand for, or to a worker without the option are not used; bad prompts are still
refused with INVALID_ARGUMENT."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from vllm_fleet.client import WorkerClient
from vllm_fleet.config import EngineConfig, WorkerConfig
from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol import GenerateInput, SamplingParams, worker_pb2_grpc
from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol.tokenizer_files import folder_digest
from vllm_fleet.worker.engines.base import build_engine
from vllm_fleet.worker.metrics import WorkerMetrics
from vllm_fleet.worker.service import WorkerService

MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "Grüße aus 北京 😀 — what is the capital of France?"}]


class Worker:
    """A mock-engine worker service on a port, its engine's renders counted."""

    def __init__(self, folder: Path, **config) -> None:
        self.engine = build_engine(EngineConfig(engine="mock", mock_tokenizer=str(folder), mock_max_model_len=512))
        self.registry = CollectorRegistry()
        self.service = WorkerService(self.engine, WorkerConfig(**config), WorkerMetrics(self.registry))
        self.renders = 0
        self.server = grpc.aio.server()
        self.client: WorkerClient | None = None

    async def __aenter__(self) -> Worker:
        await self.engine.start()
        await self.service.router_ids.start(self.engine)
        render = self.own_render = self.engine.render

        async def counted(request):
            self.renders += 1
            return await render(request)
        self.engine.render = counted
        worker_pb2_grpc.add_WorkerServicer_to_server(self.service, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.client = WorkerClient(f"127.0.0.1:{port}")
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.close()
        await self.server.stop(None)
        await self.engine.shutdown()

    def count(self, outcome: str) -> float:
        return self.registry.get_sample_value("vllm_fleet_worker_router_ids_total", {"outcome": outcome}) or 0.0

    async def own_ids(self, **extra) -> list[int]:
        """The worker's own rendering of MESSAGES (what a faithful router sends)."""
        from vllm_fleet.worker.openai.request import build_vllm_request

        request = _request("probe", None, **extra)
        prompt = await self.own_render(build_vllm_request(request, request.inputs[0], tokenizer=self.engine.tokenizer))
        return prompt.token_ids

    async def run(self, request_id: str, ids: list[int] | None, *, digest: str | None = None, **extra):
        request = _request(request_id, ids, digest=self.service.router_ids.digest if digest is None else digest,
                           **extra)
        chunks = [chunk async for chunk in self.client.generate(request, timeout=30)]
        final = chunks[-1]
        return "".join(c.text for c in chunks), final.usage.prompt_tokens


def _request(request_id: str, ids: list[int] | None, *, digest: str = "", messages=None, text: str | None = None,
             max_tokens: int = 8, extra_body: dict | None = None):
    item = (GenerateInput(text=text) if text is not None else GenerateInput(messages=messages or MESSAGES))
    item.router_token_ids, item.router_ids_digest = (list(ids), digest) if ids is not None else (None, "")
    return build_request(request_id, [item], SamplingParams(max_tokens=max_tokens, temperature=0.0),
                         extra_body=extra_body)


async def test_trusted_ids_skip_the_workers_rendering_and_answer_alike(tokenizer_folder):
    async with Worker(tokenizer_folder, accept_router_ids=True, router_ids_verify_first=1,
                      router_ids_verify_every=1000) as worker:
        info = worker.service.worker_info()
        assert info.takes_router_ids and info.tokenizer_digest == folder_digest(tokenizer_folder)
        own = await worker.own_ids()
        baseline = await worker.run("plain", None)
        assert worker.renders == 1
        first = await worker.run("first", own)      # verified: rendered here too, and the same
        assert worker.renders == 2 and worker.count("verified") == 1
        later = [await worker.run(f"later-{i}", own) for i in range(3)]   # trusted: not rendered
        assert worker.renders == 2 and worker.count("used") == 3
        assert first == baseline and all(answer == baseline for answer in later)
        assert baseline[1] == len(own)


async def test_one_in_m_is_verified_after_the_first_k(tokenizer_folder):
    async with Worker(tokenizer_folder, accept_router_ids=True, router_ids_verify_first=2,
                      router_ids_verify_every=3) as worker:
        own = await worker.own_ids()
        for i in range(8):  # offers 1, 2 (first two), then 5 and 8 (every third after them)
            await worker.run(f"r{i}", own)
        assert worker.count("verified") == 4 and worker.count("used") == 4 and worker.renders == 4


async def test_a_mismatch_runs_the_workers_ids_is_counted_and_ends_the_trust(tokenizer_folder, caplog):
    async with Worker(tokenizer_folder, accept_router_ids=True) as worker:
        own = await worker.own_ids()
        baseline = await worker.run("plain", None)
        wrong = own[:-3] + [own[5]] * 7              # another rendering: other ids, another length
        with caplog.at_level(logging.WARNING, logger="vllm_fleet.worker.router_ids"):
            answer = await worker.run("the-odd-one", wrong)
        assert answer == baseline                    # the worker's own prompt ran
        assert worker.count("mismatched") == 1 and worker.count("used") == 0
        record, = [r for r in caplog.records if r.name == "vllm_fleet.worker.router_ids"]
        assert record.request_id == "the-odd-one" and "no longer taken" in record.getMessage()
        assert not worker.service.worker_info().takes_router_ids
        renders = worker.renders
        assert await worker.run("after", own) == baseline   # right ids now, but no longer trusted
        assert worker.renders == renders + 1 and worker.count("declined") == 1 and worker.count("used") == 0


async def test_ids_outside_the_vocabulary_are_a_mismatch_not_the_requests_fault(tokenizer_folder):
    async with Worker(tokenizer_folder, accept_router_ids=True, router_ids_verify_first=0) as worker:
        own = await worker.own_ids()
        baseline = await worker.run("plain", None)
        assert await worker.run("bad-router", own + [10**6]) == baseline
        assert worker.count("mismatched") == 1 and not worker.service.router_ids.takes


async def test_ids_are_declined_from_other_files_for_other_prompts_and_without_the_option(tokenizer_folder):
    async with Worker(tokenizer_folder, accept_router_ids=True, router_ids_verify_first=0) as worker:
        own = await worker.own_ids()
        cases = [{"digest": "sha256:other-files"},
                 {"extra_body": {"truncate_prompt_tokens": 64}}]
        for n, case in enumerate(cases):
            await worker.run(f"declined-{n}", own, **case)
        text_ids = list(worker.engine.tokenizer.encode("Once upon a time", add_special_tokens=False))
        await worker.run("echo", text_ids, text="Once upon a time", extra_body={"echo": True})
        assert worker.count("declined") == 3 and worker.count("used") == 0 and worker.renders == 3
        assert worker.service.router_ids.takes   # declining is no mismatch
    async with Worker(tokenizer_folder) as off:  # the default: not taken, and Info says so
        assert not off.service.worker_info().takes_router_ids
        assert off.service.worker_info().tokenizer_digest == folder_digest(tokenizer_folder)
        await off.run("off", await off.own_ids())
        assert off.renders == 1 and off.count("declined") == 1


async def test_bad_prompts_are_still_refused_as_invalid(tokenizer_folder):
    async with Worker(tokenizer_folder, accept_router_ids=True, router_ids_verify_first=0) as worker:
        own = await worker.own_ids()
        too_long = own * (600 // len(own) + 1)       # past the mock's 512-token context, used unverified
        with pytest.raises(InvalidRequestError, match="context"):
            await worker.run("too-long", too_long)
        assert worker.renders == 0
        ids_input = build_request("user-ids", [GenerateInput(token_ids=[1, 2, 10**6])], SamplingParams(max_tokens=4))
        with pytest.raises(InvalidRequestError, match="vocabulary"):
            [chunk async for chunk in worker.client.generate(ids_input, timeout=30)]
