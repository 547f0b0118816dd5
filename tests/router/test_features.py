"""Request features: the estimates routing and admission act on, computed without a tokenizer."""

from __future__ import annotations

from vllm_fleet.protocol.sampling import build_request
from vllm_fleet.protocol import ChatMessage, GenerateInput, GenerateRequest, SamplingParams
from vllm_fleet.router.features import LONG, SHORT, features_of


def feats(request: GenerateRequest, **overrides):
    options = dict(model="m", prefix_chars=16, default_max_tokens=100, long_prompt_tokens=1000, long_max_tokens=500)
    return features_of(request, **{**options, **overrides})


def test_short_request_counts_prompt_and_all_samples_of_all_inputs():
    request = build_request("r", [GenerateInput(token_ids=[1] * 40), GenerateInput(token_ids=[2] * 10)],
                              SamplingParams(max_tokens=20, n=3))
    f = feats(request)
    assert f.prompt_tokens == 50
    assert f.max_tokens == 20 * 3 * 2
    assert f.cost_tokens == 50 + 120
    assert f.workload_class == SHORT and f.pool is None


def test_long_by_prompt_or_by_max_tokens_and_class_pools_restrict_the_pool():
    long_prompt = build_request("r", [GenerateInput(text="word " * 1000)], SamplingParams(max_tokens=10))
    long_answer = build_request("r", [GenerateInput(text="hi")], SamplingParams(max_tokens=500))
    assert feats(long_prompt).workload_class == LONG
    assert feats(long_answer).workload_class == LONG
    assert feats(long_answer, class_pools=True).pool == LONG


def test_missing_max_tokens_uses_the_configured_default():
    f = feats(build_request("r", [GenerateInput(text="hi")]))
    assert f.max_tokens == 100


def test_prefix_key_covers_the_start_of_the_prompt_as_the_worker_sees_it():
    chat = build_request("r", [GenerateInput(messages=[ChatMessage("system", "You are terse."),
                                                         ChatMessage("user", "What is 2+2?")])])
    other_question = build_request("r", [GenerateInput(messages=[ChatMessage("system", "You are terse."),
                                                                   ChatMessage("user", "Capital of Peru?")])])
    assert feats(chat).prefix_key == feats(other_question).prefix_key  # same system prompt, same 16 chars
    assert feats(chat, prefix_chars=200).prefix_key != feats(other_question, prefix_chars=200).prefix_key


def test_session_id_is_the_affinity_key():
    request = build_request("r", [GenerateInput(text="hi")], session_id="user-7")
    assert feats(request).session_key == "user-7"


def test_prefix_key_of_a_long_chat_is_its_joined_text_cut():
    from vllm_fleet.protocol.types import GenerateInput
    from vllm_fleet.router.features import prefix_key

    messages = [{"role": "system", "content": "s" * 100}, {"role": "user", "content": "u" * 200},
                {"role": "assistant", "content": [{"type": "text", "text": "a" * 50}]}, {"role": "user", "content": "q"}]
    whole = "".join(f"<{m['role']}>" + (m["content"] if isinstance(m["content"], str) else m["content"][0]["text"])
                    for m in messages)
    for length in (1, 8, 107, 108, 300, 315, 316, 1000):
        assert prefix_key(GenerateInput(messages=messages), length) == whole[:length]
