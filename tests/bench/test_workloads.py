"""Workloads: the shapes users pick them for (lengths, the production mix, sessions, prefixes)."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest

from vllm_fleet.bench.workloads import JsonlWorkload, ProductionMix, RandomWorkload, SharedPrefixWorkload
from vllm_fleet.errors import ConfigError


def take(workload, n):
    return list(itertools.islice(workload.items(), n))


def test_random_prompts_have_the_set_lengths():
    items = take(RandomWorkload(64, 32, seed=1), 20)
    assert all(len(i.token_ids) == 64 and len(i.prompt.split()) == 64 and i.max_tokens == 32 for i in items)
    assert len({tuple(i.token_ids) for i in items}) == 20


def test_same_seed_same_items():
    assert take(ProductionMix(seed=9), 50) == take(ProductionMix(seed=9), 50)
    assert take(ProductionMix(seed=9), 50) != take(ProductionMix(seed=10), 50)


def test_production_mix_shares():
    kinds = Counter(item.kind for item in take(ProductionMix(seed=2), 5000))
    assert kinds["question"] / 5000 == pytest.approx(0.6, abs=0.03)
    assert kinds["conversation"] / 5000 == pytest.approx(0.3, abs=0.03)
    assert kinds["summary"] / 5000 == pytest.approx(0.1, abs=0.02)


def test_conversation_turns_share_a_session_and_carry_the_history():
    turns = [i for i in take(ProductionMix(seed=3), 400) if i.kind == "conversation"]
    by_session: dict[str, list] = {}
    for turn in turns:
        assert turn.session_id
        by_session.setdefault(turn.session_id, []).append(turn)
    multi = [t for t in by_session.values() if len(t) >= 3]
    assert multi, "expected conversations of several turns"
    for conversation in multi:
        for before, after in zip(conversation, conversation[1:]):
            # each turn starts with everything the previous one sent, plus an answer and a new question
            assert after.messages[: len(before.messages)] == before.messages
            assert len(after.messages) == len(before.messages) + 2
            assert after.messages[len(before.messages)]["role"] == "assistant"


def test_summaries_are_long_and_questions_short():
    items = take(ProductionMix(seed=4), 300)
    summaries = [i.approx_prompt_tokens for i in items if i.kind == "summary"]
    questions = [i.approx_prompt_tokens for i in items if i.kind == "question"]
    assert min(summaries) >= 600 and max(questions) <= 128


def test_shared_prefix_prompts_start_with_one_of_the_group_prefixes():
    items = take(SharedPrefixWorkload(3, 50, 10, 16, seed=1), 60)
    prefixes = {i.prompt.split("\nQuestion:")[0] for i in items}
    assert len(prefixes) == 3
    assert all(len(p.split()) == 52 for p in prefixes)  # "Context g:" + 50 words
    assert len({i.prompt for i in items}) == 60


def test_jsonl_prompts_cycle_in_order(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": "hello there", "max_tokens": 5},
            {"messages": [{"role": "user", "content": "hi"}], "session_id": "s1"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    items = take(JsonlWorkload(path, 64), 4)
    assert [i.prompt for i in items] == ["hello there", None, "hello there", None]
    assert items[0].max_tokens == 5 and items[1].max_tokens == 64
    assert items[1].messages == rows[1]["messages"] and items[1].session_id == "s1"


@pytest.mark.parametrize(("content", "message"), [
    ("{not json\n", r"prompts.jsonl:1: not JSON"),
    ('{"text": "x"}\n', r"prompts.jsonl:1: each line needs a string 'prompt' or a list 'messages'"),
    ("\n", r"no prompts"),
])
def test_jsonl_errors_name_the_line_and_the_fix(tmp_path, content, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        JsonlWorkload(path, 16)


def test_jsonl_missing_file():
    with pytest.raises(ConfigError, match="no such file"):
        JsonlWorkload("/nonexistent/prompts.jsonl", 16)
