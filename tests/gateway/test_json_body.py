"""One reading of a JSON-object body: the json routes and the pydantic ones give the same 400s."""

from __future__ import annotations

import pytest

from vllm_fleet.gateway.anthropic import request as anthropic_request
from vllm_fleet.gateway.api_error import ApiError
from vllm_fleet.gateway.json_body import json_object
from vllm_fleet.gateway.schemas import ChatCompletionRequest
from vllm_fleet.gateway.translate import parse_body


def _error(parse, raw: bytes) -> tuple[int, str, str]:
    with pytest.raises(ApiError) as info:
        parse(raw)
    return info.value.status, info.value.code, info.value.message


@pytest.mark.parametrize("parse", [json_object, lambda raw: parse_body(ChatCompletionRequest, raw),
                                   anthropic_request.parse], ids=["json", "chat", "anthropic"])
def test_every_door_says_not_json_and_not_an_object_alike(parse):
    for raw in (b"[1, 2]", b'"text"', b"3"):
        assert _error(parse, raw) == (400, "invalid_type", "request body must be a JSON object")
    status, code, message = _error(parse, b"{")
    assert (status, code) == (400, "invalid_json") and message.startswith("request body is not valid JSON: ")


def test_an_empty_body_means_what_the_route_says():
    assert json_object(b"" or b"{}") == {}
    assert _error(json_object, b"")[1] == "invalid_json"
    assert _error(json_object, b"" or b"null")[1] == "invalid_type"
    assert json_object(b'{"model": "m"}') == {"model": "m"}
    assert _error(json_object, b"\xff{}")[1] == "invalid_json"  # not UTF-8
