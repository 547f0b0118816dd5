"""How targets turn what a server sends into token counts, and what they send."""

from __future__ import annotations

import pytest

from vllm_fleet.bench.config import BenchConfig
from vllm_fleet.bench.record import RequestRecord
from vllm_fleet.bench.targets import make_target
from vllm_fleet.bench.targets.http import HttpTarget, has_output, settle_token_counts
from vllm_fleet.bench.targets.worker import fit_token_ids, generate_request
from vllm_fleet.bench.workloads import BenchItem
from vllm_fleet.errors import ConfigError


def record_with_chunks(n: int) -> RequestRecord:
    return RequestRecord("r", chunk_times=[0.1 * i for i in range(1, n + 1)], chunk_tokens=[1] * n)


def test_usage_wins_over_chunk_count_and_is_spread_over_coalesced_chunks():
    record = record_with_chunks(3)
    settle_token_counts(record, 8)
    assert record.output_tokens == 8
    assert record.chunk_tokens == [3, 3, 2]


def test_chunk_count_when_the_server_reports_no_usage():
    record = record_with_chunks(5)
    settle_token_counts(record, None)
    assert record.output_tokens == 5


@pytest.mark.parametrize(("event", "has"), [
    ({"choices": [{"text": "a"}]}, True),
    ({"choices": [{"delta": {"content": "a"}}]}, True),
    ({"choices": [{"delta": {"role": "assistant"}}]}, False),   # the role-only first chat chunk
    ({"choices": [], "usage": {"completion_tokens": 3}}, False),
])
def test_only_chunks_with_text_count_as_output(event, has):
    assert has_output(event) is has


def test_http_body_carries_session_usage_request_and_ignore_eos():
    target = HttpTarget("http://127.0.0.1:1/v1/", BenchConfig(target="http://127.0.0.1:1", model="m"))
    path, body = target.body(BenchItem("i", "conversation", 7, messages=[{"role": "user", "content": "hi"}],
                                       session_id="s-1"))
    assert target.base_url == "http://127.0.0.1:1"
    assert path == "/v1/chat/completions"
    assert body["user"] == "s-1" and body["max_tokens"] == 7 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_token_ids_are_sent_only_when_the_vocabulary_is_known():
    item = BenchItem("i", "random", 4, prompt="a b c", token_ids=[5000, 20000, 40000])
    config = BenchConfig(target="grpc://127.0.0.1:1")
    assert generate_request(item, config, "r").inputs[0].text == "a b c"
    ids = generate_request(item, config, "r", vocab_size=32000).inputs[0].token_ids
    assert len(ids) == 3 and all(1000 <= t < 32000 for t in ids)
    assert fit_token_ids([5, 6], 100) == [5, 6]


def test_http_sends_token_id_prompts_only_when_asked():
    item = BenchItem("i", "random", 4, prompt="a b c", token_ids=[5000, 20000, 40000])
    text = HttpTarget("http://h:1", BenchConfig(target="http://h:1", model="m"))
    assert text.body(item)[1]["prompt"] == "a b c"
    tokens = HttpTarget("http://h:1", BenchConfig(target="http://h:1", model="m", prompt_format="tokens"))
    path, body = tokens.body(item)
    assert path == "/v1/completions" and body["prompt"] == [5000, 20000, 40000]


@pytest.mark.parametrize("spec", ["ftp://x", "127.0.0.1:8000", "grpc://"])
def test_unknown_targets_say_what_to_write(spec):
    with pytest.raises(ConfigError, match="grpc://host:port"):
        make_target(BenchConfig(target=spec))
