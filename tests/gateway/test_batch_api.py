"""OpenAI's Batch API on the gateway, through the official openai client, with mock workers."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from support import wait_until

from vllm_fleet.gateway.batch import api as api_module
from vllm_fleet.gateway.batch import runner as runner_module
from vllm_fleet.gateway.batch.runner import BatchRunner
from vllm_fleet.gateway.batch.store import FileRow, LineRow, Store
from vllm_fleet.gateway.config import GatewayConfig
from vllm_fleet.gateway.server import GatewayServer
from vllm_fleet.registry import StaticRegistry
from vllm_fleet.router import RouterConfig
from vllm_fleet.router.classes.service_class import ServiceClassConfig

from gateway_support import MODEL_A

CHAT = "/v1/chat/completions"


def chat_line(custom_id: str, text: str = "hello there", **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": CHAT,
            "body": {"model": MODEL_A, "messages": [{"role": "user", "content": text}], "max_tokens": 5, "seed": 1,
                     **body}}


def jsonl(lines: list) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


@pytest.fixture
async def batch_gateway(start_gateway, mock_fleet, tmp_path):
    server = await start_gateway([w.address for w in mock_fleet["a"]], batch_dir=str(tmp_path / "batch"))
    await wait_until(lambda: MODEL_A in server.router.models(), timeout=20, message="model A")
    return server


def client_of(server: GatewayServer, key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


async def run_batch(client: openai.AsyncOpenAI, lines: list, *, until: tuple[str, ...] = ("completed",)):
    uploaded = await client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    batch = await client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h",
                                        metadata={"job": "test"})
    assert batch.status == "validating" and batch.id.startswith("batch_")
    return await wait_status(client, batch.id, until)


async def wait_status(client: openai.AsyncOpenAI, batch_id: str, statuses: tuple[str, ...], timeout: float = 30):
    seen = {}

    async def done() -> bool:
        seen["batch"] = await client.batches.retrieve(batch_id)
        return seen["batch"].status in statuses

    await wait_until(done, timeout=timeout, message=f"batch {batch_id} to be {statuses}")
    return seen["batch"]


async def lines_of(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [json.loads(line) for line in content.content.decode().splitlines()]


async def test_batch_runs_to_completion_and_answers_as_online(batch_gateway):
    client = client_of(batch_gateway)
    batch = await run_batch(client, [chat_line(f"r{i}", f"question number {i}") for i in range(6)])
    assert batch.request_counts.total == 6 and batch.request_counts.completed == 6 and batch.request_counts.failed == 0
    assert batch.metadata == {"job": "test"} and batch.in_progress_at and batch.completed_at and batch.error_file_id is None
    output = await lines_of(client, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == [f"r{i}" for i in range(6)]
    first = next(line for line in output if line["custom_id"] == "r0")
    assert first["id"].startswith("batch_req_") and first["error"] is None
    assert first["response"]["status_code"] == 200
    answer = first["response"]["body"]
    assert answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    online = json.loads(await http_call(batch_gateway, "POST", CHAT, chat_line("x", "question number 0")["body"]))
    # The same answer as online, but for the id and the time it was made.
    assert {k: v for k, v in answer.items() if k not in ("id", "created")} == \
        {k: v for k, v in online.items() if k not in ("id", "created")}
    assert answer["usage"]["completion_tokens"] == 5
    listed = await client.batches.list(limit=5)
    assert batch.id in [b.id for b in listed.data]
    metrics = (await http_call(batch_gateway, "GET", "/metrics")).decode()
    assert 'vllm_fleet_gateway_batch_lines_total{outcome="done"} 6.0' in metrics


async def http_call(server: GatewayServer, method: str, path: str, body: dict | None = None) -> bytes:
    async with httpx.AsyncClient() as http:
        return (await http.request(method, server.url + path, json=body)).content


async def test_malformed_lines_get_error_lines_and_the_rest_run(batch_gateway):
    client = client_of(batch_gateway)
    lines = [chat_line("good1"), "{not json", {"method": "POST", "url": CHAT, "body": {}}, chat_line("good1"),
             {**chat_line("wrong-url"), "url": "/v1/embeddings"}, {**chat_line("wrong-method"), "method": "GET"},
             chat_line("refused", bogus_field=1), chat_line("too-many", n=1000), chat_line("good2")]
    batch = await run_batch(client, lines)
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (9, 2, 7)
    assert sorted(line["custom_id"] for line in await lines_of(client, batch.output_file_id)) == ["good1", "good2"]
    errors = await lines_of(client, batch.error_file_id)
    codes = {(e["custom_id"], (e["error"] or {}).get("code") or e["response"]["status_code"]) for e in errors}
    assert codes == {(None, "invalid_json_line"), (None, "missing_custom_id"), ("good1", "duplicate_custom_id"),
                     ("wrong-url", "invalid_url"), ("wrong-method", "invalid_method"), ("refused", 400),
                     ("too-many", 400)}
    refused = next(e for e in errors if e["custom_id"] == "refused")
    assert refused["response"]["body"]["error"]["param"] == "bogus_field"


async def test_a_file_with_no_requests_fails_the_batch(batch_gateway):
    client = client_of(batch_gateway)
    uploaded = await client.files.create(file=("empty.jsonl", b"\n\n"), purpose="batch")
    batch = await client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    batch = await wait_status(client, batch.id, ("failed",))
    assert batch.errors.data[0].code == "empty_file"


def gate(after: int) -> tuple:
    """An admit hook that lets `after` lines start, then holds the rest; and how many it let through."""
    let_through = {"n": 0}
    held = asyncio.Event()

    async def admit(batch_id: str) -> None:
        if let_through["n"] >= after:
            await held.wait()
        let_through["n"] += 1

    return admit, let_through


async def test_cancel_stops_new_lines_and_keeps_the_finished_ones(batch_gateway):
    batch_gateway.app.batches.admit, _ = gate(after=2)
    client = client_of(batch_gateway)
    uploaded = await client.files.create(file=("in.jsonl", jsonl([chat_line(f"c{i}") for i in range(5)])),
                                         purpose="batch")
    batch = await client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    await wait_until(lambda: _completed(client, batch.id, 2), timeout=20, message="two lines done")
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    batch = await wait_status(client, batch.id, ("cancelled",))
    assert batch.cancelled_at and batch.request_counts.completed == 2
    assert len(await lines_of(client, batch.output_file_id)) == 2
    assert (await client.batches.cancel(batch.id)).status == "cancelled"  # a cancelled batch stays cancelled


async def test_a_batch_expires_at_the_end_of_its_window_with_the_lines_finished_by_then(batch_gateway,
                                                                                       monkeypatch):
    """Lines still waiting for slack when the completion window ends do not hold the batch open:
    it becomes `expired`, its output keeps the lines answered before, and no line runs after."""
    monkeypatch.setattr(api_module, "WINDOW_S", 6.0)  # "24h", shortened for the test (room for a loaded CI host)
    batch_gateway.app.batches.admit, let_through = gate(after=2)
    client = client_of(batch_gateway)
    uploaded = await client.files.create(file=("in.jsonl", jsonl([chat_line(f"e{i}") for i in range(5)])),
                                         purpose="batch")
    batch = await client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    assert batch.expires_at - batch.created_at == 6
    batch = await wait_status(client, batch.id, ("expired",), timeout=30)
    assert batch.expired_at and batch.request_counts.completed == 2 and batch.request_counts.total == 5
    assert sorted(line["custom_id"] for line in await lines_of(client, batch.output_file_id)) == ["e0", "e1"]
    assert let_through["n"] == 2  # nothing was admitted after the window


async def _completed(client, batch_id: str, count: int) -> bool:
    return (await client.batches.retrieve(batch_id)).request_counts.completed >= count


async def _start(addresses: list[str], config: GatewayConfig) -> GatewayServer:
    server = GatewayServer(config, RouterConfig(), StaticRegistry.from_spec(addresses), ready_timeout_s=20,
                           shutdown_grace_s=2)
    await server.start()
    return server


async def _hold_after(server: GatewayServer, lines: int, total: int) -> str:
    """A batch of `total` lines on `server`, of which `lines` finished and the rest held; its id."""
    server.app.batches.admit, _ = gate(after=lines)
    client = client_of(server)
    uploaded = await client.files.create(file=("in.jsonl", jsonl([chat_line(f"k{i}") for i in range(total)])),
                                         purpose="batch")
    batch = await client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    await wait_until(lambda: _completed(client, batch.id, lines), timeout=20, message=f"{lines} lines done")
    return batch.id


async def _finish_elsewhere(config: GatewayConfig, addresses: list[str], batch_id: str, total: int) -> float:
    """Lines a new gateway on the same state runs to finish the batch; checks each custom_id is there once."""
    second = await _start(addresses, config)
    try:
        client = client_of(second)
        done = await wait_status(client, batch_id, ("completed",))
        output = await lines_of(client, done.output_file_id)
        assert sorted(line["custom_id"] for line in output) == sorted(f"k{i}" for i in range(total))
        return second.app.batches.metrics.done._value.get()
    finally:
        await second.stop()


async def test_restart_resumes_without_rerunning_finished_lines(mock_fleet, tmp_path):
    addresses = [w.address for w in mock_fleet["a"]]
    config = GatewayConfig(port=0, batch_dir=str(tmp_path / "batch"))
    first = await _start(addresses, config)
    try:
        batch_id = await _hold_after(first, 3, total=8)
    finally:
        await first.stop()
    assert first.app.batches.metrics.done._value.get() == 3
    assert await _finish_elsewhere(config, addresses, batch_id, 8) == 5  # only the lines the first left


async def test_another_process_takes_over_when_the_runner_dies(mock_fleet, tmp_path, monkeypatch):
    addresses = [w.address for w in mock_fleet["a"]]
    config = GatewayConfig(port=0, batch_dir=str(tmp_path / "batch"), batch_lease_s=1.0)
    first = await _start(addresses, config)
    try:
        batch_id = await _hold_after(first, 2, total=5)
        # It dies without a word: its lease is not given back, only left to expire.
        monkeypatch.setattr(first.app.batches._store, "release", lambda *args: None)
    finally:
        await first.stop()
    assert await _finish_elsewhere(config, addresses, batch_id, 5) == 3


async def test_a_key_sees_only_its_own_files_and_batches(start_gateway, mock_fleet, keys_file, tmp_path):
    path, keys = keys_file
    server = await start_gateway([w.address for w in mock_fleet["a"]], api_key_file=str(path),
                                 batch_dir=str(tmp_path / "batch"))
    await wait_until(lambda: MODEL_A in server.router.models(), timeout=20, message="model A")
    owner, other = client_of(server, keys["polite"]), client_of(server, keys["ops"])
    uploaded = await owner.files.create(file=("in.jsonl", jsonl([chat_line("p0")])), purpose="batch")
    batch = await owner.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    for call in (other.batches.retrieve(batch.id), other.files.retrieve(uploaded.id),
                 other.files.content(uploaded.id), other.batches.cancel(batch.id),
                 other.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            await call
    assert [b.id for b in (await other.batches.list()).data] == []
    assert [f.id for f in (await other.files.list()).data] == []
    assert (await owner.batches.retrieve(batch.id)).id == batch.id


async def test_oversized_file_is_413(start_gateway, mock_fleet, tmp_path):
    server = await start_gateway([w.address for w in mock_fleet["a"]], batch_dir=str(tmp_path / "batch"),
                                 batch_max_file_bytes=2048)
    with pytest.raises(openai.APIStatusError) as refused:
        await client_of(server).files.create(file=("big.jsonl", jsonl([chat_line(f"b{i}") for i in range(30)])),
                                             purpose="batch")
    assert refused.value.status_code == 413


@pytest.mark.parametrize("field, value", [("endpoint", "/v1/embeddings"), ("completion_window", "48h"),
                                          ("purpose", "fine-tune")])
async def test_bad_values_are_400_naming_the_field(batch_gateway, field, value):
    client = client_of(batch_gateway)
    with pytest.raises(openai.BadRequestError) as refused:
        if field == "purpose":
            await client.files.create(file=("in.jsonl", jsonl([chat_line("a")])), purpose=value)
        else:
            uploaded = await client.files.create(file=("in.jsonl", jsonl([chat_line("a")])), purpose="batch")
            args = {"input_file_id": uploaded.id, "endpoint": CHAT, "completion_window": "24h", field: value}
            await client.batches.create(**args)
    assert refused.value.body["param"] == field


# -- the store and the runner's parts, without a fleet -------------------------------------------


def test_one_runner_holds_a_batch_until_its_lease_ends(tmp_path):
    store = Store(tmp_path)
    store.add_file(FileRow("file-1", "", "batch", "in.jsonl", 1, 0))
    store.add_batch("batch_1", "", 0, {"endpoint": CHAT, "input_file_id": "file-1"})
    assert store.claim("runner-a", lease_s=60) == ["batch_1"]
    assert store.claim("runner-b", lease_s=60) == []             # held by a
    assert store.add_lines("batch_1", "runner-a", [LineRow(0, "x", 0, 1)])
    assert not store.finish_line("batch_1", "runner-b", 0, True, "{}")  # b holds no lease: writes nothing
    assert store.claim("runner-a", lease_s=-1) == ["batch_1"]    # a's lease, now already expired
    assert store.claim("runner-b", lease_s=60) == ["batch_1"]    # b takes over
    assert not store.finish_line("batch_1", "runner-a", 0, True, "{}")  # a lost it
    assert store.finish_line("batch_1", "runner-b", 0, True, "{}")
    assert not store.finish_line("batch_1", "runner-b", 0, True, "{}")  # once only
    assert store.batch("batch_1")["request_counts"] == {"total": 1, "completed": 1, "failed": 0}


async def test_batch_lines_run_as_the_batch_class_and_online_requests_as_interactive(batch_gateway, monkeypatch):
    """Every line reaches the router as service class "batch" (slack-only, withdrawable, a later
    vLLM priority: router/classes/service_class.py); an online request stays interactive."""
    seen = []
    real = batch_gateway.router.stream

    def recording(request, **kwargs):
        seen.append((request.hints.service_class, request.stream_interval_ms))
        return real(request, **kwargs)

    monkeypatch.setattr(batch_gateway.router, "stream", recording)
    client = client_of(batch_gateway)
    batch = await run_batch(client, [chat_line("p0"), chat_line("p1")])
    # A line is answered whole: its tokens come coalesced (--batch-stream-interval-ms), not per step.
    assert batch.request_counts.completed == 2 and seen == [("batch", 250), ("batch", 250)]
    assert (await client.chat.completions.create(**chat_line("x")["body"])).choices
    assert seen[-1] == ("interactive", 0)


async def test_lines_waiting_for_batch_capacity_show_why_on_the_batch_object(start_gateway, mock_worker_factory,
                                                                            monkeypatch):
    """A fleet with no batch slack: the line waits (never fails), the batch object says why in
    its vendor field (which OpenAI's client keeps), and once slack returns the line runs and the
    field clears."""
    monkeypatch.setattr(runner_module, "SHOW_WAIT_AFTER_S", 0.0)
    monkeypatch.setattr(runner_module, "WAIT_WATCH_EVERY_S", 0.05)
    worker = await mock_worker_factory.start(served_model_name=MODEL_A, max_num_seqs=4, mock_tokens_per_s=20,
                                             mock_ttft_ms=1)
    # Every slot is kept for interactive work; the starvation guard's one batch request is all batch may run.
    classes = ServiceClassConfig(interactive_reserve=0.9, batch_min_share=0.0, interactive_ttft_target_ms=None,
                                 interactive_itl_target_ms=None)
    server = await start_gateway([worker.address], router=RouterConfig(classes=classes))
    await wait_until(lambda: MODEL_A in server.router.models(), timeout=20, message="model A")
    client = client_of(server)
    # A flex (batch-class) online request holds the guard's slot for 100 s of tokens.
    flex = await client.chat.completions.create(**{**chat_line("flex")["body"], "max_tokens": 2000},
                                                service_tier="flex", stream=True)
    try:
        await anext(aiter(flex))
        batch = await run_batch(client, [chat_line("r0")], until=("in_progress",))

        async def waiting() -> bool:
            nonlocal batch
            batch = await client.batches.retrieve(batch.id)
            return bool((batch.model_extra or {}).get("vllm_fleet_waiting"))

        await wait_until(waiting, timeout=30, message="the batch to say it waits")
        shown = batch.model_extra["vllm_fleet_waiting"]
        assert shown["lines"] == 1 and shown["since"] > 0
        assert shown["reason"].startswith(f"no worker of model {MODEL_A!r} has batch slack: {worker.address} running ")
        assert "interactive_reserve 0.9 of max_num_seqs 4" in shown["reason"]
        assert batch.status == "in_progress" and batch.request_counts.completed == 0
    finally:
        await flex.close()  # its caller leaves: the guard's slot is free again
    batch = await wait_status(client, batch.id, ("completed",))
    assert batch.request_counts.completed == 1 and batch.model_extra["vllm_fleet_waiting"] is None


async def test_a_batch_far_beyond_the_workers_slots_waits_and_no_line_fails_or_retries(start_gateway,
                                                                                       mock_worker_factory, tmp_path):
    """Overload (issue #50): 24 lines on one worker of two engine slots, with stall limits far below
    the waits. Lines wait for slack (or in the engine's queue); a busy worker is not a broken one,
    so every line is answered at its first attempt."""
    worker = await mock_worker_factory.start(served_model_name=MODEL_A, max_num_seqs=2, mock_tokens_per_s=50,
                                             mock_ttft_ms=1)
    router = RouterConfig(stall_timeout_s=0.5, first_chunk_timeout_s=0.5, load_poll_interval_s=0.1)
    server = await start_gateway([worker.address], router=router, batch_dir=str(tmp_path / "batch"))
    await wait_until(lambda: MODEL_A in server.router.models(), timeout=20, message="model A")
    client = client_of(server)
    batch = await run_batch(client, [chat_line(f"r{i}", f"question {i}", max_tokens=10) for i in range(24)],
                            until=("completed", "failed"))
    assert batch.status == "completed" and batch.request_counts.completed == 24 and batch.request_counts.failed == 0
    assert all(line["response"]["body"]["usage"]["completion_tokens"] == 10
               for line in await lines_of(client, batch.output_file_id))
    metrics = (await http_call(server, "GET", "/metrics")).decode()
    assert "vllm_fleet_router_retries_total{" not in metrics, "a waiting line was taken for a stalled one"
