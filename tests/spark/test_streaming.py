"""generate() on a Structured Streaming DataFrame over a folder: each row answered exactly once
across a restart from the checkpoint, with the file sink and with foreach_batch_writer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from vllm_fleet.spark import foreach_batch_writer, generate

SCHEMA = "id long, prompt string"


def drop_file(folder: Path, name: str, ids: range) -> None:
    # Written aside then renamed: the file source must never see half a file.
    tmp = folder.parent / f".{name}"
    tmp.write_text("".join(json.dumps({"id": i, "prompt": f"streamed question {i}"}) + "\n" for i in ids))
    tmp.rename(folder / name)


def run_once(spark, source: Path, sink: Path, checkpoint: Path, workers: list[str], sink_kind: str) -> None:
    """One run of the query until the source is drained (a 'restart' each time it is called)."""
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    answered = generate(stream, prompt_col="prompt", params={"max_tokens": 4}, workers=workers)
    writer = answered.writeStream.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    if sink_kind == "file":
        query = writer.format("parquet").option("path", str(sink)).start()
    else:
        query = writer.foreachBatch(foreach_batch_writer(str(sink))).start()
    query.awaitTermination()
    assert query.exception() is None


@pytest.mark.parametrize("sink_kind", ["file", "foreach_batch"])
async def test_new_files_are_answered_exactly_once_across_a_restart(spark, mock_pair, tmp_path, sink_kind):
    source, sink, checkpoint = tmp_path / "in", tmp_path / "out", tmp_path / "checkpoint"
    source.mkdir()
    workers = [w.address for w in mock_pair]
    drop_file(source, "part-1.json", range(0, 40))
    drop_file(source, "part-2.json", range(40, 80))
    await asyncio.to_thread(run_once, spark, source, sink, checkpoint, workers, sink_kind)

    drop_file(source, "part-3.json", range(80, 120))  # arrives while the query is stopped
    await asyncio.to_thread(run_once, spark, source, sink, checkpoint, workers, sink_kind)

    rows = spark.read.parquet(str(sink)).select("id", "output", "error").collect()
    assert sorted(r.id for r in rows) == list(range(120)), "every row once: none lost, none answered twice"
    assert all(r.output and r.error is None for r in rows)
