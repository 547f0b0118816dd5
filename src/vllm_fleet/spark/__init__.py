"""Batch and streaming inference over Spark DataFrames, through the fleet's routing core.

    from vllm_fleet.spark import generate, collect_sessions

    out = generate(df, prompt_col="prompt", params={"max_tokens": 64, "temperature": 0},
                   workers=["10.0.0.5:50051", "10.0.0.6:50051"])       # or registry="zk://zk:2181/fleet"
    out.write.parquet("answers.parquet")

`out` has every input column plus `output`, `finish_reason`, `prompt_tokens`,
`completion_tokens`, `error`, `attempts`, `worker`: exactly one output row per input row.

Typed answers: `generate(df, ..., output_schema="name STRING, age INT")` (a DDL string or a
StructType) decodes every answer under that schema's JSON schema and adds one typed column per
field (`name`, `age`) after those above; a row whose text still does not read as that JSON has
null fields and `error` saying why.
A row whose request failed after retries and failover has `error` set (and no output); the
job itself fails only for configuration errors, which `generate()` raises at once
(ConfigError) after checking columns and reaching the workers from the driver.

Embeddings: `embed(df, input_col="text", workers=[...])` adds `embedding` (array<float>) from
workers with a pooling model (embed.py), with the same one-row-in-one-row-out and row errors.

Conversations: `generate(df, prompt_col="text", session_col="chat_id", turn_col="turn", ...)`
answers each session's turns in order, each with the earlier turns and answers as history, all
on one worker (session affinity); `collect_sessions(out)` gives one row per session.

Streaming: `generate()` also accepts a streaming DataFrame; write it with a file sink or with
`foreach_batch_writer(path)` (see docs/spark.md for what a checkpointed restart guarantees).

Modules: config (plain settings that travel to executors), rows (row ↔ request, ids),
output_schema (DDL/StructType → JSON schema), typed_rows (answer JSON → typed columns),
batcher (micro-batch window, in-flight bound), answerer (rows → router → results),
partition and sessions (one partition's work), ledger (answers by row, for replays), executor (per-process Router, the
mapInArrow function), driver (checks and plan), streaming (idempotent micro-batch sink).
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from vllm_fleet.protocol.sampling import SamplingParams
from vllm_fleet.spark.config import SparkGenerateConfig, build_config
from vllm_fleet.spark.driver import check_fleet, collect_sessions, plan
from vllm_fleet.spark.embed import embed
from vllm_fleet.spark.ledger import compact_ledger
from vllm_fleet.spark.streaming import foreach_batch_writer

__all__ = ["SparkGenerateConfig", "check_fleet", "collect_sessions", "compact_ledger", "embed",
           "foreach_batch_writer", "generate"]


def generate(df: DataFrame, *, prompt_col: str | None = None, messages_col: str | None = None,
             session_col: str | None = None, turn_col: str | None = None,
             params: dict[str, Any] | SamplingParams | None = None, model: str | None = None,
             workers: list[str] | str | None = None, registry: str | None = None,
             batch_size: int = 32, batch_wait_ms: float = 20.0, max_in_flight: int = 64,
             output_col: str = "output", output_schema: str | StructType | None = None,
             id_col: str | None = None, send_as: str = "per_row",
             router: dict[str, Any] | None = None, ledger_path: str | None = None, **options: Any) -> DataFrame:
    """Answer every row of `df` (batch or streaming) on the fleet; see the module docstring.

    prompt_col / messages_col: exactly one; the prompt text, or chat messages
        (array<struct<role,content>>, array<map<string,string>>, or a JSON string).
    params: SamplingParams or a dict of its fields (n must be 1). model: default the fleet's only model.
    workers / registry: where the fleet is: ["host:port", ...] or "zk://host:port/cluster".
    batch_size, batch_wait_ms: a micro-batch is sent when full or when its first row waited this long.
    max_in_flight: most rows out at once per executor Python process (so per executor: × its cores).
    output_schema: typed answers, e.g. "name STRING, age INT" or a StructType: one column per field.
    id_col: a column with a stable row key for request ids (default: the row's task and position).
    send_as: "per_row" (default, measured faster: docs/spark.md) or "one_request" per micro-batch.
    router: RouterConfig fields, e.g. {"max_attempts": 3}; sessions default to session affinity.
    ledger_path: a directory every executor mounts; rows answered there before (a crashed stream's
        replayed micro-batch, a retried task) are answered from it, with attempts = 0. Needs id_col
        (or sessions); it also carries a conversation's history across micro-batches.
    options: any other SparkGenerateConfig field (row_attempts, request_timeout_s, ...).
    """
    config = build_config(
        prompt_col=prompt_col, messages_col=messages_col, session_col=session_col, turn_col=turn_col,
        params=params, model=model, workers=workers, registry=registry, batch_size=batch_size,
        batch_wait_ms=batch_wait_ms, max_in_flight=max_in_flight, output_col=output_col,
        output_schema=output_schema, id_col=id_col,
        send_as=send_as, router=router, ledger_path=ledger_path, **options,
    )
    return plan(df, config)
