"""ignore_eos asks for exactly max_tokens tokens: an answer with fewer is counted as short,
never scored as a success (a server that dropped the field once looked faster than it was)."""

from __future__ import annotations

import json

import pytest
from aiohttp import web

from vllm_fleet.bench import BenchConfig, run_bench
from vllm_fleet.bench.metrics import Slo, summarize
from vllm_fleet.bench.record import RequestRecord
from vllm_fleet.bench.report import markdown

EARLY_STOP = 3  # tokens a server answers with when it stops at EOS


def answer(request_id: str, tokens: int, *, asked: int = 8, ignore_eos: bool = True, error: str | None = None,
           start: float = 0.0) -> RequestRecord:
    times = [start + 0.1 + 0.01 * i for i in range(tokens)]
    return RequestRecord(request_id, start=start, end=times[-1] if times else start + 0.1, chunk_times=times,
                         chunk_tokens=[1] * tokens, output_tokens=tokens, expected_output_tokens=asked,
                         ignore_eos=ignore_eos, error=error)


def test_a_short_answer_is_counted_and_left_out_of_every_figure():
    records = [answer(f"full{i}", 8, start=i) for i in range(3)]
    records += [answer("short", 3, start=1.0), answer("broken", 0, error="http_500")]
    summary = summarize(records, Slo.parse("ttft=10s"))

    assert summary["requests"] == {"sent": 5, "completed": 3, "failed": 1, "short_answers": 1}
    assert summary["total_output_tokens"] == 24, "the short answer's tokens are not throughput"
    assert summary["e2e_ms"]["count"] == 3
    assert summary["goodput"]["fraction"] == pytest.approx(3 / 5), "a short answer is not good, however fast"


def test_fewer_tokens_without_ignore_eos_is_a_normal_answer():
    record = answer("eos", 3, ignore_eos=False)
    assert record.ok and not record.short_answer
    assert summarize([record])["requests"]["short_answers"] == 0


def test_the_record_says_it_was_short_in_the_json():
    data = answer("short", 3).to_dict()
    assert data["short_answer"] is True and data["ignore_eos"] is True
    assert RequestRecord.from_dict(data).short_answer


@pytest.fixture
async def early_stopping_server():
    """An OpenAI-style SSE server that stops at EOS after 3 tokens unless the body has
    `ignore_eos: true` (`honour` off: it drops the field, as our gateway once did)."""
    state = {"honour": True, "bodies": []}

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state["bodies"].append(body)
        tokens = body["max_tokens"] if state["honour"] and body.get("ignore_eos") else EARLY_STOP
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(tokens):
            await response.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": " x"}]}).encode() + b"\n\n")
        usage = {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": 5 + tokens}
        await response.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", state
    await runner.cleanup()


def config_for(url: str, **kw) -> BenchConfig:
    return BenchConfig(target=url, model="m", workload="random", input_len=4, output_len=8, rate="inf",
                       num_requests=4, warmup_requests=0, progress=False, **kw)


async def test_a_server_that_drops_ignore_eos_gets_short_answers_not_successes(early_stopping_server):
    url, state = early_stopping_server
    state["honour"] = False
    report = await run_bench(config_for(url))
    [run] = report["runs"]

    assert all(body["ignore_eos"] is True for body in state["bodies"]), "the bench asked for ignore_eos"
    assert run["summary"]["requests"] == {"sent": 4, "completed": 0, "failed": 0, "short_answers": 4}
    assert run["summary"]["output_throughput"] == 0.0
    assert all(r["short_answer"] and r["output_tokens"] == EARLY_STOP for r in run["requests"])
    assert "| inf | 0/4 | 4 |" in markdown(report)


async def test_a_server_that_honours_ignore_eos_completes_every_request(early_stopping_server):
    url, _ = early_stopping_server
    [run] = (await run_bench(config_for(url)))["runs"]
    assert run["summary"]["requests"] == {"sent": 4, "completed": 4, "failed": 0, "short_answers": 0}


async def test_without_ignore_eos_an_early_stop_is_a_complete_answer(early_stopping_server):
    url, state = early_stopping_server
    [run] = (await run_bench(config_for(url, ignore_eos=False)))["runs"]
    assert "ignore_eos" not in state["bodies"][0]
    assert run["summary"]["requests"] == {"sent": 4, "completed": 4, "failed": 0, "short_answers": 0}
