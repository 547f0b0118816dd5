"""generate(..., output_schema=...) in local Spark: typed columns, row errors, refusals.

The plain mock engine answers with words, never JSON: through it every row must come back with
its text, null fields and the row error. A mock with a script answers with the schema's JSON
(it follows no grammar; the real engine's constrained answers are checked in
test_generate_vllm.py). Every Spark type's column is checked with a stand-in for the answering
(the row's own JSON as its answer) around the real column building, in a real mapInArrow.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import json

import pytest
from pyspark.sql import types as T

from vllm_fleet.errors import ConfigError
from vllm_fleet.spark import generate
from vllm_fleet.spark.config import build_config
from vllm_fleet.spark.driver import result_schema, with_output_schema

PARAMS = {"max_tokens": 8, "temperature": 0}


async def test_answers_that_are_not_the_schemas_json_get_a_row_error_and_the_job_completes(spark, mock_pair):
    df = spark.createDataFrame([(i, f"describe person {i}") for i in range(20)], "id long, prompt string")
    out = generate(df, prompt_col="prompt", params=PARAMS, workers=[w.address for w in mock_pair],
                   output_schema="name STRING, age INT")
    rows = await asyncio.to_thread(out.collect)

    assert out.schema["name"].dataType == T.StringType() and out.schema["age"].dataType == T.IntegerType()
    assert out.columns[-2:] == ["name", "age"], "typed fields come after the result columns"
    assert sorted(r.id for r in rows) == list(range(20))
    assert all(r.output and r.finish_reason == "length" for r in rows), "the text stays for inspection"
    assert all(r.name is None and r.age is None for r in rows)
    assert all(r.error.startswith("output is not valid JSON for the schema: not JSON") for r in rows)
    assert all("cut off at max_tokens" in r.error for r in rows)


@pytest.fixture(scope="module")
async def scripted_json_worker(module_mock_workers, tmp_path_factory):
    """A mock worker that answers every prompt with one JSON object, tokenized with the default
    model's tokenizer (the mock cannot follow a grammar; its script is the schema's JSON)."""
    from vllm_fleet.models import resolve_model

    script = tmp_path_factory.mktemp("script") / "answer.json"
    script.write_text('{"name": "Ada Lovelace", "age": 36}', encoding="utf-8")
    return await module_mock_workers.start(mock_tokenizer=resolve_model(None, None).path, mock_script=str(script),
                                           mock_tokens_per_s=2000, mock_ttft_ms=2, timeout=120)


async def test_answers_in_the_schemas_json_come_back_as_typed_columns(spark, scripted_json_worker):
    df = spark.createDataFrame([(i, f"who is person {i}?") for i in range(6)], "id long, prompt string")
    out = generate(df, prompt_col="prompt", params={"max_tokens": 64}, workers=[scripted_json_worker.address],
                   output_schema="name STRING, age INT")
    rows = await asyncio.to_thread(out.collect)

    assert sorted(r.id for r in rows) == list(range(6))
    assert [r.error for r in rows if r.error] == []
    assert {(r.name, r.age) for r in rows} == {("Ada Lovelace", 36)}


async def test_an_answer_cut_off_by_max_tokens_is_a_row_error_with_its_text_kept(spark, scripted_json_worker):
    df = spark.createDataFrame([(0, "who?")], "id long, prompt string")
    out = generate(df, prompt_col="prompt", params={"max_tokens": 4}, workers=[scripted_json_worker.address],
                   output_schema="name STRING, age INT")
    [row] = await asyncio.to_thread(out.collect)

    assert row.finish_reason == "length" and row.output and '{"name": "Ada Lovelace", "age": 36}'.startswith(row.output)
    assert (row.name, row.age) == (None, None)
    assert row.error.startswith("output is not valid JSON for the schema: not JSON")
    assert row.error.endswith("(the answer was cut off at max_tokens; raise max_tokens)")


def test_typed_columns_carry_the_values_of_answers_that_read(spark):
    ddl = ("name STRING, age INT, price DECIMAL(6,2), day DATE, seen TIMESTAMP, tags ARRAY<STRING>, "
           "place STRUCT<city: STRING, zip: INT>, counts MAP<STRING, BIGINT>")
    config = with_output_schema(build_config(prompt_col="answer", workers=["127.0.0.1:1"], output_schema=ddl))
    good = {"name": "Ada", "age": 36, "price": 9.99, "day": "2026-12-01", "seen": "2026-12-01T10:30:00Z",
            "tags": ["a", "b"], "place": {"city": "Paris", "zip": 75001}, "counts": {"x": 2}}
    answers = [(0, json.dumps(good)), (1, '{"name": "Bob", "age": "old"}')]
    df = spark.createDataFrame(answers, "id long, answer string")
    settings = config.model_dump()

    def answer_with_the_row_itself(batches):  # stands in for the fleet: the answer is the prompt
        from vllm_fleet.spark.config import SparkGenerateConfig
        from vllm_fleet.spark.executor import ResultColumns
        from vllm_fleet.spark.rows import RowResult

        columns = ResultColumns(SparkGenerateConfig(**settings))
        for batch in batches:
            yield columns.add(batch, [RowResult(output=text, finish_reason="stop")
                                      for text in batch.column("answer").to_pylist()])

    out = df.mapInArrow(answer_with_the_row_itself, T.StructType([*df.schema.fields, *result_schema(config)]))
    by_id = {r.id: r for r in out.collect()}

    ada = by_id[0]
    assert ada.error is None
    assert (ada.name, ada.age, ada.price, ada.day) == ("Ada", 36, decimal.Decimal("9.99"), dt.date(2026, 12, 1))
    assert ada.seen.astimezone(dt.timezone.utc) == dt.datetime(2026, 12, 1, 10, 30, tzinfo=dt.timezone.utc)
    assert ada.tags == ["a", "b"] and (ada.place.city, ada.place.zip) == ("Paris", 75001) and ada.counts == {"x": 2}
    assert by_id[1].error == 'output is not valid JSON for the schema: $ has no price, day, seen, tags, place, counts'
    assert by_id[1].name is None and by_id[1].age is None


def test_a_struct_type_asks_for_its_json_schema_as_the_constraint():
    struct = T.StructType([T.StructField("name", T.StringType()), T.StructField("age", T.IntegerType())])
    config = with_output_schema(build_config(prompt_col="p", workers=["127.0.0.1:1"], output_schema=struct))
    params = config.sampling_params()
    assert json.loads(params.constraint.json_schema)["required"] == ["name", "age"]
    assert [f.name for f in result_schema(config)][-2:] == ["name", "age"]


@pytest.mark.parametrize(("ddl", "message"), [
    ("prompt STRING", "the DataFrame already has column(s) prompt"),
    ("error STRING, age INT", "output_schema field(s) error would clash"),
    ("output STRING", "output_schema field(s) output would clash"),
])
def test_field_names_that_clash_are_refused_before_the_job(spark, ddl, message):
    df = spark.createDataFrame([("hello",)], "prompt string")
    with pytest.raises(ConfigError, match="clash|already has") as caught:
        generate(df, prompt_col="prompt", workers=["127.0.0.1:1"], output_schema=ddl)
    assert message in str(caught.value)


def test_output_schema_and_a_constraint_of_ones_own_are_refused(spark):
    df = spark.createDataFrame([("hello",)], "prompt string")
    with pytest.raises(ConfigError, match="output_schema or a params constraint, not both"):
        generate(df, prompt_col="prompt", workers=["127.0.0.1:1"], output_schema="name STRING",
                 params={"constraint": {"regex": "[a-z]+"}})
