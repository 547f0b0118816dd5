"""output_schema → the JSON schema the worker decodes under, and answer JSON → typed values.

The DDL tests use the local SparkSession (DDL is parsed by Spark's own parser, on the driver).
"""

from __future__ import annotations

import datetime as dt
import decimal

import pytest
from pyspark.sql import types as T

from vllm_fleet.errors import ConfigError
from vllm_fleet.spark.output_schema import column_types, json_schema, parse_output_schema
from vllm_fleet.spark.rows import RowResult
from vllm_fleet.spark.typed_rows import OutputParseError, decode, typed_arrays

PERSON = T.StructType([T.StructField("name", T.StringType()), T.StructField("age", T.IntegerType())])


def test_ddl_becomes_an_object_with_every_field_required_and_nothing_else(spark):
    assert json_schema(parse_output_schema("name STRING, age INT")) == {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }


def test_every_supported_type_has_its_json_form(spark):
    struct = parse_output_schema(
        "s STRING, b BOOLEAN, t TINYINT, sm SMALLINT, i INT, l BIGINT, f FLOAT, d DOUBLE, m DECIMAL(10,2), "
        "day DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ, tags ARRAY<STRING>, scores MAP<STRING, DOUBLE>, "
        "address STRUCT<city: STRING, zip: INT>")
    properties = json_schema(struct)["properties"]
    assert [properties[n]["type"] for n in ("s", "b", "t", "sm", "i", "l", "f", "d", "m")] == [
        "string", "boolean", "integer", "integer", "integer", "integer", "number", "number", "number"]
    assert properties["day"] == {"type": "string", "format": "date"}
    assert properties["ts"] == properties["ntz"] == {"type": "string", "format": "date-time"}
    assert properties["tags"] == {"type": "array", "items": {"type": "string"}}
    assert properties["scores"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert properties["address"] == {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
                                     "required": ["city", "zip"], "additionalProperties": False}


def test_a_varchar_bounds_the_answer_and_is_a_string_column(spark):
    struct = parse_output_schema("code VARCHAR(3), tags ARRAY<CHAR(2)>")
    assert json_schema(struct)["properties"]["code"] == {"type": "string", "maxLength": 3}
    assert column_types(struct) == T.StructType([T.StructField("code", T.StringType()),
                                                 T.StructField("tags", T.ArrayType(T.StringType()))])


def test_a_struct_type_and_its_json_form_give_the_same_schema():
    assert parse_output_schema(PERSON) == parse_output_schema(PERSON.json()) == PERSON


@pytest.mark.parametrize(("spec", "message"), [
    ("id INT, keys MAP<INT, STRING>", "keys is map<int,string>: JSON object keys are strings"),
    ("blob BINARY", "blob is binary, which has no JSON form"),
    ("a STRUCT<span: INTERVAL DAY>", "a.span is interval day, which has no JSON form"),
    ("name STRNG", "is not a Spark DDL schema"),
    ("int", "is one type (int), not named fields"),
])
def test_what_has_no_json_form_is_refused_before_the_job(spark, spec, message):
    with pytest.raises(ConfigError, match="output_schema") as caught:
        parse_output_schema(spec)
    assert message in str(caught.value)


def test_typed_values_come_back_as_their_spark_types(spark):
    struct = parse_output_schema("name STRING, age INT, price DECIMAL(6,2), score DOUBLE, ok BOOLEAN, day DATE, "
                                 "at TIMESTAMP, tags ARRAY<STRING>, place STRUCT<city: STRING>, n MAP<STRING, INT>")
    text = ('{"name": "Ada", "age": 36, "price": 12.5, "score": 3, "ok": true, "day": "2026-12-01", '
            '"at": "2026-12-01T10:00:00+02:00", "tags": ["x"], "place": {"city": "Paris"}, "n": {"a": 1}}')
    values = decode(text, struct)
    assert values == {"name": "Ada", "age": 36, "price": decimal.Decimal("12.50"), "score": 3.0, "ok": True,
                      "day": dt.date(2026, 12, 1), "at": dt.datetime(2026, 12, 1, 8, tzinfo=dt.timezone.utc),
                      "tags": ["x"], "place": {"city": "Paris"}, "n": [("a", 1)]}


@pytest.mark.parametrize(("text", "message"), [
    ('{"name": "Ada", "age": 3', "not JSON"),
    ('{"name": "Ada"}', "$ has no age"),
    ('{"name": "Ada", "age": "thirty"}', '$.age is "thirty", not an integer'),
    ('{"name": "Ada", "age": 1e12}', "outside the 32-bit integer range"),
    ('{"name": null, "age": 3}', "$.name is null"),
    ('{"name": "Ada", "age": 3, "city": "Paris"}', "field(s) the schema does not: city"),
    ('["Ada", 3]', "not an object"),
])
def test_an_answer_that_does_not_read_says_where(text, message):
    with pytest.raises(OutputParseError) as caught:
        decode(text, PERSON)
    assert message in str(caught.value)


def test_rows_that_do_not_read_get_null_fields_and_an_error_others_are_left_alone():
    rows = [RowResult(output='{"name": "Ada", "age": 36}', finish_reason="stop"),
            RowResult(output='{"name": "Grace", "ag', finish_reason="length"),
            RowResult.failed("WorkerUnavailableError: no worker")]
    names, ages = typed_arrays(rows, PERSON)

    assert names.to_pylist() == ["Ada", None, None] and ages.to_pylist() == [36, None, None]
    assert str(ages.type) == "int32"
    assert rows[0].error is None
    assert rows[1].error.startswith("output is not valid JSON for the schema: not JSON")
    assert "cut off at max_tokens" in rows[1].error and rows[1].output == '{"name": "Grace", "ag'
    assert rows[2].error == "WorkerUnavailableError: no worker"
