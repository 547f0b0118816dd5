"""The answer ledger: a re-run answers from it without asking a worker, a stream's conversation
keeps its history across micro-batches through it, and compaction keeps it bounded."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict

from spark_support import chat, client_answers
from vllm_fleet.spark import compact_ledger, foreach_batch_writer, generate
from vllm_fleet.spark.ledger import Entry, LedgerIndex

PARAMS = {"max_tokens": 6}


async def test_a_rerun_is_answered_from_the_ledger(spark, mock_pair, tmp_path):
    rows = [(i, f"ledger question {i} about lakes") for i in range(40)]
    df = spark.createDataFrame(rows, "id long, prompt string").repartition(2)
    workers = [w.address for w in mock_pair]

    def run():
        out = generate(df, prompt_col="prompt", id_col="id", params=PARAMS, workers=workers,
                       ledger_path=str(tmp_path / "ledger"))
        return {r.id: r for r in out.collect()}

    first = await asyncio.to_thread(run)
    again = await asyncio.to_thread(run)

    assert all(r.attempts >= 1 and r.output for r in first.values()), "generated the first time"
    assert all(r.attempts == 0 for r in again.values()), "replayed: no worker tried"
    assert {i: r.output for i, r in again.items()} == {i: r.output for i, r in first.items()}
    lines = sum(p.read_text().count("\n") for p in (tmp_path / "ledger").glob("*.jsonl"))
    assert lines == 40, "each answer written once, none the second time"


async def test_a_sessions_later_turn_in_a_later_micro_batch_gets_the_earlier_turns(spark, mock_pair, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    for turn in (1, 2):  # one file per micro-batch: turn 2 of every session arrives after turn 1 was answered
        lines = [json.dumps({"chat": f"s{s}", "turn": turn, "text": f"session {s} turn {turn} asks about the sea"})
                 for s in range(4)]
        (tmp_path / f".t{turn}").write_text("\n".join(lines) + "\n")
        (tmp_path / f".t{turn}").rename(source / f"turn-{turn}.json")
    workers = [w.address for w in mock_pair]

    def run():
        stream = spark.readStream.schema("chat string, turn int, text string").option("maxFilesPerTrigger", 1) \
            .json(str(source))
        answered = generate(stream, prompt_col="text", session_col="chat", turn_col="turn", params=PARAMS,
                            workers=workers, ledger_path=str(tmp_path / "ledger"))
        query = (answered.writeStream.option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).foreachBatch(foreach_batch_writer(str(tmp_path / "out"))).start())
        query.awaitTermination()
        return spark.read.parquet(str(tmp_path / "out")).collect()

    rows = {(r.chat, r.turn): r for r in await asyncio.to_thread(run)}

    assert len(rows) == 8 and all(r.output and r.error is None for r in rows.values())
    assert {r.batch_id for r in rows.values()} == {0, 1}, "the turns came in two micro-batches"
    first, second = rows[("s0", 1)], rows[("s0", 2)]
    history = chat(("user", first.text), ("assistant", first.output), ("user", second.text))
    assert [second.output] == await client_answers(second.worker, [history], PARAMS), "turn 2 sent with turn 1"
    assert all(rows[(s, 2)].prompt_tokens > rows[(s, 1)].prompt_tokens for s in ("s0", "s1", "s2", "s3"))


def test_compaction_keeps_one_entry_per_key_and_drops_old_ones(tmp_path):
    now = time.time()
    entries = [Entry(key="a", output="old a", at=now - 10), Entry(key="a", output="new a", at=now - 5),
               Entry(key="b", output="b", at=now - 4), Entry(key="stale", output="x", at=now - 10_000)]
    for n, entry in enumerate(entries):
        (tmp_path / f"task-{n}.jsonl").write_text(json.dumps(asdict(entry)) + "\n")
    (tmp_path / "task-9.jsonl").write_text('{"key": "cut", "output": "half a li')  # a killed writer's last line

    assert compact_ledger(str(tmp_path), max_age_s=3600, idle_s=0) == (2, 1)
    assert [p.name.startswith("compact-") for p in tmp_path.glob("*.jsonl")] == [True]
    index = LedgerIndex(str(tmp_path))
    index.refresh()
    assert index.get("a").output == "new a" and index.get("b").output == "b"
    assert index.get("stale") is None and index.get("cut") is None


def test_a_reader_skips_a_half_written_line_until_it_is_whole(tmp_path):
    path = tmp_path / "task.jsonl"
    path.write_text(json.dumps(asdict(Entry(key="a", output="A"))) + "\n" + '{"key": "b", "out')
    index = LedgerIndex(str(tmp_path))
    index.refresh()
    assert index.get("a").output == "A" and index.get("b") is None
    with open(path, "a") as f:  # the writer finishes its line: the next refresh reads it
        f.write('put": "B"}\n')
    index.refresh()
    assert index.get("b").output == "B"
