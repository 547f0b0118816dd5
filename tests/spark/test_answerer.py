"""Row-level retries, without Spark: a copy of a running request waits for it (on a mock worker),
and the answerer tells a duplicate from other failures by the error's type (a scripted router)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from vllm_fleet.client import WorkerClient
from vllm_fleet.errors import DuplicateRequestError, InvalidRequestError, MigrationUnsupportedError, WorkerUnavailableError
from vllm_fleet.protocol.sampling import SamplingParams, build_request
from vllm_fleet.protocol.types import Chunk, GenerateInput, GenerateRequest, Usage
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import Router
from vllm_fleet.spark.answerer import Answerer
from vllm_fleet.spark.config import build_config
from test_retry_safety import TABLE as RETRY_TABLE, make as make_error


async def test_a_retried_task_waits_for_its_first_attempt_instead_of_failing_the_row(mock_worker_factory):
    # The copy must reach the worker while the first attempt still runs: 200 tokens at 100/s gives
    # it 2 s, which a loaded CI machine needs (30 tokens, 0.3 s, once let the first attempt finish).
    worker = await mock_worker_factory.start(mock_tokens_per_s=100, mock_ttft_ms=5)
    config = build_config(prompt_col="p", workers=[worker.address], params={"max_tokens": 200}, retry_backoff_s=0.2,
                          row_attempts=10)
    router = Router(StaticRegistry.from_spec(worker.address), config.router_config(), metrics_registry=CollectorRegistry())
    client = WorkerClient(worker.address)
    await router.start()
    try:
        await router.wait_ready(10)
        item = GenerateInput(text="the same row sent twice")
        first = build_request(request_id="spk-row-1", inputs=[item], params=SamplingParams(max_tokens=200))
        chunks = client.generate(first, timeout=30)
        head = await chunks.__anext__()  # the first attempt is running on the worker now
        copy = asyncio.ensure_future(Answerer(router, config).answer(item, "spk-row-1"))
        rest = [c async for c in chunks]
        result = await copy
    finally:
        await client.close()
        await router.close()

    assert result.error is None, result.error
    assert result.attempts > 1, "the worker refused the copy while the first attempt ran"
    assert result.output == head.text + "".join(c.text for c in rest), "then it ran, with the same answer"


class _ScriptedStream:
    """What Router.stream returns, reduced to what the answerer reads: one outcome per send."""

    attempts = 1
    worker = "10.0.0.1:50051"

    def __init__(self, outcome: str | Exception) -> None:
        self._outcome = outcome

    def __aiter__(self):
        return self._chunks()

    async def _chunks(self):
        if isinstance(self._outcome, Exception):
            raise self._outcome
        yield Chunk(index=0, sample=0, text=self._outcome, token_ids=[1], finish_reason="stop", usage=Usage(3, 1))

    async def aclose(self) -> None:
        pass


class _ScriptedRouter:
    def __init__(self, *outcomes: str | Exception) -> None:
        self._outcomes = list(outcomes)
        self.sent_ids: list[str] = []
        self.intervals_ms: list[int] = []

    def stream(self, request: GenerateRequest, *, model: str | None, deadline: float) -> _ScriptedStream:
        self.sent_ids.append(request.request_id)
        self.intervals_ms.append(request.stream_interval_ms)
        return _ScriptedStream(self._outcomes.pop(0))


async def _answer(router: _ScriptedRouter, **options):
    config = build_config(prompt_col="p", workers=["10.0.0.1:50051"], retry_backoff_s=0.01, row_attempts=4, **options)

    async def no_wait(_: float) -> None:
        pass

    return await Answerer(router, config, sleep=no_wait).answer(GenerateInput(text="a row"), "spk-row")


async def test_a_duplicate_is_sent_again_under_the_same_id_once_the_first_may_have_ended():
    router = _ScriptedRouter(DuplicateRequestError("request spk-row is still running"), "the answer")
    result = await _answer(router)
    assert (result.output, result.error) == ("the answer", None)
    assert router.sent_ids == ["spk-row", "spk-row"], "a new id would compute the row a second time"


async def test_other_recoverable_failures_are_resent_under_a_new_id():
    router = _ScriptedRouter(WorkerUnavailableError("worker restarted"), "the answer")
    result = await _answer(router)
    assert result.output == "the answer"
    assert router.sent_ids == ["spk-row", "spk-row-r1"]


async def test_an_invalid_request_fails_the_row_at_once_whatever_its_message_says():
    router = _ScriptedRouter(InvalidRequestError("prompt spk-row is already running too long", param="prompt"))
    result = await _answer(router)
    assert result.error is not None and result.error.startswith("invalid request")
    assert router.sent_ids == ["spk-row"], "only the error's type says it is a duplicate, never its text"


async def test_a_constrained_answer_that_could_not_migrate_is_resent_whole():
    # Fatal for the stream (its grammar cannot continue on another worker), but nothing of the
    # row reached anyone: the row starts again under a new id.
    router = _ScriptedRouter(MigrationUnsupportedError("worker lost after the first token"), '{"a": 1}')
    result = await _answer(router)
    assert (result.output, result.error) == ('{"a": 1}', None)
    assert router.sent_ids == ["spk-row", "spk-row-r1"]


async def test_rows_ask_workers_to_coalesce_their_tokens():
    # A row is written whole: per-step chunks would only spend the CPU that chat streams on the
    # same workers need (#29's ITL). The first token still comes at once (worker/coalescer.py).
    router = _ScriptedRouter("the answer", "the answer")
    assert (await _answer(router)).output == "the answer"
    assert router.intervals_ms == [250]
    assert (await _answer(router, stream_interval_ms=0)).output == "the answer"
    assert router.intervals_ms == [250, 0], "0 asks for every engine step"


@pytest.mark.parametrize("cls", sorted(RETRY_TABLE, key=lambda c: c.__name__), ids=lambda c: c.__name__)
async def test_a_row_is_sent_again_exactly_when_its_error_s_type_says_a_resend_is_safe(cls):
    # One row per error class of the tree (tests/test_retry_safety.py's table): the answerer reads
    # the type's `resend_safe`, never a list of its own.
    router = _ScriptedRouter(make_error(cls), "the answer")
    result = await _answer(router)
    resent = len(router.sent_ids) == 2
    assert resent is RETRY_TABLE[cls][1], (router.sent_ids, result.error)
    assert (result.error is None) is resent
