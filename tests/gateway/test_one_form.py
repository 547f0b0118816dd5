"""One request, one form: the issue's done-criterion, checked against vLLM itself.

"A request from the gateway, the Python client and Spark with the same parameters reaches the
engine as equal vLLM SamplingParams." Each front door builds its request its own way:

  gateway  the OpenAI JSON body, through parse_body + chat_plan / completion_plan;
  client   build_request(..., SamplingParams(...)), the typed API;
  Spark    build_config(params=...), the config as it travels to an executor (model_dump, then
           SparkGenerateConfig(**...)), the row through rows.to_input, and Answerer, whose
           request a stand-in router captures.

Every request then goes the worker's way (openai/request.build_vllm_request, then vLLM's
to_sampling_params, as worker/prepare.py does) and the vLLM SamplingParams, every field of them,
must be equal, as must the messages or prompt vLLM sees and the envelope the fleet schedules.
The parameters are written twice on purpose, once as an OpenAI client writes them and once
typed: a door that built a different body fails here. Spark's n is always 1 (one output per
row), so Spark is compared with the other doors asked for n=1.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.schemas import ChatCompletionRequest, CompletionRequest
from vllm_fleet.gateway.translate import chat_plan, completion_plan, parse_body
from vllm_fleet.protocol.sampling import Constraint, SamplingParams, build_request, requested_max_tokens
from vllm_fleet.protocol.types import ChatMessage, Chunk, GenerateInput, GenerateRequest, Usage
from vllm_fleet.spark.answerer import Answerer
from vllm_fleet.spark.config import SparkGenerateConfig, build_config
from vllm_fleet.spark.rows import to_input
from vllm_fleet.worker.openai.request import build_vllm_request

CONTEXT = 4096
GATEWAY = GatewayConfig(max_n=4)
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}]
PROMPT = "Once upon a time"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@dataclass(frozen=True)
class Case:
    """The same parameters, as an OpenAI client writes them and as the typed API does."""

    name: str
    endpoint: str                     # "chat" or "completion"
    openai: dict[str, Any]            # the body's sampling fields (no model, messages, prompt, n)
    typed: dict[str, Any]             # SamplingParams fields (no n)
    prompt: Any = field(default=None)  # completion: the prompt (text, or token ids for no Spark door)

    @property
    def spark(self) -> bool:
        return self.endpoint == "chat" or isinstance(self.prompt, str)


CASES = [
    Case("sampling", "chat",
         {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "max_tokens": 16, "stop": ["END", "\n\n"], "seed": 7,
          "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1},
         dict(temperature=0.7, top_p=0.9, top_k=40, max_tokens=16, stop=["END", "\n\n"], seed=7,
              presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.1)),
    Case("logprobs and logit_bias", "chat",
         {"temperature": 0.8, "max_tokens": 12, "logprobs": True, "top_logprobs": 3,
          "logit_bias": {"42": 5.5, "7": -100}, "min_p": 0.05, "min_tokens": 2, "stop_token_ids": [13]},
         dict(temperature=0.8, max_tokens=12, logprobs=3, logit_bias={42: 5.5, 7: -100}, min_p=0.05, min_tokens=2,
              stop_token_ids=[13])),
    Case("json schema", "chat",
         {"temperature": 0.6, "max_tokens": 32, "structured_outputs": {"json": SCHEMA}},
         dict(temperature=0.6, max_tokens=32, constraint=Constraint(json_schema=json.dumps(SCHEMA)))),
    Case("choice and flags", "chat",
         {"temperature": 0.5, "max_tokens": 4, "structured_outputs": {"choice": ["red", "green"]},
          "include_stop_str_in_output": True, "ignore_eos": True},
         dict(temperature=0.5, max_tokens=4, constraint=Constraint(choice=["red", "green"]),
              include_stop_str_in_output=True, ignore_eos=True)),
    Case("completion logprobs and regex", "completion",
         {"temperature": 0.9, "top_p": 0.95, "max_tokens": 8, "logprobs": 2, "seed": 11, "stop": ["."],
          "structured_outputs": {"regex": "[ab]+"}},
         dict(temperature=0.9, top_p=0.95, max_tokens=8, logprobs=2, seed=11, stop=["."],
              constraint=Constraint(regex="[ab]+")),
         prompt=PROMPT),
    Case("completion bad words and allowed tokens", "completion",
         {"temperature": 1.2, "max_tokens": 6, "min_p": 0.1, "bad_words": ["never"],
          "allowed_token_ids": [3, 4, 5, 6], "truncate_prompt_tokens": 64},
         dict(temperature=1.2, max_tokens=6, min_p=0.1, bad_words=["never"], allowed_token_ids=[3, 4, 5, 6],
              truncate_prompt_tokens=64),
         prompt=PROMPT),
    Case("token ids and json object", "completion",
         {"temperature": 0.3, "max_tokens": 10, "structured_outputs": {"json_object": True}},
         dict(temperature=0.3, max_tokens=10, constraint=Constraint(json_object=True)),
         prompt=[5, 6, 7, 8]),
]

# Values that are "off" or zero but not absent: each one changes what vLLM does (greedy, seed 0,
# the chosen token's logprob only, special tokens kept). Greedy sampling needs n=1.
ZEROS = Case("zero values are values", "chat",
             {"temperature": 0.0, "seed": 0, "logprobs": True, "top_logprobs": 0, "skip_special_tokens": False,
              "presence_penalty": 0.0, "min_tokens": 0, "max_tokens": 9},
             dict(temperature=0.0, seed=0, logprobs=0, skip_special_tokens=False, presence_penalty=0.0, min_tokens=0,
                  max_tokens=9))


# ---- the three front doors ------------------------------------------------------------------

def gateway_request(case: Case, n: int) -> GenerateRequest:
    if case.endpoint == "chat":
        body = {"model": "m", "messages": MESSAGES, **case.openai}
        schema, plan = ChatCompletionRequest, chat_plan
    else:
        body = {"model": "m", "prompt": case.prompt, **case.openai}
        schema, plan = CompletionRequest, completion_plan
    if n != 1:
        body["n"] = n
    parsed = parse_body(schema, json.dumps(body).encode())
    return plan(parsed, request_id="gw-1", session_id="", config=GATEWAY, max_model_len=CONTEXT).request


def client_request(case: Case, n: int) -> GenerateRequest:
    if case.endpoint == "chat":
        item = GenerateInput(messages=[ChatMessage(m["role"], m["content"]) for m in MESSAGES])
    elif isinstance(case.prompt, str):
        item = GenerateInput(text=case.prompt)
    else:
        item = GenerateInput(token_ids=list(case.prompt))
    return build_request("py-1", [item], SamplingParams(**case.typed, n=n))


class CapturingRouter:
    """Stands in for Router.stream: keeps the request Spark's answerer sends, answers one chunk."""

    def __init__(self) -> None:
        self.sent: list[GenerateRequest] = []

    def stream(self, request: GenerateRequest, *, model: str | None, deadline: float) -> _OneChunk:
        self.sent.append(request)
        return _OneChunk()


class _OneChunk:
    attempts = 1
    worker = "10.0.0.1:50051"

    def __aiter__(self):
        return self._chunks()

    async def _chunks(self):
        yield Chunk(index=0, sample=0, text="ok", token_ids=[1], finish_reason="stop", usage=Usage(3, 1))

    async def aclose(self) -> None:
        pass


async def spark_request(case: Case, params_as: str) -> GenerateRequest:
    """`params_as`: "typed" (generate(params=SamplingParams(...))) or "dict" (params={...})."""
    typed = SamplingParams(**case.typed)
    params = typed if params_as == "typed" else _as_dict(typed)
    chat = case.endpoint == "chat"
    columns = {"messages_col": "messages"} if chat else {"prompt_col": "prompt"}
    driver_side = build_config(**columns, workers=["10.0.0.1:50051"], params=params)
    config = SparkGenerateConfig(**driver_side.model_dump())  # as answer_partition gets it on an executor
    router = CapturingRouter()
    result = await Answerer(router, config).answer(to_input(MESSAGES if chat else case.prompt, chat=chat), "spk-1")
    assert result.error is None, result.error
    [request] = router.sent
    return request


def _as_dict(typed: SamplingParams) -> dict[str, Any]:
    """The parameters as a plain dict, every field that differs from its default, as a user writes them."""
    values = {}
    for f in dataclasses.fields(typed):
        value = getattr(typed, f.name)
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if value != default or type(value) is not type(default):
            values[f.name] = dataclasses.asdict(value) if isinstance(value, Constraint) else value
    return values


# ---- what the engine gets -------------------------------------------------------------------

def at_the_engine(request: GenerateRequest) -> dict[str, Any]:
    """What the worker's preparation makes of the request's (one) input: vLLM's SamplingParams,
    every field, and the messages or prompt vLLM renders, with the envelope the fleet schedules."""
    [item] = request.inputs
    vllm_request = build_vllm_request(request, item)
    max_tokens = requested_max_tokens(dict(vllm_request)) or CONTEXT  # worker/prepare.py's get_max_tokens, bounded
    params = vllm_request.to_sampling_params(max_tokens, {})
    seen = {name: getattr(params, name) for name in type(params).__struct_fields__}
    prompt = vllm_request.messages if request.body.endpoint == "chat" else vllm_request.prompt
    envelope = {"endpoint": request.body.endpoint, "n": request.n, "priority": request.priority,
                "constrained": request.constrained, "max_tokens_hint": request.hints.max_tokens}
    return {"sampling_params": seen, "prompt": prompt, "envelope": envelope}


def assert_same(doors: dict[str, GenerateRequest]) -> None:
    engine = {door: at_the_engine(request) for door, request in doors.items()}
    (first, reference), *others = engine.items()
    for door, seen in others:
        for part in ("sampling_params", "prompt", "envelope"):
            differs = {k: (reference[part][k], seen[part][k]) for k in reference[part]
                       if reference[part][k] != seen[part][k]} if isinstance(reference[part], dict) else None
            assert seen[part] == reference[part], f"{door} differs from {first} in {part}: {differs or seen[part]}"


# ---- the criterion --------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_gateway_and_client_reach_the_engine_alike_with_n(case):
    doors = {"gateway": gateway_request(case, n=2), "client": client_request(case, n=2)}
    assert_same(doors)
    params = at_the_engine(doors["gateway"])["sampling_params"]
    assert params["n"] == 2


@pytest.mark.parametrize("params_as", ["typed", "dict"])
@pytest.mark.parametrize("case", [c for c in CASES if c.spark], ids=[c.name for c in CASES if c.spark])
async def test_spark_reaches_the_engine_as_the_gateway_and_the_client(case, params_as):
    doors = {"gateway": gateway_request(case, n=1), "client": client_request(case, n=1),
             "spark": await spark_request(case, params_as)}
    assert_same(doors)


@pytest.mark.parametrize("params_as", ["typed", "dict"])
async def test_zero_values_reach_the_engine_from_every_door(params_as):
    doors = {"gateway": gateway_request(ZEROS, n=1), "client": client_request(ZEROS, n=1),
             "spark": await spark_request(ZEROS, params_as)}
    assert_same(doors)
    params = at_the_engine(doors["gateway"])["sampling_params"]
    assert (params["temperature"], params["seed"], params["logprobs"], params["skip_special_tokens"]) == (0.0, 0, 0, False)


def test_the_comparison_sees_a_different_body():
    """The check itself: one changed field in one door's body is a difference at the engine."""
    case = CASES[1]
    gateway = gateway_request(case, n=1)
    client = client_request(dataclasses.replace(case, typed={**case.typed, "logit_bias": {42: 5.5}}), n=1)
    with pytest.raises(AssertionError, match="logit_bias"):
        assert_same({"gateway": gateway, "client": client})
    reprompted = dataclasses.replace(gateway, inputs=[GenerateInput(messages=MESSAGES[1:])])
    with pytest.raises(AssertionError, match="prompt"):
        assert_same({"gateway": gateway, "other": reprompted})
