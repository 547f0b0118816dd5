"""POST /v1/responses through the gateway, in front of mock workers: the official openai client's
`responses.create`, the event sequence, and the fields the gateway refuses (control plane only;
the engine's meaning is tested against real workers in test_responses_vllm.py)."""

from __future__ import annotations

import httpx
import openai
import pytest

from gateway_support import MODEL_A


@pytest.fixture
def client(gateway):
    return openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


async def test_whole_response_with_usage_and_incomplete_status(client):
    reply = await client.responses.create(model=MODEL_A, input="hello there", max_output_tokens=6,
                                          instructions="be brief", store=False)
    assert reply.object == "response" and reply.id.startswith("resp_")
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.output[0].type == "message" and reply.output_text
    assert reply.usage.output_tokens == 6 and reply.usage.input_tokens > 0
    assert reply.usage.total_tokens == reply.usage.input_tokens + 6
    assert reply.instructions == "be brief" and reply.store is False


async def test_stream_events_in_vllms_order_and_deltas_add_up(client):
    stream = await client.responses.create(model=MODEL_A, input=[{"role": "user", "content": "stream"}],
                                           max_output_tokens=12, stream=True)
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text and final.output_text == text == events[-4].text
    assert final.usage.output_tokens == 12 and final.status == "incomplete"


@pytest.mark.parametrize("field, value", [
    ("previous_response_id", "resp_123"), ("store", True), ("background", True), ("include", ["reasoning.encrypted_content"]),
    ("truncation", "auto"), ("no_such_field", 1),
])
async def test_unserved_fields_are_400_naming_them(gateway, field, value):
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        reply = await http.post("/v1/responses", json={"model": MODEL_A, "input": "x", field: value})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == field
        ok = await http.post("/v1/responses", json={"model": MODEL_A, "input": "x", "max_output_tokens": 2})
        assert ok.status_code == 200 and ok.json()["status"] == "incomplete"


async def test_a_field_vllm_refuses_is_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model=MODEL_A, input="x", temperature=-3)
    assert info.value.body["param"] == "temperature"


async def test_stateful_routes_are_not_served(gateway):
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as http:
        assert (await http.get("/v1/responses/resp_1")).status_code == 404
        assert (await http.post("/v1/responses/resp_1/cancel")).status_code == 404
