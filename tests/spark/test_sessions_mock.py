"""Conversations through Spark on mock workers: turn order, history, one worker per session.

The mock engine's answer depends only on the prompt it is given, so turn k's output equals what
the client gets for exactly (user 1, answer 1, ..., user k): proof the history was sent whole.
"""

from __future__ import annotations

import asyncio
import random

from spark_support import chat, client_answers
from vllm_fleet.router.policies import ring_order
from vllm_fleet.spark import collect_sessions, generate

PARAMS = {"max_tokens": 6}


def conversations_df(spark, sessions: int, turns: int):
    rows = [(f"s{s}", t, f"session {s} turn {t} asks about the city")
            for s in range(sessions) for t in range(1, turns + 1)]
    random.Random(7).shuffle(rows)  # turns arrive out of order, sessions interleaved
    return spark.createDataFrame(rows, "chat string, turn int, text string").repartition(3)


async def test_turns_run_in_order_with_their_history(spark, mock_pair):
    out = generate(conversations_df(spark, sessions=12, turns=3), prompt_col="text", session_col="chat",
                   turn_col="turn", params=PARAMS, workers=[w.address for w in mock_pair])
    rows = await asyncio.to_thread(out.collect)

    assert len(rows) == 36 and [r for r in rows if r.error] == []
    by_session: dict[str, list] = {}
    for row in rows:
        by_session.setdefault(row.chat, []).append(row)
    for turns in by_session.values():
        turns.sort(key=lambda r: r.turn)
        tokens = [r.prompt_tokens for r in turns]
        assert tokens == sorted(tokens) and len(set(tokens)) == 3, "each turn's prompt holds the earlier ones"

    first = sorted(by_session["s0"], key=lambda r: r.turn)
    history = [chat(("user", first[0].text)),
               chat(("user", first[0].text), ("assistant", first[0].output), ("user", first[1].text)),
               chat(("user", first[0].text), ("assistant", first[0].output), ("user", first[1].text),
                    ("assistant", first[1].output), ("user", first[2].text))]
    assert [r.output for r in first] == await client_answers(first[0].worker, history, PARAMS)


async def test_collect_sessions_gives_one_row_per_session_in_turn_order(spark, mock_pair):
    out = generate(conversations_df(spark, sessions=5, turns=4), prompt_col="text", session_col="chat",
                   turn_col="turn", params=PARAMS, workers=[w.address for w in mock_pair])
    sessions = await asyncio.to_thread(collect_sessions(out).collect)

    assert sorted(s.chat for s in sessions) == [f"s{i}" for i in range(5)]
    for session in sessions:
        assert session.num_turns == 4
        assert [t.turn for t in session.turns] == [1, 2, 3, 4]
        assert all(t.output and t.error is None for t in session.turns)


async def test_a_bad_turn_ends_its_session_and_no_other(spark, mock_pair):
    rows = [("a", 1, "hello"), ("a", 2, None), ("a", 3, "still there?"), ("b", 1, "hi"), ("b", 2, "and then?")]
    df = spark.createDataFrame(rows, "chat string, turn int, text string")
    out = generate(df, prompt_col="text", session_col="chat", turn_col="turn", params=PARAMS,
                   workers=[w.address for w in mock_pair])
    by_key = {(r.chat, r.turn): r for r in await asyncio.to_thread(out.collect)}

    assert len(by_key) == 5
    assert by_key[("a", 1)].output and "null" in by_key[("a", 2)].error
    assert "turn 2 of this session" in by_key[("a", 3)].error
    assert by_key[("b", 1)].output and by_key[("b", 2)].output


async def test_a_session_stays_on_one_worker(spark, mock_pair):
    """Every turn of a session on the worker the session key hashes to: the same in every
    executor process, whatever each has in flight (see test_session_routing.py)."""
    addresses = [w.address for w in mock_pair]
    out = generate(conversations_df(spark, sessions=12, turns=3), prompt_col="text", session_col="chat",
                   turn_col="turn", params=PARAMS, workers=addresses)
    rows = await asyncio.to_thread(out.collect)

    assert len(rows) == 36 and [r.error for r in rows if r.error] == []
    home = {r.chat: ring_order(r.chat, addresses)[0] for r in rows}
    astray = sorted((r.chat, r.turn, r.worker, r.attempts) for r in rows if r.worker != home[r.chat])
    assert astray == [], "turns not on their session's worker (session, turn, worker, attempts)"
