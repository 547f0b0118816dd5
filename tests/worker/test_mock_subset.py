"""The mock engine where vLLM is not installed: a documented subset of the body, the rest refused by name.

vLLM is installed here, so its absence is simulated by `prepare.vllm_installed` answering False
(the one switch prepare.py reads); the mock then prepares requests with mock_subset.py.
"""

from __future__ import annotations

import pytest

from vllm_fleet.config import EngineConfig
from vllm_fleet.errors import InvalidRequestError
from vllm_fleet.protocol import GenerateInput, SamplingParams, build_request
from vllm_fleet.worker import prepare
from vllm_fleet.worker.engines.mock_engine import MockEngine
from vllm_fleet.worker.engines.mock_subset import SUBSET, SubsetSampling


@pytest.fixture
def without_vllm(monkeypatch):
    monkeypatch.setattr(prepare, "vllm_installed", lambda: False)


@pytest.fixture
async def engine():
    engine = MockEngine(EngineConfig(engine="mock", mock_tokens_per_s=10_000, mock_ttft_ms=0))
    await engine.start()
    return engine


async def tokens(engine: MockEngine, request) -> list[int]:
    item = await prepare.prepare_input(engine, 0, request, max_logprobs=5)
    return [t async for deltas in engine.generate("r-0", item.prompt_token_ids, item.engine_params)
            for d in deltas for t in d.token_ids]


async def test_the_subset_gives_the_fields_their_vllm_meaning(without_vllm, engine):
    params = SamplingParams(max_tokens=6, seed=7, stop=["zz"], logprobs=2, min_tokens=1)
    item = await prepare.prepare_input(engine, 0, build_request("r", [GenerateInput(text="a b c")], params),
                                       max_logprobs=5)
    sampling = item.engine_params
    assert isinstance(sampling, SubsetSampling)  # not vLLM's: the simulated machine has none
    assert (sampling.max_tokens, sampling.seed, sampling.stop, sampling.logprobs, sampling.min_tokens) == (
        6, 7, ["zz"], 2, 1)
    assert len(await tokens(engine, build_request("r", [GenerateInput(text="a b c")], params))) == 6


async def test_the_subset_steers_the_mock_as_vllms_params_do(without_vllm, engine):
    prompt = [GenerateInput(text="a b c")]
    plain = await tokens(engine, build_request("r", prompt, SamplingParams(max_tokens=4)))
    banned = await tokens(engine, build_request("r", prompt, SamplingParams(max_tokens=4,
                                                                              logit_bias={plain[0]: -100})))
    assert banned[0] != plain[0]
    only = await tokens(engine, build_request("r", prompt, SamplingParams(max_tokens=4, allowed_token_ids=[9, 10])))
    assert set(only) <= {9, 10}


async def test_a_chat_body_reads_max_completion_tokens_and_top_logprobs(without_vllm, engine):
    request = build_request("r", [GenerateInput(messages=[{"role": "user", "content": "hi"}])],
                            extra_body={"max_completion_tokens": 3, "max_tokens": 9, "logprobs": True,
                                        "top_logprobs": 2})
    item = await prepare.prepare_input(engine, 0, request, max_logprobs=5)
    assert (item.engine_params.max_tokens, item.engine_params.logprobs) == (3, 2)


@pytest.mark.parametrize("body, field", [({"min_p": 0.1}, "min_p"), ({"response_format": {"type": "json_object"}},
                                                                      "response_format")])
async def test_a_field_outside_the_subset_is_refused_by_name(without_vllm, engine, body, field):
    assert field not in SUBSET
    with pytest.raises(InvalidRequestError, match=f"{field}: not honoured by the mock engine") as refused:
        await prepare.prepare_input(engine, 0, build_request("r", [GenerateInput(text="a")], extra_body=body),
                                    max_logprobs=5)
    assert refused.value.param == field


async def test_a_value_of_the_wrong_type_is_refused_by_name(without_vllm, engine):
    with pytest.raises(InvalidRequestError, match="seed must be") as refused:
        await prepare.prepare_input(engine, 0, build_request("r", [GenerateInput(text="a")],
                                                             extra_body={"seed": "seven"}), max_logprobs=5)
    assert refused.value.param == "seed"


async def test_a_cache_salt_is_carried_to_the_engine_without_vllm(without_vllm, engine):
    item = await prepare.prepare_input(engine, 0, build_request("r", [GenerateInput(text="a")],
                                                                extra_body={"cache_salt": "tenant-a"}), max_logprobs=5)
    assert item.cache_salt == "tenant-a"
