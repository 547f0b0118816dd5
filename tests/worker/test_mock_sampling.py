"""The mock engine reads the request body with vLLM's meaning, end to end through a mock worker.

The body reaches the mock as vLLM's SamplingParams (prepare.py), and the mock steers its hashed
tokens by them: logit_bias (+100 forces a token, -100 bans it), allowed_token_ids, seed. A value
vLLM refuses is refused by the mock worker as the real engine's worker refuses it: INVALID_ARGUMENT
naming the field, in vLLM's words.
"""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from vllm_fleet.client import WorkerClient
from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol import PARAM_METADATA_KEY, GenerateInput, GenerateRequest, SamplingParams, build_request
from vllm_fleet.protocol import worker_pb2_grpc
from vllm_fleet.protocol.convert import request_to_pb
from vllm_fleet.worker.engines.mock_tokens import VOCAB

pytest.importorskip("vllm")

PROMPT = [GenerateInput(text="the river runs north")]
TOKENS = 12


@pytest.fixture(scope="module")
async def worker(module_mock_workers):
    process = await module_mock_workers.start(mock_tokens_per_s=2000, mock_ttft_ms=0)
    client = WorkerClient(process.address)
    yield process, client
    await client.close()


async def answer(client: WorkerClient, params: SamplingParams | None = None, **extra_body) -> list[int]:
    """The tokens of the one sample the mock answers PROMPT with, TOKENS long."""
    params = dataclasses.replace(params or SamplingParams(), max_tokens=TOKENS)
    request = build_request("sampling", PROMPT, params, extra_body=extra_body or None)
    tokens = [i for chunk in [c async for c in client.generate(request, timeout=30)] for i in chunk.token_ids]
    assert len(tokens) == TOKENS
    return tokens


async def test_logit_bias_in_the_body_bans_or_forces_a_token(worker):
    _, client = worker
    plain = await answer(client)
    first = plain[0]
    assert await answer(client) == plain  # the mock is deterministic: what changes below is the body's doing
    banned = await answer(client, logit_bias={str(first): -100})  # as an OpenAI client sends it: string keys
    assert banned[0] != first
    assert first not in banned
    other = next(token for token in range(4, len(VOCAB)) if token not in plain)
    assert await answer(client, logit_bias={str(other): 100}) == [other] * TOKENS
    mild = await answer(client, logit_bias={str(first): -5})  # only a bias of ±100 steers the mock
    assert mild == plain


async def test_allowed_token_ids_restrict_every_token(worker):
    _, client = worker
    plain = await answer(client)
    allowed = sorted({token for token in range(4, len(VOCAB)) if token not in plain})[:2]
    restricted = await answer(client, SamplingParams(allowed_token_ids=allowed))
    assert set(restricted) <= set(allowed)
    assert set(restricted) == set(allowed)  # both are used: the choice among them is still the mock's hash
    assert await answer(client, allowed_token_ids=allowed) == restricted  # the same body field, sent raw


async def test_a_seed_gives_a_different_answer_and_the_same_one_again(worker):
    _, client = worker
    plain = await answer(client)
    seeded = await answer(client, SamplingParams(seed=7))
    assert seeded != plain
    assert await answer(client, SamplingParams(seed=7)) == seeded
    assert await answer(client, SamplingParams(seed=8)) not in (seeded, plain)


async def _refusal(address: str, request: GenerateRequest) -> tuple[grpc.StatusCode, str, str | None]:
    """How a Generate call for `request` ends on the wire: its code, details and the field named."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = worker_pb2_grpc.WorkerStub(channel).Generate(request_to_pb(request), timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            async for _ in call:
                pass
    param = dict(failed.value.trailing_metadata() or ()).get(PARAM_METADATA_KEY)
    return failed.value.code(), failed.value.details(), param


def vllms_refusal(**values) -> str:
    """What vLLM's own SamplingParams says of these values."""
    from vllm import SamplingParams as VllmSamplingParams

    with pytest.raises(Exception) as refused:
        VllmSamplingParams(**values)
    return str(refused.value)


@pytest.mark.parametrize("params, extra_body, field, value", [
    (SamplingParams(temperature=-1), None, "temperature", -1.0),
    (None, {"temperature": -1}, "temperature", -1.0),
    (SamplingParams(top_p=0), None, "top_p", 0.0),
    (SamplingParams(min_p=5.0), None, "min_p", 5.0),
    (None, {"min_p": 5}, "min_p", 5.0),
], ids=["temperature-typed", "temperature-body", "top_p-typed", "min_p-typed", "min_p-body"])
async def test_a_value_vllm_refuses_is_refused_by_the_mock_worker_naming_the_field(worker, params, extra_body,
                                                                                    field, value):
    process, client = worker
    request = build_request(f"refused-{field}", PROMPT, params, extra_body=extra_body)
    code, details, param = await _refusal(process.address, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert vllms_refusal(**{field: value}) in details  # vLLM's own words, as the real engine's worker sends them
    assert param == field
    with pytest.raises(InvalidRequestError, match=field):  # the client's view of the same refusal
        await answer(client, params, **(extra_body or {}))


@pytest.mark.parametrize("extra_body, field", [
    ({"allowed_token_ids": [len(VOCAB) + 5]}, "allowed_token_ids"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"logit_bias": {str(len(VOCAB) + 5): 100}}, "logit_bias"),
])
async def test_token_ids_outside_the_vocabulary_are_refused_as_vllm_refuses_them(worker, extra_body, field):
    process, _ = worker
    code, _, param = await _refusal(process.address, build_request("vocab", PROMPT, extra_body=extra_body))
    assert (code, param) == (grpc.StatusCode.INVALID_ARGUMENT, field)
