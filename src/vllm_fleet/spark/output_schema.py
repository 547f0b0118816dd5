"""`output_schema`: the Spark type a job asks the model to answer in, and its JSON schema.

The user names the fields as Spark does (a DDL string such as "name STRING, age INT", or a
StructType); the driver parses DDL with Spark's own parser, turns the struct into the JSON
schema the worker decodes under (vLLM structured outputs), and refuses a type that has no JSON
form before any task runs. Executors get the struct as Spark's JSON (`StructType.json()`), which
they read back without a session.

Every field is required and must hold a value of its type (no JSON null): the model is asked
for each field. Integer ranges and decimal precision are not in the schema (grammar backends
differ in what bounds they support); `typed_rows.py` checks them when it reads the answer.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import types as T

from vllm_fleet.errors import ConfigError

_INTEGERS = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_NUMBERS = (T.FloatType, T.DoubleType, T.DecimalType)
# Strings with a JSON-schema format that the grammar backends (xgrammar) enforce.
_FORMATS: tuple[tuple[type, str], ...] = ((T.DateType, "date"), (T.TimestampType, "date-time"),
                                          (T.TimestampNTZType, "date-time"))


def parse_output_schema(spec: str | T.StructType) -> T.StructType:
    """The struct for a DDL string, Spark's JSON form of a struct, or a StructType.

    DDL goes through Spark's parser, so it needs an active SparkContext (the driver has one)."""
    if isinstance(spec, T.StructType):
        struct = spec
    elif not isinstance(spec, str):
        raise ConfigError(f"output_schema must be a DDL string or a StructType, not {type(spec).__name__}")
    elif spec.lstrip().startswith("{"):
        struct = T.StructType.fromJson(json.loads(spec))
    else:
        struct = _from_ddl(spec)
    if not struct.fields:
        raise ConfigError("output_schema has no fields; name them, e.g. output_schema='name STRING, age INT'")
    json_schema(struct)  # refuses what has no JSON form, now rather than on the executors
    return struct


def _from_ddl(ddl: str) -> T.StructType:
    from pyspark.errors import PySparkException

    try:
        parsed = T.DataType.fromDDL(ddl)
    except PySparkException as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"output_schema {ddl!r} is not a Spark DDL schema ({first_line}); "
                          "write e.g. 'name STRING, age INT'") from None
    if not isinstance(parsed, T.StructType):
        raise ConfigError(f"output_schema {ddl!r} is one type ({parsed.simpleString()}), not named fields; "
                          "write e.g. 'value INT'")
    return parsed


def column_types(dtype: T.DataType) -> T.DataType:
    """`dtype` as the columns hold it: CHAR(n)/VARCHAR(n) become STRING (their length bounds the
    answer through the JSON schema; Arrow and Spark's DataFrames carry them as strings)."""
    if isinstance(dtype, (T.VarcharType, T.CharType)):
        return T.StringType()
    if isinstance(dtype, T.StructType):
        return T.StructType([T.StructField(f.name, column_types(f.dataType), f.nullable, f.metadata)
                             for f in dtype.fields])
    if isinstance(dtype, T.ArrayType):
        return T.ArrayType(column_types(dtype.elementType), dtype.containsNull)
    if isinstance(dtype, T.MapType):
        return T.MapType(dtype.keyType, column_types(dtype.valueType), dtype.valueContainsNull)
    return dtype


def json_schema(struct: T.StructType) -> dict[str, Any]:
    """The JSON schema of one answer: an object with every field of `struct`, nothing else."""
    return _object(struct, "")


def _object(struct: T.StructType, path: str) -> dict[str, Any]:
    names = [f.name for f in struct.fields]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"output_schema{_where(path)} names field(s) {', '.join(duplicates)} more than once")
    return {
        "type": "object",
        "properties": {f.name: _schema(f.dataType, f"{path}.{f.name}" if path else f.name) for f in struct.fields},
        "required": names,
        "additionalProperties": False,
    }


def _schema(dtype: T.DataType, path: str) -> dict[str, Any]:
    if isinstance(dtype, T.StructType):
        return _object(dtype, path)
    if isinstance(dtype, T.ArrayType):
        return {"type": "array", "items": _schema(dtype.elementType, f"{path}[]")}
    if isinstance(dtype, T.MapType):
        if not isinstance(dtype.keyType, T.StringType):
            raise ConfigError(f"output_schema field {path} is {dtype.simpleString()}: JSON object keys are "
                              "strings, so a map needs STRING keys (map<string, ...>)")
        return {"type": "object", "additionalProperties": _schema(dtype.valueType, f"{path}{{}}")}
    if isinstance(dtype, (T.VarcharType, T.CharType)):
        return {"type": "string", "maxLength": dtype.length}
    if isinstance(dtype, T.StringType):
        return {"type": "string"}
    if isinstance(dtype, T.BooleanType):
        return {"type": "boolean"}
    if isinstance(dtype, _INTEGERS):
        return {"type": "integer"}
    if isinstance(dtype, _NUMBERS):
        return {"type": "number"}
    for kind, fmt in _FORMATS:
        if isinstance(dtype, kind):
            return {"type": "string", "format": fmt}
    raise ConfigError(f"output_schema field {path} is {dtype.simpleString()}, which has no JSON form; use STRING, "
                      "BOOLEAN, integer, FLOAT/DOUBLE/DECIMAL, DATE, TIMESTAMP, ARRAY, STRUCT or MAP<STRING, ...>")


def _where(path: str) -> str:
    return f" (in {path})" if path else ""
